"""One-hop neighbour sampling on a local CSC (a whole graph or one partition), no torch.

:class:`CSCGraph` holds the in-edges of a contiguous block of *owned* nodes:
row ``i`` is global node ``row_start + i``; ``indices`` are global source ids and
``eids`` global edge ids (the partition format's layout: inner nodes first, in
increasing id). On a heterograph the in-edges of every row are grouped by edge
type once at construction, so each ``(row, edge type)`` pair is its own segment
and a per-type fanout is a plain per-segment fanout for the kernels.

:meth:`CSCGraph.sample_one_hop` is the one-hop sampler interface
(:class:`graphrun.sampling.mfg.OneHopSampler`) that multi-layer sampling, the
distributed sampler and the store's sampling extension all use. Nothing here
imports torch: a store server samples with this module alone (see
:mod:`graphrun.sampling.kernels`).

A partition (directory format v1, or the store's shared-memory copy of it) holds
the CSC of its local nodes with global source and edge ids; the owned nodes come
first and are the contiguous new ids ``book.owned_nodes(part)``. Its in-edges are
already grouped by edge type inside every row (the writer orders them by edge id,
and edge ids are grouped by type), so :func:`csc_from_structure` copies nothing:
the arrays stay memory-mapped / in shared memory.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from graphrun.errors import ArgumentError
from graphrun.graph.graph import Graph
from graphrun.names import etype_key, owners
from graphrun.partition.book import PartitionBook
from graphrun.sampling.kernels import fanouts, make_rng, sample_segments, uniform_picks
from graphrun.store.routing import compiled_kernels

#: The edge id of an edge sampled with ``edge_ids=False`` (its id not gathered)
NO_EDGE_ID = -1


@dataclass(frozen=True)
class SampledEdges:
    """Edges picked for a batch of seeds: ``src -> seeds[seed_index]``, global ids (int64;
    ``etype`` int32)."""

    src: np.ndarray
    seed_index: np.ndarray
    eid: np.ndarray
    etype: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.src)

    @property
    def nbytes(self) -> int:
        arrays = (self.src, self.seed_index, self.eid, self.etype)
        return sum(a.nbytes for a in arrays if a is not None)

    @staticmethod
    def no_edge_ids(n: int) -> np.ndarray:
        """The ``eid`` of ``n`` edges sampled without their ids: :data:`NO_EDGE_ID` each."""
        return np.full(n, NO_EDGE_ID, dtype=np.int64)

    @staticmethod
    def empty(typed: bool) -> SampledEdges:
        e = np.empty(0, dtype=np.int64)
        return SampledEdges(e, e, e, np.empty(0, dtype=np.int32) if typed else None)


def check_seeds(seeds: object, lo: int, hi: int, arg: str = "seeds") -> np.ndarray:
    """``seeds`` as an int64 array, all in ``[lo, hi)``; ArgumentError naming the first bad one.

    Takes anything array-like (a torch tensor too, without a copy)."""
    a = np.asarray(seeds)
    if a.ndim != 1:
        raise ArgumentError(f"{arg}: expected a 1-d tensor of node ids, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise ArgumentError(f"{arg}: expected integer node ids, got {a.dtype}")
    a = a.astype(np.int64, copy=False)
    if len(a):
        bad = (a < lo) | (a >= hi)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ArgumentError(f"{arg}[{i}] = {int(a[i])} is out of range [{lo}, {hi})")
    return a


def _int64(a: npt.ArrayLike) -> np.ndarray:
    return np.asarray(a).astype(np.int64, copy=False)


class CSCGraph:
    """In-edges of the owned nodes ``[row_start, row_start + num_rows)``, ready to sample."""

    def __init__(
        self,
        indptr: np.ndarray,
        indices: np.ndarray,
        eids: np.ndarray,
        *,
        etypes: np.ndarray | None = None,
        num_etypes: int = 1,
        row_start: int = 0,
        num_rows: int | None = None,
        weights: np.ndarray | None = None,
    ) -> None:
        indptr = _int64(indptr)
        self.num_rows = len(indptr) - 1 if num_rows is None else int(num_rows)
        self.row_start = int(row_start)
        self.num_etypes = int(num_etypes)
        self.indptr = indptr[: self.num_rows + 1]  # halo rows are never seeds
        n_e = int(self.indptr[-1])
        self.indices = _int64(indices[:n_e])
        self.eids = _int64(eids[:n_e])
        self.weights = None if weights is None else np.asarray(weights[:n_e], dtype=np.float64)
        self.etypes: np.ndarray | None = None
        self.typed_indptr: np.ndarray | None = None
        self._out_counts: np.ndarray | None = None
        self._eid_sorted: np.ndarray | None = None
        self._eid_order: np.ndarray | None = None
        self._out_indptr: np.ndarray | None = None
        self._out_dst: np.ndarray | None = None
        self._out_eid: np.ndarray | None = None
        self._edge_ids = True
        if self.num_etypes > 1:
            if etypes is None:
                raise ArgumentError("etypes: required when num_etypes > 1")
            self._group_by_type(_int64(etypes[:n_e]))

    def _group_by_type(self, et: np.ndarray) -> None:
        """Sort each row's in-edges by edge type; segment ``row * R + r`` = row's type-r edges."""
        r = self.num_etypes
        row_of_edge = np.repeat(np.arange(self.num_rows, dtype=np.int64), np.diff(self.indptr))
        key = row_of_edge * r + et
        if len(et) > 1 and bool((key[1:] < key[:-1]).any()):
            order = np.argsort(key, kind="stable")
            key = key[order]
            self.indices = self.indices[order]
            self.eids = self.eids[order]
            et = et[order]
            if self.weights is not None:
                self.weights = self.weights[order]
        counts = np.bincount(key, minlength=self.num_rows * r)
        typed = np.zeros(self.num_rows * r + 1, dtype=np.int64)
        np.cumsum(counts, out=typed[1:])
        self.typed_indptr = typed
        self.etypes = et.astype(np.int32)

    @classmethod
    def from_graph(cls, graph: Graph, weight: str | None = None) -> CSCGraph:
        """The whole graph as one block (rows = global node ids)."""
        indptr, indices, eids = graph.csc()
        w = None if weight is None else _edge_feature_by_eid(graph, weight)[eids]
        return cls(
            indptr,
            indices,
            eids,
            etypes=graph.edge_type_ids()[eids] if len(graph.edge_types) > 1 else None,
            num_etypes=len(graph.edge_types),
            weights=w,
        )

    @property
    def num_edges(self) -> int:
        return len(self.indices)

    def in_degrees(self, nodes: object) -> np.ndarray:
        rows = check_seeds(nodes, self.row_start, self.row_start + self.num_rows, "nodes")
        rows = rows - self.row_start
        return self.indptr[rows + 1] - self.indptr[rows]

    def out_degree_counts(self, num_nodes: int) -> np.ndarray:
        """How many of this block's edges leave each of the ``num_nodes`` global nodes."""
        if self._out_counts is None or len(self._out_counts) != num_nodes:
            base = self.indices[self.indices < num_nodes]  # a compacted live graph's new
            self._out_counts = np.bincount(base, minlength=num_nodes)  # sources: its delta
        return self._out_counts

    def _lookup(self, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(hit, i)``: whether each edge id is this block's, and its place in the block's
        ids in order (an index built on the first call)."""
        if self._eid_sorted is None:
            self._eid_order = np.argsort(self.eids, kind="stable")
            self._eid_sorted = self.eids[self._eid_order]
        i = np.minimum(np.searchsorted(self._eid_sorted, e), max(self.num_edges - 1, 0))
        hit = self._eid_sorted[i] == e if self.num_edges else np.zeros(len(e), dtype=bool)
        return hit, i

    def has_edges(self, eids: np.ndarray) -> np.ndarray:
        """Whether each of ``eids`` is an edge of this block."""
        return self._lookup(_int64(np.asarray(eids)))[0]

    def find_edges(self, eids: object) -> tuple[np.ndarray, np.ndarray]:
        """``(src, dst)`` global node ids of edges ``eids`` owned by this block."""
        e = _int64(np.asarray(eids))
        hit, src, dst = self.edges_of(e)
        if not hit.all():
            j = int(np.flatnonzero(~hit)[0])
            raise ArgumentError(f"eids[{j}] = {int(e[j])} is not an edge of this partition")
        return src, dst

    def edge_types(self, eids: object) -> np.ndarray:
        """The edge type index (int64; 0 on a graph of one type) of edges ``eids`` owned
        by this block."""
        e = _int64(np.asarray(eids))
        hit, etype = self.types_of(e)
        if not hit.all():
            j = int(np.flatnonzero(~hit)[0])
            raise ArgumentError(f"eids[{j}] = {int(e[j])} is not an edge of this partition")
        return etype

    def types_of(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(found, etype)`` of int64 edge ids (-1 where not an edge of this block)."""
        hit, i = self._lookup(eids)
        assert self._eid_order is not None
        etype = np.full(len(eids), -1, np.int64)
        etype[hit] = 0 if self.etypes is None else self.etypes[self._eid_order[i[hit]]]
        return hit, etype

    def edges_of(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(found, src, dst)`` of int64 edge ids (-1 where not an edge of this block)."""
        hit, i = self._lookup(eids)
        assert self._eid_order is not None
        pos = self._eid_order[i[hit]]
        src, dst = np.full(len(eids), -1, np.int64), np.full(len(eids), -1, np.int64)
        src[hit] = self.indices[pos]
        dst[hit] = owners(self.indptr, pos) + self.row_start  # the row holding each position
        return hit, src, dst

    def out_edges(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(src, dst, eid)`` of this block's edges leaving ``ids`` (global node ids; one
        that is no source here has none), grouped by ``ids`` in their order. An out-edge
        (CSR) index is built on the first call (``8 N + 12 E`` bytes: each out-edge's
        local destination and edge id in source order, so a lookup reads spans, not a
        binary search of every edge's row; 1.7 ms of 3.7 for 45k edges); then each id
        costs its out-degree, never a scan of the block."""
        if self._out_indptr is None:
            n = int(self.indices.max()) + 1 if self.num_edges else 0
            pos = np.argsort(self.indices, kind="stable")
            rows = np.arange(self.num_rows, dtype=np.int32 if self.num_rows < 1 << 31 else np.int64)
            self._out_dst = np.repeat(rows, np.diff(self.indptr))[pos]  # no search: a pass
            self._out_eid = self.eids[pos]
            self._out_indptr = np.zeros(n + 2, np.int64)  # n + 1: the empty span of none
            np.cumsum(np.bincount(self.indices, minlength=n + 1), out=self._out_indptr[1:])
        assert self._out_dst is not None and self._out_eid is not None
        none = len(self._out_indptr) - 2
        ids = _int64(ids)
        ids = np.where((ids >= 0) & (ids < none), ids, none)
        lo, hi = self._out_indptr[ids], self._out_indptr[ids + 1]
        counts = hi - lo
        at = np.repeat(lo - np.cumsum(counts) + counts, counts)
        span = at + np.arange(len(at), dtype=np.int64)
        dst = self._out_dst[span].astype(np.int64) + self.row_start
        return np.repeat(ids, counts), dst, self._out_eid[span]

    def without_edge_ids(self) -> CSCGraph:
        """This block (its arrays shared) sampling the same edges with every ``eid``
        :data:`NO_EDGE_ID`, as ``sample_one_hop(..., edge_ids=False)``: a one-hop sampler
        for node batches whose model reads no edge ids."""
        other = copy.copy(self)
        other._edge_ids = False
        return other

    def sample_one_hop(
        self,
        seeds: object,
        fanout: Sequence[int] | np.ndarray,
        *,
        replace: bool = False,
        weighted: bool = False,
        seed: int,
        edge_ids: bool = True,
    ) -> SampledEdges:
        """Sample in-edges of ``seeds`` (global ids owned here); ``fanout``: one per edge type.

        ``seed`` seeds the kernels' generator: the same seed gives the same edges here, in
        a trainer and on a store server. ``edge_ids=False``: every ``eid`` is
        :data:`NO_EDGE_ID`, not gathered (a scattered read per edge: for a model that
        reads no edge ids, a sixth of the one-hop kernel's time)."""
        edge_ids = edge_ids and self._edge_ids
        rows = check_seeds(seeds, self.row_start, self.row_start + self.num_rows) - self.row_start
        fan = _int64(fanout).reshape(-1)
        if len(fan) != self.num_etypes:
            raise ArgumentError(
                f"fanout: expected {self.num_etypes} per-edge-type entries, got {len(fan)}"
            )
        if weighted and self.weights is None:
            raise ArgumentError("weighted: this graph was loaded without edge weights")
        w = self.weights if weighted else None
        rng = make_rng(seed)
        if self.typed_indptr is None:
            if w is None and not replace and compiled_kernels():  # picks, then one gather
                k = fanouts(int(fan[0]), len(rows))
                if not edge_ids:
                    which, pos, _ = uniform_picks(self.indptr, rows, k, rng)
                    src = np.take(self.indices, pos)
                    return SampledEdges(src, which, SampledEdges.no_edge_ids(len(src)))
                which, src, eid = uniform_picks(
                    self.indptr, rows, k, rng, (self.indices, self.eids)
                )
                return SampledEdges(src=src, seed_index=which, eid=eid)
            picks = sample_segments(
                self.indptr, rows, int(fan[0]), replace=replace, weights=w, rng=rng
            )
            seed_index = picks.which
        else:
            active = np.flatnonzero(fan > 0)
            if len(active) == 0:
                return SampledEdges.empty(typed=True)
            seg = (rows[:, None] * self.num_etypes + active).reshape(-1)
            k = np.tile(fan[active], len(rows))
            picks = sample_segments(self.typed_indptr, seg, k, replace=replace, weights=w, rng=rng)
            seed_index = picks.which // len(active)
        pos = picks.pos
        return SampledEdges(  # np.take: a sixth faster than indexing here
            src=np.take(self.indices, pos),
            seed_index=seed_index,
            eid=np.take(self.eids, pos) if edge_ids else SampledEdges.no_edge_ids(len(pos)),
            etype=None if self.etypes is None else self.etypes[pos],
        )


def _edge_feature_by_eid(graph: Graph, name: str) -> np.ndarray:
    """An edge feature as one array in global edge id order (concatenated over types)."""
    parts = []
    for et in graph.edge_types:
        key = etype_key(et)
        feats = graph.edata.get(key, {})
        if name not in feats:
            raise ArgumentError(f"weight: edge type {key} has no edge feature {name!r}")
        arr = np.asarray(feats[name], dtype=np.float64)
        if arr.ndim != 1:
            raise ArgumentError(f"weight: edge feature {name!r} must be 1-d, got {arr.shape}")
        parts.append(arr)
    return np.concatenate(parts)


# ---- one partition of a partitioned graph


def csc_from_structure(
    structure: Mapping[str, np.ndarray],
    book: PartitionBook,
    part: int,
    weights: np.ndarray | None = None,
) -> CSCGraph:
    """The owned rows of partition ``part`` (``indptr``/``indices``/``eids``[/``etypes``])."""
    for key in ("indptr", "indices", "eids"):
        if key not in structure:
            raise ArgumentError(f"structure: array {key!r} of partition {part} is missing")
    lo, hi = book.owned_nodes(part)
    return CSCGraph(
        structure["indptr"],
        structure["indices"],
        structure["eids"],
        etypes=structure.get("etypes"),
        num_etypes=len(book.edge_types),
        row_start=lo,
        num_rows=hi - lo,
        weights=weights,
    )


def edge_weights_by_position(
    book: PartitionBook,
    part: int,
    eids: np.ndarray,
    features: Mapping[str, np.ndarray],
    name: str,
) -> np.ndarray:
    """Edge feature ``name`` (owned-edge rows per edge type) aligned with a CSC's ``eids``."""
    et, per_type = book.eid_to_per_type(eids)
    out = np.zeros(len(eids), dtype=np.float64)
    for r, etype in enumerate(book.edge_types):
        key = etype_key(etype)
        mask = et == r
        if not mask.any():
            continue
        if key not in features:
            raise ArgumentError(f"weight: edge type {key} has no edge feature {name!r}")
        start = int(book.edge_ranges(etype)[part])
        out[mask] = np.asarray(features[key])[per_type[mask] - start]
    return out


def owned_edge_weights(
    book: PartitionBook,
    part: int,
    structure: Mapping[str, np.ndarray],
    name: str,
    owned_rows: Callable[[str, int, int], np.ndarray],
) -> np.ndarray:
    """Edge feature ``name`` aligned with partition ``part``'s CSC (its owned rows).

    ``owned_rows(etype_key, lo, hi)`` gives the feature's rows ``[lo, hi)`` of one edge
    type: the edges of that type the partition owns (a server reads its own shared
    memory, a client pulls them)."""
    feats = {}
    for et in book.edge_types:
        lo, hi = book.edge_ranges(et)[part : part + 2]
        feats[etype_key(et)] = owned_rows(etype_key(et), int(lo), int(hi))
    lo_n, hi_n = book.owned_nodes(part)
    n_inner = int(structure["indptr"][hi_n - lo_n])
    eids = np.asarray(structure["eids"][:n_inner])
    return edge_weights_by_position(book, part, eids, feats, name)
