"""Where a trainer's mini-batches come from: the :class:`GraphData` protocol.

A task asks its :class:`GraphData` for this trainer's seeds of a split, a loader of
PyG mini-batches over seeds, node-embedding tables and the graph's shape; it never
knows whether the graph is in this process or served by the distributed store.

* :class:`LocalData` — a whole in-memory :class:`~graphrun.graph.Graph`, sampled with
  :mod:`graphrun.sampling`'s kernels (single-process runs, baselines, tests; with
  several trainers each takes every ``world_size``-th seed);
* the distributed implementation over ``graphrun.distributed`` lives in
  :mod:`graphrun.train.distdata`.

Every loader yields :class:`Batch` values: the PyG mini-batch and its
:class:`~graphrun.placement.profile.BatchCost` — how long sampling
and feature fetching took and how many bytes came from each partition (for the
per-batch profile records of :mod:`graphrun.placement.profile`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError
from graphrun.graph import Graph
from graphrun.placement.profile import BatchCost
from graphrun.sampling.edgesplit import EdgeSplit, split_edges

if TYPE_CHECKING:
    from torch_geometric.data import Data, HeteroData

    from graphrun.sampling.mfg import SampledSubgraph
    from graphrun.sampling.sampler import NeighborSampler


@dataclass
class Batch:
    data: Any  # torch_geometric Data or HeteroData
    seeds: int
    cost: BatchCost = field(default_factory=BatchCost)  # what building it cost


class Embedding(Protocol):
    """Learnable node embeddings with their own (sparse) optimizer."""

    def __call__(self, ids: Tensor) -> Tensor: ...
    def step(self) -> None: ...
    def zero_grad(self) -> None: ...
    def state(self) -> dict[str, Any]: ...
    def load_state(self, state: dict[str, Any]) -> None: ...


class NodeTable(Protocol):
    """Rows of a node table by per-type id: ``t[ids]`` reads them, ``t[ids] = rows``
    writes them (a torch tensor or a store :class:`~graphrun.store.dist_tensor.DistTensor`)."""

    def __getitem__(self, ids: Tensor) -> Tensor: ...
    def __setitem__(self, ids: Tensor, rows: Tensor) -> None: ...


class GraphData(Protocol):
    rank: int
    world_size: int
    partition: int
    node_types: tuple[str, ...]
    edge_types: tuple[tuple[str, str, str], ...]

    def num_nodes(self, ntype: str | None = None) -> int: ...
    def feature_dim(self, ntype: str, name: str) -> int | None: ...
    def num_classes(self, ntype: str, label: str) -> int: ...
    def seeds(self, split: str, ntype: str | None = None) -> Tensor:
        """This trainer's seeds (per-type ids of ``ntype``) of ``train``/``val``/``test``."""
        ...

    def loader(
        self,
        split: str,
        ntype: str | None,
        fanouts: Any,
        batch_size: int,
        shuffle: bool,
        epoch: int,
        x: str,
        y: str,
        x_bf16: bool = False,
    ) -> Iterator[Batch]:
        """Mini-batches over this trainer's seeds of ``split`` (``seeds(split, ntype)``);
        ``x_bf16``: a float32 ``x`` comes in bf16 (the values of ``x.to(torch.bfloat16)``),
        converted as the fetch copies the rows."""
        ...  # fmt: skip

    def edges(self, split: str, edge_split: EdgeSplit) -> Tensor:
        """This trainer's positive edge ids of ``split`` for link prediction."""
        ...

    def link_loader(
        self,
        split: str,
        fanouts: Any,
        batch_size: int,
        neg_k: int,
        shuffle: bool,
        epoch: int,
        x: str,
        edge_split: EdgeSplit,
    ) -> Iterator[Batch]:
        """Mini-batches around ``edges(split)`` plus ``neg_k`` negatives per positive, with
        ``edge_label_index`` (local ids, positives first) and ``edge_label`` (1 / 0), as
        PyG's ``LinkNeighborLoader`` (binary) and :class:`graphrun.distributed.DistLinkDataLoader`;
        no held-out edge and no edge joining a positive pair carries messages."""
        ...  # fmt: skip

    def embedding(self, name: str, num: int, dim: int, lr: float) -> Embedding: ...

    # layer-wise inference (homogeneous graphs), :mod:`graphrun.train.inference`
    def cover(self, split: str | None, ntype: str | None = None) -> Tensor:
        """This trainer's share of the nodes of ``split`` (of every node for None): over
        all trainers each node exactly once, the home partition's first."""
        ...

    def in_edges(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Every in-edge of the nodes ``ids``: ``(src, index)``, edge ``j`` running from
        ``src[j]`` to ``ids[index[j]]``, grouped by ``index``."""
        ...

    def node_table(self, ntype: str, name: str, width: int | None = None) -> NodeTable:
        """The node feature ``name``; with ``width``, a float32 scratch table of that many
        columns by ``name``, one row per node, shared by every trainer that asks for
        it (its rows start at zero)."""
        ...


EVAL_POSITIVES = 2048  # held-out positives a trainer evaluates (a fixed sample)


def _cost(t0: float, t1: float) -> BatchCost:
    """Sampling from ``t0`` to ``t1``, fetching features from ``t1`` to now."""
    return BatchCost(sample_s=t1 - t0, fetch_s=time.perf_counter() - t1)


def eval_sample(ids: Tensor, split: str, rank: int) -> Tensor:
    """At most ``EVAL_POSITIVES`` of ``ids``: the same sample every epoch."""
    if ids.numel() <= EVAL_POSITIVES:
        return ids
    g = torch.Generator().manual_seed({"val": 1, "test": 2}.get(split, 3) * 7919 + rank)
    return ids[torch.randperm(ids.numel(), generator=g)[:EVAL_POSITIVES].sort().values]


def split_for_rank(ids: Tensor, rank: int, world_size: int) -> Tensor:
    """Every ``world_size``-th id starting at ``rank``: equal shares up to one."""
    return ids[rank::world_size]


class SparseEmbedding:
    """An embedding table ``emb`` and its sparse optimizer ``opt``: the calls the task
    makes (the two implementations differ in where the rows live and how state is saved)."""

    emb: Any
    opt: Any

    def __call__(self, ids: Tensor) -> Tensor:
        out: Tensor = self.emb(ids)
        return out

    def step(self) -> None:
        self.opt.step()

    def zero_grad(self) -> None:
        self.opt.zero_grad()


class LocalEmbedding(SparseEmbedding):
    """``torch.nn.Embedding(sparse=True)`` trained with ``SparseAdam``."""

    def __init__(self, num: int, dim: int, lr: float, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Embedding(num, dim, sparse=True)
        with torch.no_grad():
            self.emb.weight.copy_(torch.randn(num, dim, generator=gen) * 0.1)
        self.opt = torch.optim.SparseAdam(list(self.emb.parameters()), lr=lr)

    def state(self) -> dict[str, Any]:
        return {"weight": self.emb.weight.detach().clone(), "optimizer": self.opt.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.emb.weight.copy_(state["weight"])
        self.opt.load_state_dict(state["optimizer"])


class ArrayRows:
    """A (memory-mapped) numpy array read as a node table: ``t[ids]`` copies those rows."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    def __getitem__(self, ids: Tensor) -> Tensor:
        return torch.from_numpy(np.take(self.arr, ids.numpy(), axis=0))

    def __setitem__(self, ids: Tensor, rows: Tensor) -> None:
        raise ArgumentError("node table: the graph's own features are read-only")


class LocalData:
    """A whole in-memory graph as a trainer's data source."""

    def __init__(self, graph: Graph, rank: int = 0, world_size: int = 1, seed: int = 0) -> None:
        from graphrun.sampling.csc import CSCGraph
        from graphrun.sampling.pyg import OffsetTypeMap
        from graphrun.sampling.sampler import GraphFeatures

        self.graph = graph
        self.rank, self.world_size, self.partition = rank, world_size, 0
        self.node_types = tuple(graph.node_types)
        self.edge_types = tuple(graph.edge_types)
        self.seed = seed
        self._csc = CSCGraph.from_graph(graph)
        self._types: Any = OffsetTypeMap.from_graph(graph)  # a sampling.pyg.TypeMap
        self._features = GraphFeatures(graph)
        self._bf16: GraphFeatures | None = None  # x in bf16 (x_bf16), made when asked
        self._tables: dict[tuple[str, str], Tensor] = {}

    def _ntype(self, ntype: str | None) -> str:
        return ntype if ntype is not None else self.node_types[0]

    def num_nodes(self, ntype: str | None = None) -> int:
        return self.graph.num_nodes if ntype is None else self.graph.num_nodes_of(ntype)

    def feature_dim(self, ntype: str, name: str) -> int | None:
        arr = self.graph.ndata.get(ntype, {}).get(name)
        return None if arr is None else int(np.prod(arr.shape[1:]) if arr.ndim > 1 else 1)

    def num_classes(self, ntype: str, label: str) -> int:
        arr = self.graph.ndata.get(ntype, {}).get(label)
        if arr is None:
            raise ArgumentError(f"label: node type {ntype!r} has no feature {label!r}")
        return int(np.max(arr)) + 1

    def seeds(self, split: str, ntype: str | None = None) -> Tensor:
        t = self._ntype(ntype)
        mask = self.graph.ndata.get(t, {}).get(f"{split}_mask")
        if mask is None:
            raise ArgumentError(f"split: node type {t!r} has no {split}_mask")
        ids = torch.from_numpy(np.flatnonzero(np.asarray(mask)).astype(np.int64))
        return split_for_rank(ids, self.rank, self.world_size)

    def _sampler(self, fanouts: Any, gen_seed: int, edge_ids: bool = True) -> NeighborSampler:
        from graphrun.sampling.sampler import NeighborSampler

        # each hop's nodes as its edges first read them: layer 0's mean then reads the
        # batch's features nearly in order (graphrun.sampling.mfg.Relabeler)
        csc = self._csc if edge_ids else self._csc.without_edge_ids()
        return NeighborSampler(
            csc, self._types, self.graph.num_nodes, fanouts, generator=gen_seed, order="first"
        )

    def _collate(
        self, sub: SampledSubgraph, x: str, y: str, x_bf16: bool = False
    ) -> Data | HeteroData:
        from graphrun.sampling.sampler import GraphFeatures, collate

        output: Literal["hetero", "data"] = "hetero" if self.graph.is_hetero else "data"
        features = self._features
        if x_bf16:
            if self._bf16 is None or self._bf16.bf16 != x:
                self._bf16 = GraphFeatures(self.graph, bf16=x)
            features = self._bf16
        return collate(sub, self._types, features, output=output, x=x, y=y)

    def _order(self, ids: Tensor, shuffle: bool, gen_seed: int) -> Tensor:
        if not shuffle:
            return ids
        g = torch.Generator().manual_seed(gen_seed)
        return ids[torch.randperm(ids.numel(), generator=g)]

    def loader(
        self, split: str, ntype: str | None, fanouts: Any, batch_size: int, shuffle: bool,
        epoch: int, x: str = "feat", y: str = "label", x_bf16: bool = False,
    ) -> Iterator[Batch]:  # fmt: skip
        gen_seed = self.seed * 1_000_003 + epoch * 101 + self.rank
        # a homogeneous graph's node batches without ``e_id``, as DistData's: what the node
        # tasks' models read, and the gather of each edge's id is an eighth of the sampling
        homo = not self.graph.is_hetero
        sampler = self._sampler(fanouts, gen_seed, edge_ids=not homo)
        order = self._order(self.seeds(split, ntype), shuffle, gen_seed)
        offset = 0
        if self.graph.is_hetero:
            nto = self.graph.node_type_offsets
            assert nto is not None
            offset = int(nto[self.node_types.index(self._ntype(ntype))])
        for i in range(0, order.numel(), batch_size):
            chunk = order[i : i + batch_size]
            t0 = time.perf_counter()
            sub = sampler.sample(chunk + offset)
            t1 = time.perf_counter()
            data = self._collate(sub, x, y, x_bf16)
            if homo:
                del data.e_id  # NO_EDGE_ID each
            yield Batch(data, int(chunk.numel()), _cost(t0, t1))

    def cover(self, split: str | None, ntype: str | None = None) -> Tensor:
        """A split's share as :meth:`seeds`; every node for None (the scratch tables of
        :meth:`node_table` are private to this process, so each trainer computes them
        whole)."""
        if split is not None:
            return self.seeds(split, ntype)
        return torch.arange(self.num_nodes(self._ntype(ntype)))

    def in_edges(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        from graphrun.sampling.fanout import ALL

        out = self._csc.sample_one_hop(ids, [ALL] * self._csc.num_etypes, seed=0)
        return torch.from_numpy(out.src), torch.from_numpy(out.seed_index)

    def node_table(self, ntype: str, name: str, width: int | None = None) -> NodeTable:
        if width is None:
            arr = self.graph.ndata.get(ntype, {}).get(name)
            if arr is None:
                raise ArgumentError(f"feature: node type {ntype!r} has no feature {name!r}")
            return ArrayRows(arr)
        key = (ntype, name)
        table = self._tables.get(key)
        if table is None or table.size(1) != width:
            table = self._tables[key] = torch.zeros(self.num_nodes(ntype), width)
        return table

    def edges(self, split: str, edge_split: EdgeSplit) -> Tensor:
        src = torch.from_numpy(np.asarray(self.graph.src))
        dst = torch.from_numpy(np.asarray(self.graph.dst))
        ids = split_edges(
            torch.arange(self.graph.num_edges), src, dst, edge_split, split, self.graph.num_nodes
        )
        mine = split_for_rank(ids, self.rank, self.world_size)
        return mine if split == "train" else eval_sample(mine, split, self.rank)

    def link_loader(
        self, split: str, fanouts: Any, batch_size: int, neg_k: int, shuffle: bool,
        epoch: int, x: str, edge_split: EdgeSplit,
    ) -> Iterator[Batch]:  # fmt: skip
        from graphrun.sampling.negative import NegativeSampler

        gen_seed = self.seed * 7919 + epoch * 31 + self.rank
        sampler = self._sampler(fanouts, gen_seed)
        negatives = NegativeSampler(self.graph.num_nodes, neg_k)
        gen = torch.Generator().manual_seed(gen_seed)
        order = self._order(self.edges(split, edge_split), shuffle, gen_seed)
        src_all = torch.from_numpy(np.asarray(self.graph.src))
        dst_all = torch.from_numpy(np.asarray(self.graph.dst))
        for i in range(0, order.numel(), batch_size):
            eids = order[i : i + batch_size]
            t0 = time.perf_counter()
            src, dst = src_all[eids], dst_all[eids]
            neg_src, neg_dst = negatives.sample(src, gen)
            nodes, inverse = torch.unique(
                torch.cat([src, neg_src, dst, neg_dst]), return_inverse=True
            )
            sub = edge_split.exclude(sampler.sample(nodes), src, dst, self.graph.num_nodes)
            t1 = time.perf_counter()
            data = self._collate(sub, x, "label")
            m = src.numel() + neg_src.numel()
            data.edge_label_index = torch.stack([inverse[:m], inverse[m:]])
            data.edge_label = torch.cat([torch.ones(src.numel()), torch.zeros(neg_src.numel())])
            yield Batch(data, int(src.numel()), _cost(t0, t1))

    def embedding(self, name: str, num: int, dim: int, lr: float) -> Embedding:
        return LocalEmbedding(num, dim, lr, self.seed)
