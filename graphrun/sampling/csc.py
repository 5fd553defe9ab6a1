"""One-hop neighbour sampling on a local CSC (a whole graph or one partition).

:class:`CSCGraph` holds the in-edges of a contiguous block of *owned* nodes:
row ``i`` is global node ``row_start + i``; ``indices`` are global source ids and
``eids`` global edge ids (the partition format's layout: inner nodes first, in
increasing id). On a heterograph the in-edges of every row are grouped by edge
type once at construction, so each ``(row, edge type)`` pair is its own segment
and a per-type fanout is a plain per-segment fanout for the kernels.

:meth:`CSCGraph.sample_one_hop` is the one-hop sampler interface
(:class:`graphrun.sampling.mfg.OneHopSampler`) that multi-layer sampling and the
distributed sampler both use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError
from graphrun.graph.graph import Graph, etype_key
from graphrun.sampling.kernels import sample_segments


@dataclass(frozen=True)
class SampledEdges:
    """Edges picked for a batch of seeds: ``src -> seeds[seed_index]``, global ids."""

    src: Tensor
    seed_index: Tensor
    eid: Tensor
    etype: Tensor | None = None

    def __len__(self) -> int:
        return int(self.src.numel())

    @staticmethod
    def empty(typed: bool) -> SampledEdges:
        e = torch.empty(0, dtype=torch.long)
        return SampledEdges(e, e, e, torch.empty(0, dtype=torch.int32) if typed else None)


def _tensor(a: np.ndarray | Tensor) -> Tensor:
    if isinstance(a, Tensor):
        return a
    arr = np.asarray(a)
    if not arr.flags.writeable:  # memory-mapped or shared read-only: torch wants writable
        return torch.from_numpy(np.array(arr))
    return torch.from_numpy(arr)


def check_seeds(seeds: Tensor | np.ndarray, lo: int, hi: int, arg: str = "seeds") -> Tensor:
    """``seeds`` as an int64 tensor, all in ``[lo, hi)``; ArgumentError naming the first bad one."""
    t = torch.as_tensor(seeds)
    if t.dim() != 1:
        raise ArgumentError(f"{arg}: expected a 1-d tensor of node ids, got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise ArgumentError(f"{arg}: expected integer node ids, got {t.dtype}")
    t = t.long()
    if t.numel():
        bad = (t < lo) | (t >= hi)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            raise ArgumentError(f"{arg}[{i}] = {int(t[i])} is out of range [{lo}, {hi})")
    return t


class CSCGraph:
    """In-edges of the owned nodes ``[row_start, row_start + num_rows)``, ready to sample."""

    def __init__(
        self,
        indptr: np.ndarray | Tensor,
        indices: np.ndarray | Tensor,
        eids: np.ndarray | Tensor,
        *,
        etypes: np.ndarray | Tensor | None = None,
        num_etypes: int = 1,
        row_start: int = 0,
        num_rows: int | None = None,
        weights: np.ndarray | Tensor | None = None,
    ) -> None:
        indptr_t = _tensor(indptr).long()
        self.num_rows = int(indptr_t.numel() - 1) if num_rows is None else int(num_rows)
        self.row_start = int(row_start)
        self.num_etypes = int(num_etypes)
        indptr_t = indptr_t[: self.num_rows + 1]  # halo rows are never seeds
        self.indptr = indptr_t
        n_e = int(indptr_t[-1])
        self.indices = _tensor(indices)[:n_e].long()
        self.eids = _tensor(eids)[:n_e].long()
        self.weights = None if weights is None else _tensor(weights)[:n_e].double()
        self.etypes: Tensor | None = None
        self.typed_indptr: Tensor | None = None
        self._out_counts: Tensor | None = None
        self._eid_sorted: Tensor | None = None
        self._eid_order: Tensor | None = None
        if self.num_etypes > 1:
            if etypes is None:
                raise ArgumentError("etypes: required when num_etypes > 1")
            self._group_by_type(_tensor(etypes)[:n_e].long())

    def _group_by_type(self, et: Tensor) -> None:
        """Sort each row's in-edges by edge type; segment ``row * R + r`` = row's type-r edges."""
        r = self.num_etypes
        row_of_edge = torch.repeat_interleave(
            torch.arange(self.num_rows), torch.diff(self.indptr), output_size=et.numel()
        )
        key = row_of_edge * r + et
        if et.numel() > 1 and bool((key[1:] < key[:-1]).any()):
            order = torch.argsort(key, stable=True)
            key = key[order]
            self.indices = self.indices[order]
            self.eids = self.eids[order]
            et = et[order]
            if self.weights is not None:
                self.weights = self.weights[order]
        counts = torch.bincount(key, minlength=self.num_rows * r)
        typed = torch.zeros(self.num_rows * r + 1, dtype=torch.long)
        torch.cumsum(counts, 0, out=typed[1:])
        self.typed_indptr = typed
        self.etypes = et.to(torch.int32)

    @classmethod
    def from_graph(cls, graph: Graph, weight: str | None = None) -> CSCGraph:
        """The whole graph as one block (rows = global node ids)."""
        indptr, indices, eids = graph.csc()
        w = None
        if weight is not None:
            w = torch.from_numpy(_edge_feature_by_eid(graph, weight)[eids])
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
        return int(self.indices.numel())

    def in_degrees(self, nodes: Tensor) -> Tensor:
        rows = check_seeds(nodes, self.row_start, self.row_start + self.num_rows, "nodes")
        rows = rows - self.row_start
        return self.indptr[rows + 1] - self.indptr[rows]

    def out_degree_counts(self, num_nodes: int) -> Tensor:
        """How many of this block's edges leave each of the ``num_nodes`` global nodes."""
        if self._out_counts is None or self._out_counts.numel() != num_nodes:
            self._out_counts = torch.bincount(self.indices, minlength=num_nodes)
        return self._out_counts

    def find_edges(self, eids: Tensor) -> tuple[Tensor, Tensor]:
        """``(src, dst)`` global node ids of edges ``eids`` owned by this block."""
        if self._eid_sorted is None:
            self._eid_sorted, self._eid_order = torch.sort(self.eids)
        assert self._eid_order is not None
        e = torch.as_tensor(eids).long()
        i = torch.searchsorted(self._eid_sorted, e).clamp_max_(max(self.num_edges - 1, 0))
        hit = self._eid_sorted[i] == e if self.num_edges else torch.zeros_like(e, dtype=torch.bool)
        if not bool(hit.all()):
            j = int(torch.nonzero(~hit)[0])
            raise ArgumentError(f"eids[{j}] = {int(e[j])} is not an edge of this partition")
        pos = self._eid_order[i]
        dst = torch.searchsorted(self.indptr, pos, right=True) - 1 + self.row_start
        return self.indices[pos], dst

    def sample_one_hop(
        self,
        seeds: Tensor,
        fanout: Tensor,
        *,
        replace: bool = False,
        weighted: bool = False,
        generator: torch.Generator,
    ) -> SampledEdges:
        """Sample in-edges of ``seeds`` (global ids owned here); ``fanout``: one per edge type."""
        rows = check_seeds(seeds, self.row_start, self.row_start + self.num_rows) - self.row_start
        if fanout.numel() != self.num_etypes:
            raise ArgumentError(
                f"fanout: expected {self.num_etypes} per-edge-type entries, got {fanout.numel()}"
            )
        if weighted and self.weights is None:
            raise ArgumentError("weighted: this graph was loaded without edge weights")
        w = self.weights if weighted else None
        if self.typed_indptr is None:
            picks = sample_segments(
                self.indptr, rows, int(fanout[0]), replace=replace, weights=w, generator=generator
            )
            seed_index = picks.which
        else:
            r = self.num_etypes
            active = torch.nonzero(fanout > 0).squeeze(1)
            if active.numel() == 0:
                return SampledEdges.empty(typed=True)
            seg = (rows.unsqueeze(1) * r + active).reshape(-1)
            k = fanout[active].repeat(rows.numel())
            picks = sample_segments(
                self.typed_indptr, seg, k, replace=replace, weights=w, generator=generator
            )
            seed_index = torch.div(picks.which, active.numel(), rounding_mode="floor")
        pos = picks.pos
        return SampledEdges(
            src=self.indices.index_select(0, pos),
            seed_index=seed_index,
            eid=self.eids.index_select(0, pos),
            etype=None if self.etypes is None else self.etypes.index_select(0, pos),
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
