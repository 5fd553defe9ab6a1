"""CPU time of a partition's own work on its pieces, without RPC (issue 42, ingest):
each piece checked (``check_piece``), held, logged (its record encoded, appended; a
group of ``GROUP`` synced) and committed, the delta's thread merging its index, in one
process (``time.process_time``: every thread). Less noisy than the servers' CPU on a
loaded box, where how many requests a turn of the loop serves varies.

    python benchmarks/live_piece_cpu.py           # PIECES=300 PIECE=5000 GROUP=4
    PYTHONPATH=<a checkout of d7a089f> python benchmarks/live_piece_cpu.py   # before
    THREAD=0 GROUP=1 python benchmarks/live_piece_cpu.py   # merged inline, a read a group
    RATE=150 ...                                  # paced: 150 pieces a second (a server's
                                                  # share of ~750k edges/s), not full speed
    TUNE=0 ...                                    # without keep_large_allocations
    MIXED=1 ...                                   # pieces of 1 to 2 * PIECE - 1 edges
                                                  # (uniform: the same mean), not PIECE

Prints JSON: CPU ms per piece (and per edge, in microseconds), the loop's and the
merging thread's user/system CPU ms per piece (``/proc/self/task``), index entries
written per new edge (``LiveDelta.work``: the fresh run and every merge), the runs left
in the index and the most the index held after a group's commits (``most_runs``, read
without indexing), with the load average. ``THREAD=0``: no merging thread, each group's
commits followed by a read (which indexes and merges them as the rule asks): the same
merges each run, so the least noisy measure of the rule.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

PIECES = int(os.environ.get("PIECES", "300"))
PIECE = int(os.environ.get("PIECE", "5000"))
GROUP = int(os.environ.get("GROUP", "4"))
THREAD = os.environ.get("THREAD", "1") == "1"
RATE = float(os.environ.get("RATE", "0"))  # pieces a second (0: full speed)
MIXED = os.environ.get("MIXED", "0") == "1"
N, E = 200_000, 8_000_000


def threads_cpu() -> dict[int, tuple[float, float]]:
    """Per thread id: (user s, system s)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path("/proc/self/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        out[int(task.name)] = (int(fields[11]) / tick, int(fields[12]) / tick)
    return out


def main() -> None:
    from graphrun.rpc.tuning import keep_large_allocations

    if os.environ.get("TUNE", "1") == "1":
        keep_large_allocations()  # as graphrun serve does (TUNE=0: without)
    from graphrun.store.live import LiveDelta, Piece, Rows
    from graphrun.store.live_check import Schema, check_piece
    from graphrun.store.live_log import _ENCODER, PieceRecord
    from graphrun.store.wal import WriteAheadLog

    schema = Schema(part=0, num_nodes=N, num_edges=E, node_types=("_N",),
                    edge_types=(("_N", "_E", "_N"),), owned_nodes=(0, N // 2),
                    owned_edges=(0, E // 2), features={},
                    base_node_type=lambda ids: np.zeros(len(ids), np.int32))  # fmt: skip
    rng = np.random.default_rng(0)
    pieces, eid = [], E
    for v in range(1, PIECES + 1):
        m = int(rng.integers(1, 2 * PIECE)) if MIXED else PIECE
        edges = np.vstack([rng.integers(0, N, m), rng.integers(0, N // 2, m),
                           eid + np.arange(m)])  # fmt: skip
        pieces.append((v, edges, np.zeros(m, np.int32)))
        eid += m
    total = eid - E
    delta = LiveDelta(background=THREAD)
    delta.warm(wait=True)  # the compiled merge loaded first, as a server does before it serves
    tids = [threading.get_native_id()]
    tids += [delta._merger.native_id or 0] if delta._merger is not None else []
    with tempfile.TemporaryDirectory(prefix="graphrun-piece-cpu-") as d:
        wal = WriteAheadLog(Path(d) / "wal")
        t0, c0, th0 = time.perf_counter(), time.process_time(), threads_cpu()
        most = 0
        for v, edges, types in pieces:
            if RATE:  # paced by sleeping, as a server's pieces come
                time.sleep(max(0.0, t0 + v / RATE - time.perf_counter()))
            piece = Piece(version=v, new_edges=Rows.of(edges), edge_types=Rows.of(types))
            delta.hold(check_piece(piece, schema, delta), 0.0)
            wal.append(v, _ENCODER.encode(PieceRecord(piece)))
            if v % GROUP == 0:
                wal.sync()
                for u in range(v - GROUP + 1, v + 1):
                    delta.commit(u)
                if not THREAD:
                    _ = delta.runs  # a read: indexed and merged here
                most = max(most, len(delta._runs))
        runs = -1
        while runs != len(delta.runs):  # the thread's merges done
            runs = len(delta.runs)
            time.sleep(0.5)
        cpu, wall, th1 = time.process_time() - c0, time.perf_counter() - t0, threads_cpu()
        wal.close()
    delta.close()
    ms = [[round(1000 * (th1[t][i] - th0[t][i]) / PIECES, 3) for i in (0, 1)] for t in tids]
    print(json.dumps({"pieces": PIECES, "piece": PIECE, "group": GROUP, "thread": THREAD,
                      "cpu_ms_per_piece": round(1000 * cpu / PIECES, 3),
                      "mixed": MIXED, "cpu_us_per_edge": round(1e6 * cpu / total, 3),
                      "loop_ms_user_sys": ms[0], "merging_ms_user_sys": ms[1:],
                      "written_per_edge": round(delta.work / total, 2), "runs": runs,
                      "most_runs": most,
                      "wall_s": round(wall, 3), "load_avg": os.getloadavg()}))  # fmt: skip


if __name__ == "__main__":
    main()
