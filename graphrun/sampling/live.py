"""Sampling a live partition at a version: base CSC minus deleted edges plus new ones.

A store's sampling ops (:mod:`graphrun.sampling.server`) read at the request's version
(:func:`graphrun.store.live_ops.view`); when a delta is visible there, the in-edges of
the request's seeds are merged into a small CSC of their own — the base rows minus the
edges deleted at or below the version, plus the new edges into each seed (base or new
node) — and sampled with the same kernels. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.names import TensorKey, etype_key
from graphrun.partition.book import PartitionBook
from graphrun.sampling.csc import CSCGraph, SampledEdges
from graphrun.sampling.kernels import make_rng, sample_segments
from graphrun.store.live import LiveDelta, spans
from graphrun.store.live_index import Run, eids_in_order, lookup_sorted, values_at


def _base(csc: CSCGraph, delta: LiveDelta, version: int, seeds: np.ndarray) -> np.ndarray:
    """Which seeds are base rows of this partition; ArgumentError naming the first that
    is no node of it at ``version``."""
    if seeds.ndim != 1 or seeds.dtype != np.int64:
        raise ArgumentError(f"seeds must be 1-d int64, got {seeds.dtype} {seeds.shape}")
    lo, hi = csc.row_start, csc.row_start + csc.num_rows
    base = (seeds >= lo) & (seeds < hi)
    new = ~base & delta.nodes_at(seeds, version)
    if not (base | new).all():
        i = int(np.flatnonzero(~(base | new))[0])
        raise ArgumentError(f"seeds[{i}] = {int(seeds[i])} is not a node of this partition "
                            f"at version {version}")  # fmt: skip
    return base


def find_edges(
    csc: CSCGraph, delta: LiveDelta, version: int, eids: np.ndarray, missing: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` of this partition's edge ids at ``version``: base edges (and new ones
    a compaction folded in) from the CSC, the rest from the delta's runs; ArgumentError
    naming the first that is no edge here at ``version`` (not added yet, or deleted), or
    with ``missing`` -1 ends for those (a link batch drops such positives)."""
    found, src, dst = csc.edges_of(eids)
    bad = _new_edges(delta, version, eids, found, ((src, 2), (dst, 4)), refuse=not missing)
    src[bad] = dst[bad] = -1
    return src, dst


def edge_types(csc: CSCGraph, delta: LiveDelta, version: int, eids: np.ndarray) -> np.ndarray:
    """The edge type index of this partition's edge ids at ``version``, read and refused
    as :func:`find_edges` reads them (a new edge's type: the one its batch gave it)."""
    found, etype = csc.types_of(eids)
    _new_edges(delta, version, eids, found, ((etype, 1),))
    return etype


def _new_edges(
    delta: LiveDelta,
    version: int,
    eids: np.ndarray,
    found: np.ndarray,
    cols: tuple[tuple[np.ndarray, int], ...],
    refuse: bool = True,
) -> np.ndarray:
    """Fill each ``(col, row)`` of ``cols`` at the edges the base did not have (``found``
    false) from row ``row`` of the runs' by-eid table (eid, etype, src, version, dst);
    ArgumentError naming the first that is no edge here at ``version`` (``refuse``),
    else their mask."""
    for r in delta.runs if not found.all() else []:
        by_eid = r.edges_by_eid()
        hit, pos = lookup_sorted(by_eid[0], eids)
        hit &= ~found & (values_at(by_eid[3], hit, pos, 0) <= version)
        for col, row in cols:
            col[hit] = by_eid[row][pos[hit]]
        found |= hit
    bad: np.ndarray = ~found | delta.deleted(eids, version)
    if refuse and bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise ArgumentError(f"eids[{j}] = {int(eids[j])} is not an edge of this partition "
                            f"at version {version}")  # fmt: skip
    return bad


def in_degrees(csc: CSCGraph, delta: LiveDelta, version: int, seeds: np.ndarray) -> np.ndarray:
    """Each seed's in-degree at ``version``: its base row's, less its base in-edges deleted
    by then, plus its new in-edges. Only the delta's deletions and the seeds' new edges are
    looked at, never the seeds' base in-edges (a hub's are many)."""
    base = _base(csc, delta, version, seeds)
    rows = seeds[base] - csc.row_start
    out = np.zeros(len(seeds), np.int64)
    out[base] = csc.indptr[rows + 1] - csc.indptr[rows]
    dst = _deleted_base_dst(csc, delta, version)
    if len(dst) and base.any():
        out[base] -= np.searchsorted(dst, seeds[base], "right") - np.searchsorted(dst, seeds[base])
    return out + delta.in_edges(seeds, version)[0]


