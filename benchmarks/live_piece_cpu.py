"""CPU time of a partition's own work on its pieces, without RPC (issue 42, ingest):
each piece checked (``check_piece``), held, logged (its record encoded, appended; a
group of ``GROUP`` synced) and committed, the delta's thread merging its index, in one
process (``time.process_time``: every thread). Less noisy than the servers' CPU on a
loaded box, where how many requests a turn of the loop serves varies.

    python benchmarks/live_piece_cpu.py           # PIECES=300 PIECE=5000 GROUP=4
    PYTHONPATH=<a checkout of d7a089f> python benchmarks/live_piece_cpu.py   # before

Prints JSON: CPU ms per piece (and per edge, in microseconds), the runs left in the
index, with the load average.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

PIECES = int(os.environ.get("PIECES", "300"))
PIECE = int(os.environ.get("PIECE", "5000"))
GROUP = int(os.environ.get("GROUP", "4"))
N, E = 200_000, 8_000_000


def main() -> None:
    from graphrun.store.live import LiveDelta, Piece, Rows
    from graphrun.store.live_check import Schema, check_piece
    from graphrun.store.live_log import _ENCODER, PieceRecord
    from graphrun.store.wal import WriteAheadLog

    schema = Schema(part=0, num_nodes=N, num_edges=E, node_types=("_N",),
                    edge_types=(("_N", "_E", "_N"),), owned_nodes=(0, N // 2),
                    owned_edges=(0, E // 2), features={},
                    base_node_type=lambda ids: np.zeros(len(ids), np.int32))  # fmt: skip
    rng = np.random.default_rng(0)
    pieces = []
    for v in range(1, PIECES + 1):
        edges = np.vstack([rng.integers(0, N, PIECE), rng.integers(0, N // 2, PIECE),
                           E + PIECE * (v - 1) + np.arange(PIECE)])  # fmt: skip
        pieces.append((v, edges, np.zeros(PIECE, np.int32)))
    delta = LiveDelta(background=True)
    with tempfile.TemporaryDirectory(prefix="graphrun-piece-cpu-") as d:
        wal = WriteAheadLog(Path(d) / "wal")
        t0, c0 = time.perf_counter(), time.process_time()
        for v, edges, types in pieces:
            piece = Piece(version=v, new_edges=Rows.of(edges), edge_types=Rows.of(types))
            delta.hold(check_piece(piece, schema, delta), 0.0)
            wal.append(v, _ENCODER.encode(PieceRecord(piece)))
            if v % GROUP == 0:
                wal.sync()
                for u in range(v - GROUP + 1, v + 1):
                    delta.commit(u)
        runs = -1
        while runs != len(delta.runs):  # the thread's merges done
            runs = len(delta.runs)
            time.sleep(0.5)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        wal.close()
    delta.close()
    print(json.dumps({"pieces": PIECES, "piece": PIECE, "group": GROUP,
                      "cpu_ms_per_piece": round(1000 * cpu / PIECES, 3),
                      "cpu_us_per_edge": round(1e6 * cpu / PIECES / PIECE, 3), "runs": runs,
                      "wall_s": round(wall, 3), "load_avg": os.getloadavg()}))  # fmt: skip


if __name__ == "__main__":
    main()
