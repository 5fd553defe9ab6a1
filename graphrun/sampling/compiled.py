"""The sampler's hot loops compiled with numba: uniform picks with their gathers, relabelling.

Used with ``GRAPHRUN_COMPILED=1`` (:data:`graphrun.store.routing.COMPILED_ENV`), else the
numpy kernels run: numba's import and its first kernels cost a process 0.5-0.6 CPU-s
and about 135 MiB, so this module is imported on the first sample that asks for it.
The machine code is cached on disk where numba can write
(:func:`graphrun.store.compiled.jit`), else compiled at each start.

* :func:`plan` and :func:`pick` are the uniform without-replacement kernel of
  :mod:`~graphrun.sampling.kernels` row by row: a row with more edges than its fanout
  runs Floyd's algorithm on uniforms drawn beforehand round-major (round ``i``'s uniform
  of drawn row ``d`` is the ``i * ndraw + d``-th draw, as the vectorised kernel used the
  generator, so the same seed gives the same edges; :func:`pick` reads them transposed,
  a row's together: strided, they cost it 2.5x); a row with no more edges than its
  fanout takes them all, in order. :func:`gather` then reads the picked edges' sources
  and ids in one pass. Gathering inside :func:`pick` was 2.5x slower than the two
  passes (likely its mispredicted branches cut the loads' overlap).
* :func:`find`, :func:`scan` and :func:`enter` map global ids to local ids through the
  :class:`~graphrun.sampling.mfg.Relabeler`'s scratch map: one pass looks every id up
  and collects the unseen ones, their new local ids follow in increasing global id (a
  scan of the mark array when they are dense in the id space, else numpy's sort, which
  is 3-4x faster than numba's), and a last pass reads every local id.
"""

from __future__ import annotations

import numpy as np

from graphrun.store.compiled import jit as _jit


@_jit
def plan(indptr: np.ndarray, rows: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, int, int]:
    """``(first, ndraw, kdraw)``: each row's first output slot (``first[-1]`` = all picks),
    the rows that draw (more edges than their fanout) and the most picks one of them wants."""
    n = len(rows)
    first = np.empty(n + 1, dtype=np.int64)
    first[0] = 0
    ndraw = 0
    kdraw = 0
    for i in range(n):
        r = rows[i]
        deg = indptr[r + 1] - indptr[r]
        ki = k[i]
        if deg > ki:
            ndraw += 1
            kdraw = max(kdraw, ki)
            first[i + 1] = first[i] + max(ki, 0)
        else:
            first[i + 1] = first[i] + deg
    return first, ndraw, kdraw


@_jit
def pick(
    indptr: np.ndarray,
    rows: np.ndarray,
    k: np.ndarray,
    first: np.ndarray,
    u: np.ndarray,
    kdraw: int,
    which: np.ndarray,
    pos: np.ndarray,
) -> None:
    """Fill ``which``/``pos`` (``first[-1]`` each) for ``rows``; ``u[d, i]``: round ``i``'s
    uniform of the ``d``-th drawing row (``[ndraw, kdraw]``, one row's draws contiguous)."""
    d = 0
    chosen = np.empty(kdraw, dtype=np.int64)
    for i in range(len(rows)):
        r = rows[i]
        start = indptr[r]
        deg = indptr[r + 1] - start
        o = first[i]
        ki = k[i]
        if deg <= ki:
            for j in range(deg):
                which[o + j] = i
                pos[o + j] = start + j
            continue
        for t in range(ki):  # Floyd: pick v from range(top + 1)
            top = deg - ki + t
            v = np.int64(u[d, t] * np.float64(top + 1))
            for s in range(t):
                if chosen[s] == v:
                    v = top
                    break
            chosen[t] = v
            which[o + t] = i
            pos[o + t] = start + v
        d += 1


@_jit
def gather(pos: np.ndarray, indices: np.ndarray, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(indices[pos], eids[pos])`` in one pass."""
    src = np.empty(len(pos), dtype=np.int64)
    eid = np.empty(len(pos), dtype=np.int64)
    for i in range(len(pos)):
        p = pos[i]
        src[i] = indices[p]
        eid[i] = eids[p]
    return src, eid


@_jit
def find(ids: np.ndarray, table: np.ndarray, mark: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(local, cand)``: ``table[ids]`` (-1 = unseen) and the distinct unseen ids, in order
    of first sight, each marked in ``mark`` (all 0 on entry). Branch-free: a branch on
    whether an id is new mispredicts often enough to cost 2.4x."""
    m = len(ids)
    local = np.empty(m, dtype=np.int64)
    cand = np.empty(m + 1, dtype=np.int64)
    nc = 0
    for e in range(m):
        g = ids[e]
        v = table[g]
        local[e] = v
        fresh = (v < 0) & (mark[g] == 0)
        mark[g] |= v < 0
        cand[nc] = g  # kept only when fresh: the count moves past it
        nc += fresh
    return local, cand[:nc]


@_jit
def scan(mark: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` marked ids, in increasing order."""
    new = np.empty(count, dtype=np.int64)
    j = 0
    for g in range(len(mark)):
        if j == count:
            break
        new[j] = g
        j += mark[g]
    return new


@_jit
def enter(
    ids: np.ndarray,
    local: np.ndarray,
    table: np.ndarray,
    mark: np.ndarray,
    new: np.ndarray,
    count: int,
) -> None:
    """Number ``new`` from ``count`` in ``table``, clear their marks and fill ``local``."""
    for j in range(len(new)):
        table[new[j]] = count + j
        mark[new[j]] = 0
    for e in range(len(ids)):
        local[e] = table[ids[e]]