def _deleted_base_dst(csc: CSCGraph, delta: LiveDelta, version: int) -> np.ndarray:
    """The destinations, sorted, of the base edges deleted by ``version``: edges of the
    base CSC, also those compaction folded into it (the CSC's edge-id index is built only
    once an edge was deleted)."""
    gone = np.unique(delta.deleted_at(version))
    if not len(gone):
        return gone
    return np.sort(csc.find_edges(gone[csc.has_edges(gone)])[1])


def _deleted_into(
    csc: CSCGraph, delta: LiveDelta, version: int, seeds: np.ndarray, base: np.ndarray
) -> bool:
    """Whether a base in-edge of a base seed is deleted at ``version``."""
    dst = _deleted_base_dst(csc, delta, version)
    return bool(len(dst) and base.any() and np.isin(seeds[base], dst).any())


@dataclass(frozen=True)
class EdgeWeights:
    """Where a partition's edge weights are at a version: edge feature ``name``, its base
    rows read by ``base(etype_key, local_rows)`` (the partition's own tensor), and every
    row written since — a new edge's (its growth row, also once a compaction folded the
    edge into the base CSC), an updated base row's — from the delta."""

    name: str
    book: PartitionBook
    part: int
    base: Callable[[str, np.ndarray], np.ndarray]

    def of(
        self, delta: LiveDelta, version: int, eids: np.ndarray, etypes: np.ndarray | None
    ) -> np.ndarray:
        """float64 weight of each of ``eids`` (edges of this partition at ``version``, of
        types ``etypes``; None: the one edge type)."""
        out = np.zeros(len(eids), np.float64)
        n_e = self.book.num_edges
        grow = eids >= n_e
        one = len(self.book.edge_types) == 1  # a base edge's id is its id in its type's
        per_type = eids.copy()  # a growth id is its id in its type's id space too
        et = np.zeros(len(eids), np.int64) if etypes is None else np.asarray(etypes, np.int64)
        if not one and (~grow).any():
            et[~grow], per_type[~grow] = self.book.eid_to_per_type(eids[~grow])
        for r, etype in enumerate(self.book.edge_types):
            mine = slice(None) if one else et == r
            key = etype_key(etype)
            lo = int(self.book.edge_ranges(etype)[self.part])
            ids, b = per_type[mine], ~grow[mine]
            if not len(ids):
                continue
            rows = self.base(key, ids[b] - lo)
            if rows.ndim != 1:
                raise ArgumentError(f"weight: edge feature {self.name!r} must be 1-d, "
                                    f"got rows of shape {rows.shape[1:]}")  # fmt: skip
            vals = np.zeros(len(ids), rows.dtype)
            vals[b] = rows
            name = str(TensorKey.edge(key, self.name))
            ask = slice(None) if _updates_base(delta, name, n_e) else ~b  # most are base
            got = vals[ask]
            found = delta.rows(name, ids[ask], version, got)
            vals[ask] = got
            if not (found | b[ask]).all():  # a new edge always carries every edge feature
                i = int(np.flatnonzero(~(found | b[ask]))[0])
                raise ArgumentError(f"weight: edge {int(ids[ask][i])} has no row of "
                                    f"{self.name!r} at version {version}")  # fmt: skip
            out[mine] = vals
        return out


def _updates_base(delta: LiveDelta, name: str, n_e: int) -> bool:
    """Whether a run of ``delta`` holds a row of feature ``name`` for a base edge (below
    ``n_e``: an update, or its latest value folded into the growth by a compaction):
    without one, base edges' rows are the base tensor's and need not be looked up."""
    return any(len(ids) and int(ids[0]) < n_e
               for ids, _, _ in (r.rows[name] for r in delta.runs if name in r.rows))  # fmt: skip


