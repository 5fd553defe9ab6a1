"""Sampled subgraphs → PyTorch Geometric mini-batches.

The output matches what PyG 2.8's ``NeighborLoader`` yields, so PyG models and
``torch_geometric.utils.trim_to_layer`` work unchanged:

* :func:`to_data` — ``Data`` with ``x``, ``y``, ``edge_index`` (``[src; dst]`` local
  ids, messages flow to the seeds), ``n_id``, ``e_id``, ``batch_size``,
  ``num_sampled_nodes``, ``num_sampled_edges`` (lists, hop by hop);
* :func:`to_hetero_data` — ``HeteroData``: per node type ``x``/``y``/``n_id`` (per-type
  ids) and ``num_sampled_nodes``; per edge type ``edge_index`` (source-type and
  destination-type local ids), ``e_id`` (per-type ids), ``num_sampled_edges``;
  ``batch_size`` on the seed type;
* :func:`to_typed_data` — the homogeneous form with type ids: a ``Data`` whose
  ``node_type``/``edge_type`` hold type ids (for RGCN-style models).

Node and edge types are resolved through a :class:`TypeMap` (global id → type id
and per-type id): :class:`OffsetTypeMap` for a whole :class:`~graphrun.graph.Graph`
where types are contiguous, the partition book's mapping in the distributed case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from graphrun.graph.graph import Graph
from graphrun.names import CanonicalEtype
from graphrun.sampling.mfg import SampledSubgraph


class TypeMap(Protocol):
    @property
    def node_types(self) -> tuple[str, ...]: ...

    @property
    def edge_types(self) -> tuple[CanonicalEtype, ...]: ...

    def nodes_per_type(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """``(type id, per-type id)`` of global node ids."""
        ...

    def edges_per_type(self, ids: Tensor, known: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(type id, per-type id)`` of global edge ids; ``known``: their type ids where
        the caller has them (a sampler's answer), so that none is asked of a store (a
        live graph's new edges: distributed/live.py)."""
        ...


@dataclass(frozen=True)
class OffsetTypeMap:
    """Types stored as contiguous global id ranges (a :class:`Graph`'s layout)."""

    node_types: tuple[str, ...]
    edge_types: tuple[CanonicalEtype, ...]
    node_offsets: Tensor
    edge_offsets: Tensor

    @classmethod
    def from_graph(cls, graph: Graph) -> OffsetTypeMap:
        assert graph.node_type_offsets is not None and graph.edge_type_offsets is not None
        return cls(
            tuple(graph.node_types),
            tuple(graph.edge_types),
            torch.from_numpy(graph.node_type_offsets.copy()),
            torch.from_numpy(graph.edge_type_offsets.copy()),
        )

    @staticmethod
    def _split(offsets: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
        t = torch.searchsorted(offsets, ids, right=True) - 1
        return t, ids - offsets[t]

    def nodes_per_type(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        return self._split(self.node_offsets, ids)

    def edges_per_type(self, ids: Tensor, known: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._split(self.edge_offsets, ids)


def to_data(
    sub: SampledSubgraph,
    x: Tensor | None = None,
    y: Tensor | None = None,
    edge_attr: Tensor | None = None,
    **extra: Tensor,
) -> Data:
    """A homogeneous ``Data`` mini-batch (features already gathered for ``sub.node``)."""
    data = Data(
        edge_index=sub.edge_index(),
        n_id=sub.node,
        e_id=sub.edge,
        num_nodes=int(sub.node.numel()),
    )
    if x is not None:
        data.x = x
    if y is not None:
        data.y = y
    if edge_attr is not None:
        data.edge_attr = edge_attr
    data.batch_size = sub.batch_size
    data.num_sampled_nodes = list(sub.num_sampled_nodes)
    data.num_sampled_edges = list(sub.num_sampled_edges)
    for k, v in extra.items():
        data[k] = v
    return data


def _hop_of(counts: Sequence[int]) -> Tensor:
    return torch.repeat_interleave(
        torch.arange(len(counts)), torch.tensor(counts, dtype=torch.long)
    )


def _hop_counts(hop: Tensor, type_ids: Tensor, num_types: int, num_hops: int) -> Tensor:
    """``[num_types, num_hops]`` counts of (type, hop) pairs."""
    flat = torch.bincount(type_ids * num_hops + hop, minlength=num_types * num_hops)
    return flat.view(num_types, num_hops)


@dataclass(frozen=True)
class TypedSplit:
    """Per-type view of a sampled subgraph: local index of every node within its type."""

    node_type: Tensor
    node_per_type: Tensor
    local_in_type: Tensor
    edge_type: Tensor
    edge_per_type: Tensor


def split_by_type(sub: SampledSubgraph, types: TypeMap) -> TypedSplit:
    nt, npt = types.nodes_per_type(sub.node)
    order = torch.argsort(nt, stable=True)
    counts = torch.bincount(nt, minlength=len(types.node_types))
    starts = torch.cumsum(counts, 0) - counts
    local = torch.empty_like(order)
    local[order] = torch.arange(order.numel()) - starts[nt[order]]
    known = None if sub.edge_type is None else sub.edge_type.long()
    et, ept = types.edges_per_type(sub.edge, known)
    if known is not None:
        et = known
    return TypedSplit(nt, npt, local, et, ept)


def to_typed_data(sub: SampledSubgraph, types: TypeMap, **features: Tensor) -> Data:
    """The homogeneous form with ``node_type``/``edge_type`` ids (and per-type ids)."""
    split = split_by_type(sub, types)
    return to_data(
        sub,
        node_type=split.node_type,
        edge_type=split.edge_type,
        n_id_per_type=split.node_per_type,
        e_id_per_type=split.edge_per_type,
        **features,
    )


def to_hetero_data(
    sub: SampledSubgraph,
    types: TypeMap,
    x: Mapping[str, Tensor] | None = None,
    y: Mapping[str, Tensor] | None = None,
    split: TypedSplit | None = None,
) -> HeteroData:
    """A ``HeteroData`` mini-batch; ``x``/``y`` map node type → rows for ``n_id`` of that type."""
    split = split or split_by_type(sub, types)
    hops = len(sub.num_sampled_nodes)
    node_hop = _hop_of(sub.num_sampled_nodes)
    n_counts = _hop_counts(node_hop, split.node_type, len(types.node_types), hops)
    e_hop = _hop_of(sub.num_sampled_edges)
    e_counts = _hop_counts(e_hop, split.edge_type, len(types.edge_types), hops - 1)
    data = HeteroData()
    for t, name in enumerate(types.node_types):
        mask = split.node_type == t
        store = data[name]
        store.n_id = split.node_per_type[mask]
        store.num_nodes = int(store.n_id.numel())
        store.num_sampled_nodes = n_counts[t].tolist()
        if x is not None and name in x:
            store.x = x[name]
        if y is not None and name in y:
            store.y = y[name]
    for r, et in enumerate(types.edge_types):
        mask = split.edge_type == r
        store = data[et]
        src = split.local_in_type[sub.row[mask]]
        dst = split.local_in_type[sub.col[mask]]
        store.edge_index = torch.stack([src, dst])
        store.e_id = split.edge_per_type[mask]
        store.num_sampled_edges = e_counts[r].tolist()
    if sub.batch_size:
        seed_type = types.node_types[int(split.node_type[0])]
        data[seed_type].batch_size = sub.batch_size
    return data
