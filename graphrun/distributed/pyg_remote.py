"""PyG's remote-backend interfaces over graphrun's store: bring PyG loaders as they are.

    ctx = initialize(servers, rank=r, world_size=w)
    feature_store, graph_store = remote_backend(ctx)        # PyG FeatureStore, GraphStore
    sampler = RemoteNeighborSampler(graph_store, [25, 10], seed=0)
    loader = torch_geometric.loader.NeighborLoader(
        (feature_store, graph_store), [25, 10], input_nodes=train, neighbor_sampler=sampler,
        batch_size=1024, shuffle=True, num_workers=2)
    # or NodeLoader(data, node_sampler=sampler, ...), LinkNeighborLoader(data, [10],
    # edge_label_index=..., neighbor_sampler=sampler, neg_sampling_ratio=1.0), LinkLoader;
    # this module's NeighborLoader / LinkNeighborLoader (PyG's, subclassed) pass the
    # sampler themselves: NeighborLoader((feature_store, graph_store), [25, 10], ...)

The stores are in :mod:`graphrun.distributed.pyg_stores`. :class:`RemoteNeighborSampler`
is a ``BaseSampler`` running graphrun's distributed sampler; with ``seed`` the batches
equal graphrun's loaders' batch for batch (:mod:`graphrun.distributed.minibatch`),
with ``seed=None`` they are drawn from torch's generator, as PyG's are.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch_geometric import loader as pyg_loader
from torch_geometric.sampler import (
    BaseSampler,
    EdgeSamplerInput,
    HeteroSamplerOutput,
    NegativeSampling,
    NodeSamplerInput,
    SamplerOutput,
)

from graphrun.distributed.minibatch import MiniBatchSampler, NegMode, epoch_seed
from graphrun.distributed.pyg_stores import RemoteGraphStore, _node_type
from graphrun.errors import ArgumentError
from graphrun.names import CanonicalEtype
from graphrun.partition.book import PartitionBook
from graphrun.sampling.edgesplit import EdgeSplit
from graphrun.sampling.mfg import SampledSubgraph
from graphrun.sampling.pyg import split_by_type


def _as_ids(value: Tensor) -> Tensor:
    return torch.as_tensor(value).long().reshape(-1).cpu()


class RemoteNeighborSampler(BaseSampler):
    """Graphrun's distributed multi-hop sampler as a PyG ``BaseSampler``.

    ``num_neighbors``: graphrun's fanouts (a list per layer, ints or ``{etype: int}``);
    ``seed``: None draws every batch from torch's generator; an int samples each batch
    from ``(seed, epoch, its seeds)``, as graphrun's loaders do (:meth:`set_epoch`).
    Link batches: PyG's binary negative sampling with an integer ratio, drawn
    ``neg_mode`` (``uniform`` or ``degree``); ``edge_split`` keeps held-out edges out.
    """

    def __init__(
        self,
        graph_store: RemoteGraphStore,
        num_neighbors: Any,
        *,
        replace: bool = False,
        seed: int | None = None,
        neg_mode: NegMode = "uniform",
        edge_split: EdgeSplit | None = None,
    ) -> None:
        if not isinstance(graph_store, RemoteGraphStore):
            raise ArgumentError("graph_store: expected the graph store of remote_backend(ctx)")
        from graphrun.sampling.fanout import normalize_fanouts

        book = graph_store.backend.book
        normalize_fanouts(num_neighbors, list(book.edge_types))
        if neg_mode not in ("uniform", "degree"):
            raise ArgumentError(f"neg_mode: expected 'uniform' or 'degree', got {neg_mode!r}")
        self.backend = graph_store.backend
        self.num_neighbors = num_neighbors
        self.replace = replace
        self.seed = seed
        self.epoch = 0
        self.neg_mode: NegMode = neg_mode
        self.edge_split = edge_split
        self._sampler: MiniBatchSampler | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_sampler"], state["_pid"] = None, -1
        return state

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    @property
    def book(self) -> PartitionBook:
        return self.backend.book

    @property
    def is_hetero(self) -> bool:
        return bool(self.book.is_hetero)

    def _minibatch(self) -> MiniBatchSampler:
        if self._sampler is None or self._pid != os.getpid():
            ctx = self.backend.context()
            self._sampler = MiniBatchSampler(ctx, self.num_neighbors, replace=self.replace)
            self._pid = os.getpid()
        return self._sampler

    def _base(self) -> int:
        if self.seed is None:
            return int(torch.randint(0, 2**62, (1,)))
        return epoch_seed(self.seed, self.epoch)

    # ---- nodes ----------------------------------------------------------------------

    def sample_from_nodes(
        self, index: NodeSamplerInput, **kwargs: Any
    ) -> SamplerOutput | HeteroSamplerOutput:
        if index.time is not None:
            raise ArgumentError("input_time: temporal sampling is not supported")
        ntype = self._seed_type(index.input_type)
        mb = self._minibatch()
        seeds = _as_ids(index.node)
        sub = mb.nodes(mb.to_homo(ntype, seeds), self._base())
        input_id = index.input_id if index.input_id is not None else torch.arange(seeds.numel())
        return self._output(mb, sub, (input_id, None))

    def _seed_type(self, input_type: Any) -> str | None:
        if input_type is None:
            if self.is_hetero:
                raise ArgumentError(
                    f"input_nodes: a node type is needed ({list(self.book.node_types)})"
                )
            return None
        return _node_type(self.book, input_type)

    def _output(
        self, mb: MiniBatchSampler, sub: SampledSubgraph, metadata: Any
    ) -> SamplerOutput | HeteroSamplerOutput:
        if not self.is_hetero:
            return SamplerOutput(
                node=sub.node,
                row=sub.row,
                col=sub.col,
                edge=sub.edge,
                num_sampled_nodes=list(sub.num_sampled_nodes),
                num_sampled_edges=list(sub.num_sampled_edges),
                metadata=metadata,
            )
        return _hetero_output(mb, sub, metadata)

    # ---- edges ----------------------------------------------------------------------

    def sample_from_edges(
        self, index: EdgeSamplerInput, neg_sampling: NegativeSampling | None = None
    ) -> SamplerOutput | HeteroSamplerOutput:
        if index.time is not None:
            raise ArgumentError("edge_label_time: temporal sampling is not supported")
        etype = self._edge_type(index.input_type)
        neg_k = _neg_ratio(neg_sampling)
        mb = self._minibatch()
        src = mb.to_homo(etype[0] if self.is_hetero else None, _as_ids(index.row))
        dst = mb.to_homo(etype[2] if self.is_hetero else None, _as_ids(index.col))
        got = mb.links(
            src, dst, self._base(), etype, neg_k=neg_k, neg_mode=self.neg_mode,
            edge_split=self.edge_split,
        )  # fmt: skip
        label = index.label if index.label is not None else torch.ones(got.num_pos)
        if neg_sampling is not None:
            label = torch.cat([label, label.new_zeros(got.num_neg)])
        elif index.label is None:
            label = None
        label_index = got.label_index
        if self.is_hetero:
            label_index = split_by_type(got.sub, mb.types).local_in_type[label_index]
        return self._output(mb, got.sub, (index.input_id, label_index, label, None))

    def _edge_type(self, input_type: Any) -> CanonicalEtype:
        book = self.book
        if input_type is None:
            if self.is_hetero:
                raise ArgumentError("edge_label_index: an edge type is needed on a heterograph")
            return book.edge_types[0]
        return book.edge_types[book.etype_id(input_type)]


def _neg_ratio(neg: NegativeSampling | None) -> int:
    if neg is None:
        return 0
    if not neg.is_binary():
        raise ArgumentError("neg_sampling: only 'binary' negative sampling is supported")
    amount = float(neg.amount)
    if amount < 1 or amount != int(amount):
        raise ArgumentError(f"neg_sampling_ratio: expected a whole number >= 1, got {amount}")
    return int(amount)


def _hetero_output(
    mb: MiniBatchSampler, sub: SampledSubgraph, metadata: Any
) -> HeteroSamplerOutput:
    """PyG's per-type layout of ``sub`` (as :func:`graphrun.sampling.pyg.to_hetero_data`)."""
    types = mb.types
    split = split_by_type(sub, types)
    hops = len(sub.num_sampled_nodes)
    node_hop = torch.repeat_interleave(
        torch.arange(hops), torch.tensor(sub.num_sampled_nodes, dtype=torch.long)
    )
    edge_hop = torch.repeat_interleave(
        torch.arange(hops - 1), torch.tensor(sub.num_sampled_edges, dtype=torch.long)
    )
    node, n_nodes = {}, {}
    for t, name in enumerate(types.node_types):
        mask = split.node_type == t
        node[name] = split.node_per_type[mask]
        n_nodes[name] = torch.bincount(node_hop[mask], minlength=hops).tolist()
    row, col, edge, n_edges = {}, {}, {}, {}
    for r, et in enumerate(types.edge_types):
        mask = split.edge_type == r
        key = tuple(et)
        row[key] = split.local_in_type[sub.row[mask]]
        col[key] = split.local_in_type[sub.col[mask]]
        edge[key] = split.edge_per_type[mask]
        n_edges[key] = torch.bincount(edge_hop[mask], minlength=hops - 1).tolist()
    return HeteroSamplerOutput(
        node=node,
        row=row,
        col=col,
        edge=edge,
        num_sampled_nodes=n_nodes,
        num_sampled_edges=n_edges,
        metadata=metadata,
    )


