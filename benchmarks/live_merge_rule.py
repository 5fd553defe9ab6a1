"""The merging thread's rule, simulated (issue 42, ingest rate): CPU per piece of
merging a growing delta's edge runs (5 int64 rows, sorted by destination, as
``graphrun.store.live_index``'s edges) under the binary rule the thread uses (two runs
merge once the older is no larger) against a k-way rule (the last k runs merge once
they are of one size class), and the most runs a read would look at.

    python benchmarks/live_merge_rule.py            # PIECES=300 PIECE=5000 K=4

A merge is ``live_index._merge``'s: a stable argsort of the runs' keys, then a gather.
Not the store's code: what a k-way rule would save, before writing it.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

PIECES = int(os.environ.get("PIECES", "300"))
PIECE = int(os.environ.get("PIECE", "5000"))
K = int(os.environ.get("K", "4"))


def merge(runs: list[np.ndarray]) -> np.ndarray:
    order = np.argsort(np.concatenate([r[1] for r in runs]), kind="stable")
    return np.concatenate(runs, axis=1).take(order, axis=1)


def due(sizes: list[int], k: int) -> bool:
    """The last ``k`` runs merge: binary (k 2) once the older is no larger; k-way once
    none of the last k is larger than the first of them, nor it k times the last."""
    if len(sizes) < k:
        return False
    first = sizes[-k]
    if k == 2:
        return first <= sizes[-1]
    return all(s <= first for s in sizes[-k + 1 :]) and first <= k * sizes[-1]


def simulate(pieces: list[np.ndarray], k: int) -> dict[str, float]:
    runs: list[np.ndarray] = []
    most = 0
    t = time.process_time()
    for p in pieces:
        runs.append(p)
        while due([r.shape[1] for r in runs], k):
            runs[-k:] = [merge(runs[-k:])]
        most = max(most, len(runs))
    ms = 1000 * (time.process_time() - t) / len(pieces)
    return {"k": k, "cpu_ms_per_piece": round(ms, 3), "most_runs": most, "runs_at_end": len(runs)}


def main() -> None:
    rng = np.random.default_rng(0)
    pieces = []
    for i in range(PIECES):
        a = rng.integers(0, 10**6, (5, PIECE))
        a[4] = i  # the version row
        pieces.append(a[:, np.argsort(a[1], kind="stable")])
    simulate(pieces, K)  # warm-up: the heap's first touch
    for k in (2, K, 2, K):  # in turns
        print(json.dumps(simulate(pieces, k)))


if __name__ == "__main__":
    main()
