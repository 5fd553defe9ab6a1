"""Local neighbour-sampling kernels over a compressed adjacency.

Every kernel works on *segments*: row ``r`` of a compressed adjacency owns the
edge positions ``indptr[r] .. indptr[r+1]-1``. Given a batch of rows and a fanout
per row, a kernel picks edge positions and returns them as :class:`Picks`
(``which[i]`` = index into the batch of the row that sample ``i`` belongs to,
``pos[i]`` = the picked edge position). Picks are grouped by row, rows in batch
order, so the output is a pure function of the inputs and the generator.

Strategies (chosen by benchmark, see ``benchmarks/README.md``):

* uniform without replacement: Robert Floyd's algorithm, vectorised over rows
  (``fanout`` rounds, each one comparison against the picks so far) on the rows with
  more edges than the fanout; a row with ``degree <= fanout`` gets all its edges in
  order, with no draw. Exact: every ``fanout``-subset is equally likely. Cost is
  independent of the degree, which matters on power-law graphs where sampled
  frontiers are full of hubs, and a full neighbourhood (``fanout`` >= every degree,
  layer-wise inference) costs one pass over its edges.
* uniform with replacement: ``floor(u * degree)`` per sample.
* weighted without replacement: Efraimidis–Spirakis keys ``log(u) / w`` over the
  row's edges, the ``fanout`` largest kept (edges of weight 0 are never picked).
* weighted with replacement: inverse CDF over the row's cumulative weights.

No kernel touches a global RNG: randomness comes from the ``torch.Generator``
passed in (see :func:`make_generator`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError

Seed = int | torch.Generator | np.random.Generator | None


def make_generator(seed: Seed = None) -> torch.Generator:
    """A ``torch.Generator`` from an int, a numpy ``Generator``, a torch generator or None.

    ``None`` gives a generator seeded from the operating system (non-deterministic);
    a numpy generator is consumed once to seed a fresh torch generator.
    """
    if isinstance(seed, torch.Generator):
        return seed
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    elif isinstance(seed, np.random.Generator):
        gen.manual_seed(int(seed.integers(0, 2**62)))
    elif isinstance(seed, int | np.integer) and not isinstance(seed, bool):
        gen.manual_seed(int(seed))
    else:
        raise ArgumentError(
            f"generator: expected an int, torch.Generator or numpy Generator, "
            f"got {type(seed).__name__}"
        )
    return gen


@dataclass(frozen=True)
class Picks:
    """Sampled edge positions: ``which[i]`` indexes the batch of rows, ``pos[i]`` the edge."""

    which: Tensor
    pos: Tensor

    def __len__(self) -> int:
        return int(self.pos.numel())


def _segments(indptr: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    start = indptr[rows]
    return start, indptr[rows + 1] - start


def _expand(start: Tensor, count: Tensor) -> tuple[Tensor, Tensor]:
    """``(which, pos)`` listing every position of each segment, in order."""
    which = torch.repeat_interleave(torch.arange(count.numel()), count)
    first = torch.cumsum(count, 0) - count
    pos = start[which] + torch.arange(which.numel()) - first[which]
    return which, pos


def sample_segments(
    indptr: Tensor,
    rows: Tensor,
    fanout: int | Tensor,
    *,
    replace: bool = False,
    weights: Tensor | None = None,
    generator: torch.Generator,
) -> Picks:
    """Pick up to ``fanout`` edge positions of every row in ``rows``.

    ``fanout`` is one int for all rows or an int64 tensor with one entry per row
    (per-edge-type fanouts use that). ``weights`` (float, one per edge position)
    switches to weighted sampling. Inputs are trusted: the public samplers check them.
    """
    rows = rows.long()
    start, deg = _segments(indptr, rows)
    k = fanout if isinstance(fanout, Tensor) else torch.full_like(deg, int(fanout))
    if rows.numel() == 0:
        empty = torch.empty(0, dtype=torch.long)
        return Picks(empty, empty)
    if weights is not None:
        if replace:
            return _weighted_replace(start, deg, k, weights, generator)
        return _weighted_no_replace(start, deg, k, weights, generator)
    if replace:
        return _uniform_replace(start, deg, k, generator)
    return _uniform_no_replace(start, deg, k, generator)


def _uniform_replace(start: Tensor, deg: Tensor, k: Tensor, gen: torch.Generator) -> Picks:
    count = torch.where(deg > 0, k, 0)
    which = torch.repeat_interleave(torch.arange(count.numel()), count)
    u = torch.rand(which.numel(), generator=gen, dtype=torch.float64)
    pos = start[which] + (u * deg[which]).long()
    return Picks(which, pos)


def _uniform_no_replace(start: Tensor, deg: Tensor, k: Tensor, gen: torch.Generator) -> Picks:
    kk = torch.minimum(deg, k)
    if kk.numel() == 0 or int(kk.max()) == 0:
        empty = torch.empty(0, dtype=torch.long)
        return Picks(empty, empty)
    draw = torch.nonzero(deg > k).squeeze(1)  # rows that keep only some of their edges
    chosen = _floyd(deg[draw], kk[draw], gen) if draw.numel() else None
    width = 0 if chosen is None else chosen.size(1)
    if width < int(kk.max()):  # rows taking all their edges have more: list them in order
        which, pos = _expand(start, kk)
        if chosen is not None:
            used = chosen >= 0
            first = (torch.cumsum(kk, 0) - kk)[draw]
            slots = first.unsqueeze(1) + torch.arange(width)
            pos[slots[used]] = (start[draw].unsqueeze(1) + chosen)[used]
        return Picks(which, pos)
    # a sampling fanout: one [rows, width] table of offsets, the drawn rows' from Floyd
    offsets = torch.arange(width).expand(deg.numel(), width)
    offsets = torch.where(offsets < kk.unsqueeze(1), offsets, -1)
    offsets[draw] = chosen  # type: ignore[assignment]
    total = int(kk.sum())
    which = torch.repeat_interleave(torch.arange(deg.numel()), kk, output_size=total)
    if total == offsets.numel():  # every row has `width` picks: no mask needed
        return Picks(which, (start.unsqueeze(1) + offsets).reshape(-1))
    return Picks(which, torch.masked_select(start.unsqueeze(1) + offsets, offsets >= 0))


def _floyd(n: Tensor, k: Tensor, gen: torch.Generator) -> Tensor:
    """Floyd's algorithm on every row at once: ``k[r]`` distinct values of ``range(n[r])``.

    Requires ``k <= n``. Returns ``[rows, max(k)]``; entries past ``k[r]`` are -1.
    With ``k == n`` it returns every value (in random order), so one code path
    serves rows with fewer neighbours than the fanout too.
    """
    kmax = int(k.max())
    out = torch.full((kmax, n.numel()), -1, dtype=torch.long)  # pick-major: rows contiguous
    base = n - k
    for i in range(kmax):
        j = base + i  # pick from range(j + 1)
        u = torch.rand(n.numel(), generator=gen, dtype=torch.float64)
        t = (u * (j + 1)).long()
        if i:
            seen = (out[:i] == t).any(0)
            t = torch.where(seen, j, t)
        out[i] = torch.where(i < k, t, -1)
    return out.t()


def _weighted_no_replace(
    start: Tensor, deg: Tensor, k: Tensor, weights: Tensor, gen: torch.Generator
) -> Picks:
    which, pos = _expand(start, deg)
    w = weights[pos].to(torch.float64)
    u = torch.rand(pos.numel(), generator=gen, dtype=torch.float64).clamp_min_(1e-300)
    key = torch.where(w > 0, torch.log(u) / w, -torch.inf)
    order = torch.argsort(key, descending=True, stable=True)
    order = order[torch.argsort(which[order], stable=True)]
    seg_first = torch.cumsum(deg, 0) - deg
    rank = torch.arange(order.numel()) - seg_first[which[order]]
    keep = (rank < k[which[order]]) & (key[order] > -torch.inf)
    sel = order[keep]
    return Picks(which[sel], pos[sel])


def _weighted_replace(
    start: Tensor, deg: Tensor, k: Tensor, weights: Tensor, gen: torch.Generator
) -> Picks:
    _, pos = _expand(start, deg)
    w = weights[pos].to(torch.float64).clamp_min(0)
    cw = torch.cumsum(w, 0)
    seg_end = torch.cumsum(deg, 0)
    seg_first = seg_end - deg
    before = torch.where(seg_first > 0, cw[(seg_first - 1).clamp_min(0)], 0.0)
    last = (seg_end - 1).clamp_min(0)
    total = torch.where(deg > 0, cw[last] - before, 0.0)
    count = torch.where(total > 0, k, 0)
    swhich = torch.repeat_interleave(torch.arange(count.numel()), count)
    u = torch.rand(swhich.numel(), generator=gen, dtype=torch.float64)
    target = before[swhich] + u * total[swhich]
    idx = torch.searchsorted(cw, target, right=True)
    idx = torch.minimum(idx, last[swhich])
    return Picks(swhich, pos[idx])