def sample_one_hop(
    csc: CSCGraph, delta: LiveDelta, version: int, seeds: np.ndarray, fanout: Sequence[int],
    *, replace: bool, seed: int, weights: EdgeWeights | None = None,
) -> SampledEdges:  # fmt: skip
    """The edges :meth:`CSCGraph.sample_one_hop` picks from :func:`merged_csc` (the same
    ones, for the same ``seed``), without gathering the seeds' base in-edges: the kernel
    picks positions in each seed's merged row from its length alone (its base in-edges,
    then its new ones), and only the picked positions are read — a seed's base row as it
    is in the CSC, its new edges from the delta. A hub's thousands of in-edges cost
    nothing (merging them made a sampler call 10-75x slower than on the compacted graph,
    ``benchmarks/live_sample_cpu.py``). With several edge types, or a deleted base
    in-edge of a seed, the merged CSC is built as before.

    ``weights``: each edge drawn with its weight at ``version`` (weighted sampling, with
    or without replacement, as for a frozen graph). Every weight of a seed's row is
    read, so its merged row is built: its base in-edges less those deleted, then its
    new ones, each with its weight (:class:`EdgeWeights`)."""
    if weights is not None:
        merged = merged_csc(csc, delta, version, seeds, weights)
        return merged.sample_one_hop(np.arange(len(seeds)), fanout, replace=replace,
                                     weighted=True, seed=seed)  # fmt: skip
    base = _base(csc, delta, version, seeds)
    if csc.num_etypes > 1 or _deleted_into(csc, delta, version, seeds, base):
        merged = merged_csc(csc, delta, version, seeds)
        return merged.sample_one_hop(np.arange(len(seeds)), fanout, replace=replace, seed=seed)
    fan = np.asarray(fanout, np.int64).reshape(-1)
    if len(fan) != 1:
        raise ArgumentError(f"fanout: expected 1 per-edge-type entries, got {len(fan)}")
    rows = seeds[base] - csc.row_start
    start_b, deg_b = np.zeros(len(seeds), np.int64), np.zeros(len(seeds), np.int64)
    start_b[base] = csc.indptr[rows]
    deg_b[base] = csc.indptr[rows + 1] - start_b[base]
    new = NewEdges.of(delta, version, seeds, (csc.row_start, csc.row_start + csc.num_rows))
    if new is not None:
        counts_new = new.counts.sum(axis=0)
    else:
        counts_new, e = delta.in_edges(seeds, version)
    indptr = np.zeros(len(seeds) + 1, np.int64)
    np.cumsum(deg_b + counts_new, out=indptr[1:])
    picks = sample_segments(indptr, np.arange(len(seeds)), int(fan[0]), replace=replace,
                            rng=make_rng(seed))  # fmt: skip
    which, off = picks.which, picks.pos - indptr[picks.which]
    old = off < deg_b[which]
    at_base = start_b[which[old]] + off[old]
    k = off[~old] - deg_b[which[~old]]  # the pick's place among its seed's new edges
    src, eid = np.empty(len(which), np.int64), np.empty(len(which), np.int64)
    src[old], eid[old] = csc.indices[at_base], csc.eids[at_base]
    if new is not None:
        src[~old], eid[~old] = new.take(which[~old], k)
    else:
        at_new = (np.cumsum(counts_new) - counts_new)[which[~old]] + k
        src[~old], eid[~old] = e[0][at_new], e[2][at_new]
    return SampledEdges(src=src, seed_index=which, eid=eid)