def _remote_sampler(
    data: Any, num_neighbors: Any, kwargs: dict[str, Any], seed: int | None
) -> None:
    """Give PyG's loader graphrun's sampler when ``data`` is :func:`remote_backend`'s pair
    (and every node of a homogeneous graph for ``input_nodes=None``, as on a ``Data``)."""
    if not (isinstance(data, tuple | list) and len(data) == 2):
        return
    if not isinstance(data[1], RemoteGraphStore):
        return
    book = data[1].backend.book
    if "input_nodes" in kwargs and kwargs["input_nodes"] is None and not book.is_hetero:
        kwargs["input_nodes"] = torch.arange(book.num_nodes)
    if kwargs.get("neighbor_sampler") is None:
        kwargs["neighbor_sampler"] = RemoteNeighborSampler(
            data[1], num_neighbors, replace=bool(kwargs.get("replace", False)), seed=seed
        )


class NeighborLoader(pyg_loader.NeighborLoader):
    """PyG's ``NeighborLoader``; on :func:`remote_backend`'s stores it samples with
    :class:`RemoteNeighborSampler` (``seed`` as there), so ``NeighborLoader((fs, gs),
    [25, 10], input_nodes=..., batch_size=...)`` runs as written."""

    def __init__(self, data: Any, num_neighbors: Any, *args: Any, seed: int | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        _remote_sampler(data, num_neighbors, kwargs, seed)
        super().__init__(data, num_neighbors, *args, **kwargs)

    def set_epoch(self, epoch: int) -> None:
        if isinstance(self.node_sampler, RemoteNeighborSampler):
            self.node_sampler.set_epoch(epoch)


class LinkNeighborLoader(pyg_loader.LinkNeighborLoader):
    """PyG's ``LinkNeighborLoader``, with :class:`RemoteNeighborSampler` on
    :func:`remote_backend`'s stores (as :class:`NeighborLoader`)."""

    def __init__(self, data: Any, num_neighbors: Any, *args: Any, seed: int | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        _remote_sampler(data, num_neighbors, kwargs, seed)
        super().__init__(data, num_neighbors, *args, **kwargs)

    def set_epoch(self, epoch: int) -> None:
        if isinstance(self.link_sampler, RemoteNeighborSampler):
            self.link_sampler.set_epoch(epoch)


__all__: Sequence[str] = ("LinkNeighborLoader", "NeighborLoader", "RemoteNeighborSampler")
