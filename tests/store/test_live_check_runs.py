"""A checked piece's id runs (store/live_check.py ``_runs``: one run taken from the ends
of increasing ids) are :func:`~graphrun.store.live_index.id_runs`' for every id list
the checks let through: none, one run, runs with gaps, ids out of order."""

from __future__ import annotations

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.store.live_check import _new_ids, _runs
from graphrun.store.live_index import id_runs


def test_the_runs_of_checked_ids_are_id_runs():
    rng = np.random.default_rng(0)
    cases = [np.arange(0), np.arange(5, 6), np.arange(5, 12), np.asarray([3, 4, 6, 7]),
             np.asarray([9, 2, 3]), np.asarray([4, 6])]  # fmt: skip
    cases += [np.sort(rng.choice(30, rng.integers(0, 9), replace=False)) for _ in range(300)]
    cases += [rng.permutation(rng.choice(30, rng.integers(0, 9), replace=False)) for _ in cases]
    for ids in (np.asarray(c, np.int64) for c in cases):
        try:
            increasing = _new_ids(ids, 0, 100, "ids")
        except ArgumentError:
            continue
        got, want = _runs(ids, increasing), id_runs(ids)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), ids
