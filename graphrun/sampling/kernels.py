"""Local neighbour-sampling kernels over a compressed adjacency (numpy only).

Every kernel works on *segments*: row ``r`` of a compressed adjacency owns the
edge positions ``indptr[r] .. indptr[r+1]-1``. Given a batch of rows and a fanout
per row, a kernel picks edge positions and returns them as :class:`Picks`
(``which[i]`` = index into the batch of the row that sample ``i`` belongs to,
``pos[i]`` = the picked edge position). Picks are grouped by row, rows in batch
order, so the output is a pure function of the inputs and the generator.

Strategies (chosen by benchmark, see ``benchmarks/README.md``):

* uniform without replacement: Robert Floyd's algorithm (``fanout`` rounds, each one
  comparison against the picks so far) on the rows with more edges than the fanout; a
  row with ``degree <= fanout`` gets all its edges in order, with no draw. Exact: every
  ``fanout``-subset is equally likely. Cost is independent of the degree, which matters
  on power-law graphs where sampled frontiers are full of hubs, and a full neighbourhood
  (``fanout`` >= every degree, layer-wise inference) costs one pass over its edges.
  Vectorised over rows in numpy; with ``GRAPHRUN_COMPILED=1`` compiled with numba
  (:func:`uniform_picks`, :mod:`graphrun.sampling.compiled`), row by row, on the same
  uniforms (round ``i``: one per drawing row): the same edges for the same seed.
* uniform with replacement: ``floor(u * degree)`` per sample.
* weighted without replacement: Efraimidis–Spirakis keys ``log(u) / w`` over the
  row's edges, the ``fanout`` largest kept (edges of weight 0 are never picked).
* weighted with replacement: inverse CDF over the row's cumulative weights.

The kernels use numpy (and numba when asked) and nothing else: a store server samples
with them without importing torch (a second of CPU at every server's start), and a
trainer samples its
co-located partitions with the same code and the same seed, so both give the same
edges. Randomness comes only from the ``numpy.random.Generator`` passed in
(:func:`make_rng`: PCG64 from an int seed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphrun.store.routing import compiled_kernels

Rng = np.random.Generator


def make_rng(seed: int) -> Rng:
    """The kernels' generator for an int seed (the same stream on every machine)."""
    return np.random.default_rng(int(seed))


@dataclass(frozen=True)
class Picks:
    """Sampled edge positions: ``which[i]`` indexes the batch of rows, ``pos[i]`` the edge."""

    which: np.ndarray
    pos: np.ndarray

    def __len__(self) -> int:
        return len(self.pos)

    @staticmethod
    def empty() -> Picks:
        e = np.empty(0, dtype=np.int64)
        return Picks(e, e)


