"""The running sums' loops over ``A_L`` (:mod:`graphrun.serving.sums`), compiled with
numba, cached on disk as :func:`graphrun.store.compiled.jit` says; :func:`warm_up` loads
them. The store server runs them for ``move_sums`` (:mod:`graphrun.store.sum_moves`,
which imports this module on its first request: a server that moves no sums never
imports numba), the refresher for the first layer's sums.

After 1,000 new edges on a power-law graph a refresh moves the sums of some 27k nodes by
some 45k edges of ``C`` columns each. torch would gather each edge's source row into a
temporary (17 MB), then scatter-add it; the outputs would take four passes over the rows
(divide, round to float32, argmax). Here each is one pass: 1.6 ms against 11 ms and
2.2 ms against 6.5 ms on the loaded 2-core box (benchmarks/README.md, issue 43).
"""

from __future__ import annotations

import numpy as np

from graphrun.store.compiled import jit


@jit
def add_rows(
    sums: np.ndarray, at: np.ndarray, rows: np.ndarray, src: np.ndarray, sign: np.ndarray,
    degree: bool, todo: np.ndarray,
) -> None:  # fmt: skip
    """``sums[at[i], :w] += sign[i] * rows[src[i]]`` (``w`` the rows' width) and, with
    ``degree``, ``sums[at[i], w] += sign[i]``, for each ``i`` whose row ``todo``."""
    width = rows.shape[1]
    for i in range(len(at)):
        d = at[i]
        if todo[d]:
            s, k = src[i], sign[i]
            for j in range(width):
                sums[d, j] += k * rows[s, j]
            if degree:
                sums[d, width] += k


@jit
def outputs(sums: np.ndarray, logits: np.ndarray, pred: np.ndarray) -> None:
    """The last layer from ``lastsum`` rows ``[T, d, stamp]``: ``logits =
    float32(T / max(d, 1))`` and each row's first largest column in ``pred``."""
    width = logits.shape[1]
    for i in range(sums.shape[0]):
        deg, row, out = max(sums[i, width], 1.0), sums[i], logits[i]
        for j in range(width):  # apart from the argmax: vectorised
            out[j] = row[j] / deg
        best = 0
        for j in range(1, width):
            if out[j] > out[best]:
                best = j
        pred[i] = best


def warm_up() -> None:
    """Each kernel loaded (from numba's cache, or compiled: seconds) and run once, as a
    refresher that stays up does before its first refresh."""
    sums, one = np.zeros((1, 3)), np.zeros(1, np.int64)
    add_rows(sums, one, np.zeros((1, 1)), one, np.ones(1), True, np.ones(1, np.bool_))
    outputs(sums, np.zeros((1, 1), np.float32), one)
