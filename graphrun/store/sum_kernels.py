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
def move_rows(
    sums: np.ndarray, logits: np.ndarray, pred: np.ndarray, rows: np.ndarray,
    fresh: np.ndarray, version: float, old: np.ndarray, change: np.ndarray,
    ch_at: np.ndarray, ch_src: np.ndarray, sign: np.ndarray, out_at: np.ndarray,
    out_src: np.ndarray, own_at: np.ndarray, own: np.ndarray, lastown: np.ndarray,
    proj: np.ndarray, own_src: np.ndarray,
) -> int:  # fmt: skip
    """``move_sums`` (:mod:`graphrun.store.sum_moves`, which checks every index first) on
    ``lastsum`` rows ``[T, d, stamp]``, a row at a time: row ``rows[i]`` (zeros where
    ``fresh``), unless stamped ``version``, gets its changed edges' ``sign * old[src]``
    (and ``sign`` to ``d``), its leaving edges' ``change[src]``, each in the order they
    came, and for a node of ``A_{L-1}`` ``max(d, 1) * own_new - max(d_before, 1) *
    own_old``; then it is written whole with its stamp, its logits ``float32(T /
    max(d, 1))`` and its first largest column; a node of ``A_{L-1}`` (stamped or not)
    gets its ``lastown`` row ``[proj after, own after, proj before, own before,
    version]`` (``proj``: the sources' ``W_l · h`` before and after, its own at
    ``own_src``). How many rows moved."""
    m, c = len(rows), logits.shape[1]
    ch, out = _by_row(ch_at, m), _by_row(out_at, m)
    mine = np.full(m, -1, np.int64)
    for j in range(len(own_at)):
        mine[own_at[j]] = j
    new = np.zeros(m, np.bool_)
    for i in range(len(fresh)):
        new[fresh[i]] = True
    buf = np.empty(c + 2)
    moved = 0
    for i in range(m):
        r = rows[i]
        for q in range(c + 2):
            buf[q] = 0.0 if new[i] else sums[r, q]
        if buf[c + 1] != version:
            moved += 1
            was = max(buf[c], 1.0)
            for t in range(ch[0][i], ch[0][i + 1]):  # indices, not slices: no allocation
                s, k = ch_src[ch[1][t]], sign[ch[1][t]]
                for q in range(c):
                    buf[q] += k * old[s, q]
                buf[c] += k
            for t in range(out[0][i], out[0][i + 1]):
                s = out_src[out[1][t]]
                for q in range(c):
                    buf[q] += change[s, q]
            j = mine[i]
            if j >= 0:
                now = max(buf[c], 1.0)
                for q in range(c):
                    buf[q] += now * own[j, c + q] - was * own[j, q]
            buf[c + 1] = version
        deg, best, top = max(buf[c], 1.0), 0, np.float32(0.0)
        for q in range(c + 2):
            sums[r, q] = buf[q]
        for q in range(c):
            y = np.float32(buf[q] / deg)
            logits[r, q] = y
            if q == 0 or y > top:
                best, top = q, y
        pred[r] = best
        j = mine[i]
        if j >= 0:
            s = own_src[j]
            for q in range(c):
                lastown[r, q], lastown[r, c + q] = proj[s, c + q], own[j, c + q]
                lastown[r, 2 * c + q], lastown[r, 3 * c + q] = proj[s, q], own[j, q]
            lastown[r, 4 * c] = version
    return moved


@jit
def _by_row(at: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """``(start, order)``: the edges of row ``i`` are ``order[start[i] : start[i + 1]]``,
    in the order they came (a counting sort)."""
    start = np.zeros(m + 1, np.int64)
    for e in range(len(at)):
        start[at[e] + 1] += 1
    for i in range(m):
        start[i + 1] += start[i]
    fill, order = start[:-1].copy(), np.empty(len(at), np.int64)
    for e in range(len(at)):
        order[fill[at[e]]] = e
        fill[at[e]] += 1
    return start, order


def warm_up() -> None:
    """Each kernel loaded (from numba's cache, or compiled: seconds) and run once, as a
    refresher that stays up does before its first refresh."""
    sums, one = np.zeros((1, 3)), np.zeros(1, np.int64)
    add_rows(sums, one, np.zeros((1, 1)), one, np.ones(1), True, np.ones(1, np.bool_))