def _expand(start: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(which, pos)`` listing every position of each segment, in order."""
    total = int(count.sum())
    which = np.repeat(np.arange(len(count)), count)
    first = np.cumsum(count) - count
    pos = np.arange(total, dtype=np.int64) + np.repeat(start - first, count)
    return which, pos


def sample_segments(
    indptr: np.ndarray,
    rows: np.ndarray,
    fanout: int | np.ndarray,
    *,
    replace: bool = False,
    weights: np.ndarray | None = None,
    rng: Rng,
) -> Picks:
    """Pick up to ``fanout`` edge positions of every row in ``rows``.

    ``fanout`` is one int for all rows or an int64 array with one entry per row
    (per-edge-type fanouts use that). ``weights`` (float, one per edge position)
    switches to weighted sampling. Inputs are trusted: the public samplers check them.
    """
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) == 0:
        return Picks.empty()
    k = fanouts(fanout, len(rows))
    if weights is None and not replace and compiled_kernels():
        which, pos, _ = uniform_picks(indptr, rows, k, rng)
        return Picks(which, pos)
    start = indptr[rows].astype(np.int64, copy=False)
    deg = indptr[rows + 1] - start
    if weights is not None:
        if replace:
            return _weighted_replace(start, deg, k, weights, rng)
        return _weighted_no_replace(start, deg, k, weights, rng)
    if replace:
        return _uniform_replace(start, deg, k, rng)
    return _uniform_no_replace(start, deg, k, rng)


def fanouts(fanout: int | np.ndarray, n: int) -> np.ndarray:
    """One int64 fanout per row from one for all or an array."""
    if isinstance(fanout, np.ndarray):
        return fanout.astype(np.int64, copy=False)
    return np.full(n, int(fanout), dtype=np.int64)


def _uniform_replace(start: np.ndarray, deg: np.ndarray, k: np.ndarray, rng: Rng) -> Picks:
    count = np.where(deg > 0, k, 0)
    which = np.repeat(np.arange(len(count)), count)
    u = rng.random(len(which))
    pos = start[which] + (u * deg[which]).astype(np.int64)
    return Picks(which, pos)


def uniform_picks(
    indptr: np.ndarray,
    rows: np.ndarray,
    k: np.ndarray,
    rng: Rng,
    gather: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Uniform picks without replacement of ``rows`` (int64), ``k[i]`` for row ``i``:
    ``(which, pos, empty)``, or with ``gather = (indices, eids)`` (int64) the picked
    edges' ``(which, indices[pos], eids[pos])``.

    Compiled (:mod:`graphrun.sampling.compiled`): Floyd's algorithm row by row on the
    generator's uniforms drawn round-major, the vectorised kernel's sequence (tested
    against a row-by-row reference).
    """
    from graphrun.sampling import compiled  # numba: imported when first asked for

    indptr = indptr.astype(np.int64, copy=False)
    first, ndraw, kdraw = compiled.plan(indptr, rows, k)
    u = rng.random(ndraw * kdraw).reshape(kdraw, ndraw).T.copy()  # a row's draws together
    total = int(first[-1])
    which = np.empty(total, dtype=np.int64)
    pos = np.empty(total, dtype=np.int64)
    compiled.pick(indptr, rows, k, first, u, kdraw, which, pos)
    if gather is None:
        return which, pos, pos[:0]
    src, eid = compiled.gather(pos, *gather)
    return which, src, eid


def _uniform_no_replace(start: np.ndarray, deg: np.ndarray, k: np.ndarray, rng: Rng) -> Picks:
    kk = np.minimum(deg, k)
    if len(kk) == 0 or int(kk.max()) == 0:
        return Picks.empty()
    draw = np.flatnonzero(deg > k)  # rows that keep only some of their edges
    chosen = _floyd(deg[draw], kk[draw], rng) if len(draw) else None
    width = 0 if chosen is None else chosen.shape[1]
    if width < int(kk.max()):  # rows taking all their edges have more: list them in order
        which, pos = _expand(start, kk)
        if chosen is not None:
            used = chosen >= 0
            first = (np.cumsum(kk) - kk)[draw]
            slots = first[:, None] + np.arange(width)
            pos[slots[used]] = (start[draw][:, None] + chosen)[used]
        return Picks(which, pos)
    # a sampling fanout: one [rows, width] table of positions, the drawn rows' from Floyd
    assert chosen is not None  # width == max(kk) > 0
    ar = np.arange(width)
    picked = start[draw][:, None] + chosen
    whole = np.flatnonzero(deg <= k)  # rows taking all their edges: them in order
    if len(whole):  # else every row drew: the drawn rows' table is the table
        drawn, picked = picked, np.empty((len(deg), width), dtype=np.int64)
        picked[draw] = drawn
        picked[whole] = start[whole][:, None] + ar
    which = np.repeat(np.arange(len(deg)), kk)
    if len(which) == picked.size:  # every row has `width` picks: no mask needed
        return Picks(which, picked.reshape(-1))
    short = np.flatnonzero(kk < width)  # few on a sampled frontier: mask only theirs
    keep = np.ones((len(deg), width), dtype=bool)
    keep[short] = ar < kk[short, None]
    return Picks(which, picked[keep])


def _floyd(n: np.ndarray, k: np.ndarray, rng: Rng) -> np.ndarray:
    """Floyd's algorithm on every row at once: ``k[r]`` distinct values of ``range(n[r])``.

    Requires ``k <= n``. Returns ``[rows, max(k)]``; entries past ``k[r]`` are -1.
    With ``k == n`` it returns every value (in random order), so one code path
    serves rows with fewer neighbours than the fanout too.

    Round ``i`` draws one uniform per row (``rng.random`` into one reused buffer) and
    compares it with the row's picks so far; the picks are int32 when every ``n`` fits
    (half the bytes compared), and a batch whose rows all want ``k`` picks skips the
    mask of finished rows. A round works in place (its picks written into their row of
    the output, the few repeats fixed by index): a sixth less time than with each
    round's temporaries. The values, and the generator's stream, are the same as with
    int64 and a mask (tested).
    """
    kmax = int(k.max())
    dtype = np.int32 if int(n.max()) < 2**31 else np.int64
    out = np.full((kmax, len(n)), -1, dtype=dtype)  # pick-major: rows contiguous
    top = (n - k).astype(dtype)  # round i picks from range(top + 1), top = n - k + i
    span = (n - k + 1).astype(np.float64)  # top + 1
    u = np.empty(len(n))
    seen = np.empty((kmax, len(n)), dtype=bool)
    ragged = int(k.min()) < kmax
    for i in range(kmax):
        t = out[i]  # the round's picks, written in place
        rng.random(out=u)
        np.copyto(t, np.multiply(u, span, out=u), casting="unsafe")  # truncated, as astype
        if i:
            hit = np.flatnonzero(np.equal(out[:i], t, out=seen[:i]).any(0))  # few
            t[hit] = top[hit]
        if ragged:
            t[k <= i] = -1
        top += 1
        span += 1
    return out.T


def _weighted_no_replace(
    start: np.ndarray, deg: np.ndarray, k: np.ndarray, weights: np.ndarray, rng: Rng
) -> Picks:
    which, pos = _expand(start, deg)
    w = weights[pos].astype(np.float64, copy=False)
    u = np.maximum(rng.random(len(pos)), 1e-300)
    with np.errstate(divide="ignore"):
        key = np.where(w > 0, np.log(u) / np.where(w > 0, w, 1.0), -np.inf)
    order = np.argsort(-key, kind="stable")  # largest key first, ties in edge order
    order = order[np.argsort(which[order], kind="stable")]
    seg_first = np.cumsum(deg) - deg
    rank = np.arange(len(order)) - seg_first[which[order]]
    keep = (rank < k[which[order]]) & (key[order] > -np.inf)
    sel = order[keep]
    return Picks(which[sel], pos[sel])


def _weighted_replace(
    start: np.ndarray, deg: np.ndarray, k: np.ndarray, weights: np.ndarray, rng: Rng
) -> Picks:
    _, pos = _expand(start, deg)
    if len(pos) == 0:  # no row has an edge
        return Picks.empty()
    w = np.maximum(weights[pos].astype(np.float64, copy=False), 0)
    cw = np.cumsum(w)
    seg_end = np.cumsum(deg)
    seg_first = seg_end - deg
    before = np.where(seg_first > 0, cw[np.maximum(seg_first - 1, 0)], 0.0)
    last = np.maximum(seg_end - 1, 0)
    total = np.where(deg > 0, cw[last] - before, 0.0)
    count = np.where(total > 0, k, 0)
    swhich = np.repeat(np.arange(len(count)), count)
    u = rng.random(len(swhich))
    target = before[swhich] + u * total[swhich]
    idx = np.searchsorted(cw, target, side="right")
    idx = np.minimum(idx, last[swhich])
    return Picks(swhich, pos[idx])