class NewEdges:
    """Each seed's new in-edges at a version as a span of each of the delta's runs, read
    in place: only the edges a sampler picks are gathered. A seed's new edges are its
    spans run after run, the order :meth:`LiveDelta.in_edges` gives (by edge id) when
    the runs' edge ids are in order (:func:`~graphrun.store.live_index.eids_in_order`,
    as the sequencer hands them out) and nothing is deleted; otherwise :meth:`of` says
    None and the edges are gathered whole. Gathering them grew with the delta: a
    second hop's 10k seeds through 2M new edges took 20 ms of CPU against 1.5 on the
    compacted graph (``benchmarks/live_sample_cpu.py``; benchmarks/README.md, "the
    epoch while ingesting, round 3")."""

    def __init__(self, runs: list[Run], lo: np.ndarray, counts: np.ndarray) -> None:
        self.runs, self.lo, self.counts = runs, lo, counts  # lo, counts: int64 [runs, seeds]

    @staticmethod
    def of(
        delta: LiveDelta, version: int, seeds: np.ndarray, rows: tuple[int, int]
    ) -> NewEdges | None:
        """The spans of ``seeds`` at ``version`` (``rows``: the partition's base rows),
        or None (see the class)."""
        runs = delta.runs
        if any(len(r.deleted[0]) for r in runs):
            return None
        runs = [r for r in runs if r.edges.shape[1]]
        if not eids_in_order(runs):
            return None
        order = np.argsort(seeds, kind="stable")  # sorted needles: a fraction of the misses
        needles = seeds[order]
        lo, counts = np.empty((2, len(runs), len(seeds)), np.int64)
        for i, r in enumerate(runs):
            a, b = r.dst_spans(needles, rows)
            if r.last > version:  # by version within a destination: a prefix is visible
                seen = r.edges[4, spans(a, b)] <= version
                b = a + np.bincount(np.repeat(np.arange(len(a)), b - a)[seen], minlength=len(a))
            lo[i, order], counts[i, order] = a, b - a
        return NewEdges(runs, lo, counts)

    def take(self, which: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(src, eid)`` of the ``k[j]``-th new edge of seed ``which[j]``: run after run,
        the picks not in the runs before are looked for in this one (``k`` less their
        edges in those). Each run looks only at the picks left, where a cumulative sum
        of every run's counts at every pick cost 2.2 ms of CPU for a second hop's 19k
        picks in three runs, against 1.0 (benchmarks/README.md, merge62)."""
        src, eid = np.empty(len(k), np.int64), np.empty(len(k), np.int64)
        left, rest = np.arange(len(k)), k.copy()  # picks not found yet; k in what is left
        for i, r in enumerate(self.runs):
            w = which[left]
            c = self.counts[i, w]
            here = rest < c
            at = self.lo[i, w[here]] + rest[here]
            src[left[here]], eid[left[here]] = r.edges[0, at], r.edges[2, at]
            left, rest = left[~here], rest[~here] - c[~here]
        return src, eid


def merged_csc(
    csc: CSCGraph, delta: LiveDelta, version: int, seeds: np.ndarray,
    weights: EdgeWeights | None = None,
) -> CSCGraph:  # fmt: skip
    """The in-edges of ``seeds`` at ``version`` as a CSC whose row ``i`` is ``seeds[i]``
    (with each edge's weight at ``version`` where ``weights`` is given)."""
    base = _base(csc, delta, version, seeds)
    rows = seeds[base] - csc.row_start
    pos = spans(csc.indptr[rows], csc.indptr[rows + 1])
    seg_b = np.repeat(np.flatnonzero(base), csc.indptr[rows + 1] - csc.indptr[rows])
    eid_b = csc.eids[pos]
    keep = ~delta.deleted(eid_b, version)
    et_b = csc.etypes[pos] if csc.etypes is not None else np.zeros(len(pos), np.int64)
    counts_new, e = delta.in_edges(seeds, version)
    seg = np.concatenate([seg_b[keep], np.repeat(np.arange(len(seeds)), counts_new)])
    order = np.argsort(seg, kind="stable")
    src = np.concatenate([csc.indices[pos][keep], e[0]])[order]
    eid = np.concatenate([eid_b[keep], e[2]])[order]
    et = np.concatenate([np.asarray(et_b, np.int64)[keep], e[3]])[order]
    indptr = np.zeros(len(seeds) + 1, np.int64)
    np.cumsum(np.bincount(seg, minlength=len(seeds)), out=indptr[1:])
    typed = csc.num_etypes > 1
    w = None if weights is None else weights.of(delta, version, eid, et if typed else None)
    return CSCGraph(
        indptr, src, eid, etypes=et if typed else None,
        num_etypes=csc.num_etypes, num_rows=len(seeds), weights=w,
    )  # fmt: skip


def out_degree_counts(
    csc: CSCGraph, delta: LiveDelta, version: int, ids: np.ndarray, num_nodes: int
) -> np.ndarray:
    """How many of this partition's edges at ``version`` leave each of ``ids`` (base ids
    below ``num_nodes``, or growth ids)."""
    base = ids < num_nodes
    out = np.zeros(len(ids), np.int64)
    out[base] = csc.out_degree_counts(num_nodes)[ids[base]]
    return out + delta.out_change(ids, version, lambda eids: csc.find_edges(eids)[0])
