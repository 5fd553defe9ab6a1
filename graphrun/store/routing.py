"""Routing: global ids → owner partitions → one request per owner → answers merged.

Every operation on the rows of a partitioned id space goes through here: the store
client's ``pull``/``push`` and the distributed sampler's neighbour sampling and
structure queries. The caller checks its ids once (range and dtype); :func:`by_owner`
then looks up each id's owner once (:func:`graphrun.names.owners`: one ``searchsorted``
over the partition bounds), and :func:`remote_first` sends the requests of the remote
owners before it computes the co-located ones in this process, so the network and the
local work overlap.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from graphrun.names import owners

T = TypeVar("T")
P = TypeVar("P")


@dataclass(frozen=True)
class Group:
    """The ids of one request owned by partition ``part``.

    ``pos`` is where they stand in the caller's ids: a slice when they are all of them
    (or a contiguous piece of all of them), else an index array. ``start`` is the
    partition's first id, so ``rows`` are the ids as rows of the owner's arrays.
    """

    part: int
    pos: np.ndarray | slice
    ids: np.ndarray
    start: int = 0

    @property
    def rows(self) -> np.ndarray:
        return self.ids - self.start if self.start else self.ids

    def pieces(self, k: int) -> list[Group]:
        """This group cut into ``k`` contiguous pieces of about equal size."""
        if k <= 1:
            return [self]
        n = len(self.ids)
        bounds = [n * i // k for i in range(k + 1)]
        out = []
        for a, b in itertools.pairwise(bounds):
            if isinstance(self.pos, slice):
                pos: np.ndarray | slice = slice(self.pos.start + a, self.pos.start + b)
            else:
                pos = self.pos[a:b]
            out.append(Group(self.part, pos, self.ids[a:b], self.start))
        return out


def by_owner(bounds: np.ndarray, ids: np.ndarray) -> list[Group]:
    """Checked int64 ``ids`` grouped by owner, in partition order; ids keep their order
    inside a group. One owner lookup per id; a request that one partition owns whole
    is one group over all of it (no index array, no reordering)."""
    num_parts = len(bounds) - 1
    if num_parts == 1 or len(ids) == 0:
        return [Group(0, slice(0, len(ids)), ids, int(bounds[0]))]
    return by_part(owners(bounds, ids), ids, bounds)


def parts_of(part: np.ndarray) -> list[int]:
    """The partitions in ``part`` (owners, ``>= 0``), ascending: a count, not
    ``np.unique`` (numpy 2's hashes then sorts ten thousand owners: a millisecond)."""
    return np.flatnonzero(np.bincount(part)).tolist() if len(part) else []


def by_part(part: np.ndarray, ids: np.ndarray, bounds: np.ndarray) -> list[Group]:
    """``ids`` grouped by the given owner of each (a live graph's growth ids have owners
    no bounds give); ``start`` of a group is its partition's first base id."""
    num_parts = len(bounds) - 1
    if len(ids) == 0:
        return [Group(0, slice(0, 0), ids, int(bounds[0]))]
    lo, hi = int(part.min()), int(part.max())
    if lo == hi:
        return [Group(lo, slice(0, len(ids)), ids, int(bounds[lo]))]
    order = np.argsort(part, kind="stable")
    cuts = np.searchsorted(part[order], np.arange(num_parts + 1))
    out = []
    for p in range(lo, hi + 1):
        pos = order[cuts[p] : cuts[p + 1]]
        if len(pos):
            out.append(Group(p, pos, ids[pos], int(bounds[p])))
    return out


#: Set to ``1``, this environment variable runs the sampler's and the client's hot loops
#: compiled with numba (:mod:`graphrun.sampling.compiled`, :mod:`graphrun.store.compiled`):
#: a sampled batch in about a sixth less CPU than the numpy kernels (a third before stop 53's
#: numpy kernels), scattered rows in 27 % less. Off by default: numba's
#: import and first kernels add about 135 MiB to each process that uses them (a store
#: server, a trainer), more than a 1.5 GB host has to spare (benchmarks/README.md).
COMPILED_ENV = "GRAPHRUN_COMPILED"


def compiled_kernels() -> bool:
    """Whether ``GRAPHRUN_COMPILED=1`` asks for the compiled kernels."""
    return os.environ.get(COMPILED_ENV, "") == "1"


#: Rows are written run by run (a gather straight into each slice of the output) when the
#: positions form at most this many runs of consecutive positions; else gathered, then
#: scattered. A sampled batch's nodes are seeds then each hop sorted by id, so one owner's
#: rows are a few runs (about one per hop).
MAX_RUNS = 32


def _runs(at: np.ndarray) -> list[tuple[int, int]] | None:
    """``(first index, end index)`` into ``at`` of each run of consecutive positions, or
    None when there are more than ``MAX_RUNS``."""
    if len(at) == 0:
        return []
    breaks = np.flatnonzero(np.diff(at) != 1) + 1
    if len(breaks) >= MAX_RUNS:
        return None
    bounds = [0, *breaks.tolist(), len(at)]
    return list(itertools.pairwise(bounds))


def take_into(out: np.ndarray, at: np.ndarray | slice, src: np.ndarray, rows: np.ndarray) -> None:
    """``out[at] = src[rows]`` (``rows`` checked: in range), in one pass over the bytes:
    ``np.take`` into ``out``'s slices where ``at`` is a slice or a few runs, else (with
    ``GRAPHRUN_COMPILED=1``) the compiled gather-scatter (:mod:`graphrun.store.compiled`)
    or numpy's gather, then scatter: two passes, which cost a benchmark batch much of its
    build time (benchmarks/README.md)."""
    if isinstance(at, slice):
        np.take(src, rows, axis=0, mode="clip", out=out[at])
        return
    runs = _runs(at)
    if runs is None:
        src_b, out_b = _row_bytes(src), _row_bytes(out)
        same = src.dtype == out.dtype and src.shape[1:] == out.shape[1:]
        if src_b is None or out_b is None or not same or not compiled_kernels():
            out[at] = np.take(src, rows, axis=0, mode="clip")
            return
        from graphrun.store import compiled  # numba: imported on the first such gather

        compiled.take_rows(src_b, np.asarray(rows, np.int64), out_b, np.asarray(at, np.int64))
        return
    for a, b in runs:
        start = int(at[a])
        np.take(src, rows[a:b], axis=0, mode="clip", out=out[start : start + b - a])


def _row_bytes(a: np.ndarray) -> np.ndarray | None:
    """A C-contiguous array of rows as ``[rows, row bytes]`` uint8 (no copy); None when it
    is not one, or has no bytes."""
    if a.ndim == 0 or a.size == 0 or not a.flags.c_contiguous:
        return None
    return a.reshape(len(a), -1).view(np.uint8)


def put_into(out: np.ndarray, at: np.ndarray | slice, rows: np.ndarray) -> None:
    """``out[at] = rows``, run by run as slice copies where ``at`` is a few runs."""
    if isinstance(at, slice) or (runs := _runs(at)) is None:
        out[at] = rows
        return
    for a, b in runs:
        start = int(at[a])
        out[start : start + b - a] = rows[a:b]


def remote_first(
    groups: Sequence[Group],
    is_local: Callable[[int], bool],
    send: Callable[[Group], P],
    wait: Callable[[P], T],
    compute: Callable[[Group], T],
) -> Iterator[tuple[Group, T]]:
    """Each group with its answer: the requests of every remote group are sent first,
    then the local groups are computed here (yielded as they are done), then the remote
    answers are waited for in the order they were sent."""
    sent = [(g, send(g)) for g in groups if not is_local(g.part)]
    for g in groups:
        if is_local(g.part):
            yield g, compute(g)
    for g, pending in sent:
        yield g, wait(pending)
