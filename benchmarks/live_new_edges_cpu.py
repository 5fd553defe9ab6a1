"""CPU time of ``graph_new_edges`` on a live partition (issue 42, a link loader's new
positives at an epoch's start): the ids of the new edges of one type added since a
version, one thread, in-process.

    python benchmarks/live_new_edges_cpu.py      # EDGES=1000000 (3 edge types)

``EDGES`` new edges between random nodes of a 200k-node id space, committed in pieces
of 5,000 (a 10k-edge batch's half on one of two partitions) to a
:class:`~graphrun.store.live.LiveDelta`, each edge of a random one of 3 types; then
:func:`graphrun.sampling.changes.new_edges` of type 1, 10 times each: every one (a
loader's first ask, ``since=-1``) and those of the last 20 pieces (an epoch's worth
at 100k edges/s over a 1 s epoch). Prints JSON: CPU ms per call (``time.thread_time``)
and the ids answered.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

NODES = 200_000
EDGES = int(os.environ.get("EDGES", "1000000"))
PIECE = 5000
REPEAT = 10


def main() -> None:
    from graphrun.sampling.changes import new_edges
    from graphrun.store.live import LiveDelta
    from graphrun.store.live_index import Batch

    rng = np.random.default_rng(0)
    delta = LiveDelta()
    e0, empty = 8_000_000, np.empty(0, np.int64)
    for v, lo in enumerate(range(0, EDGES, PIECE), start=1):
        m = min(PIECE, EDGES - lo)
        edges = np.vstack([rng.integers(0, NODES, m), rng.integers(0, NODES, m),
                           e0 + lo + np.arange(m)])  # fmt: skip
        types = rng.integers(0, 3, m).astype(np.int32)
        delta.hold(Batch(v, empty, np.empty(0, np.int32), empty, edges, types, empty, {}, {}),
                   0.0)  # fmt: skip
        delta.commit(v)
    head = v
    _ = delta.runs
    out: dict[str, object] = {"delta_edges": EDGES, "runs": len(delta.runs)}
    for name, since in (("every", -1), ("last_20_pieces", head - 20)):
        t = time.thread_time()
        for _ in range(REPEAT):
            got = new_edges(delta, since, head, 1)
        out[f"{name}_ms"] = round(1000 * (time.thread_time() - t) / REPEAT, 2)
        out[f"{name}_ids"] = len(got)
    out["load_avg"] = os.getloadavg()
    print(json.dumps(out))
    delta.close()


if __name__ == "__main__":
    main()
