"""A trainer's data served by the distributed store, through :mod:`graphrun.distributed`.

:class:`DistGraphData` wraps a :class:`~graphrun.distributed.DistGraph`:

* seeds — :func:`~graphrun.distributed.node_split` of the split's mask: every trainer gets the
  same number of ids (training: ``pad``; evaluation: ``trim``), its home partition's
  first (trainer ``r`` of ``W``: partition ``r * P // W``);
* mini-batches — :class:`~graphrun.distributed.DistNodeDataLoader` /
  :class:`~graphrun.distributed.DistLinkDataLoader`, one loader per split kept for the whole
  run (``set_epoch`` reshuffles), the training loader with ``num_workers`` sampler
  worker processes (roles ``sampler:<rank>:<w>``);
* embeddings — :class:`~graphrun.store.embedding.DistEmbedding` with the store's
  ``SparseAdam`` (state on the servers, shared by all trainers).

Batch costs: each batch carries the seconds its builder spent sampling and pulling
features and the bytes it read from each partition
(:class:`~graphrun.distributed.batches.BatchCost`, measured where it was built: in the
trainer or in a sampler worker).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from graphrun.distributed import (
    CachePlan,
    DistGraph,
    DistLinkDataLoader,
    DistNodeDataLoader,
    node_split,
    plan_feature_cache,
    trainer_partitions,
)
from graphrun.distributed import edge_split as edge_split_ids
from graphrun.distributed.split import foreign
from graphrun.errors import ArgumentError
from graphrun.names import PolicyName
from graphrun.record import FeatureCache, SamplersReady, SamplersStarting, emit
from graphrun.sampling.edgesplit import EdgeSplit, split_edges
from graphrun.sampling.fanout import ALL
from graphrun.store.client import KVClient
from graphrun.store.dist_tensor import DistTensor
from graphrun.store.embedding import DistEmbedding, SparseAdam
from graphrun.train.data import Batch, Embedding, NodeTable, SparseEmbedding, eval_sample


def costed(loader: Any, count: Any) -> Iterator[Batch]:
    """The loader's batches with what each cost to build (``loader.last_cost``)."""
    for data in loader:
        yield Batch(data, count(data), loader.last_cost)


class StoreEmbedding(SparseEmbedding):
    """A DistEmbedding and the store's SparseAdam, behind the task's Embedding protocol.

    ``num``: the rows of one table (a homogeneous graph's), or ``{ntype: rows}``: a
    table per node type (a heterograph's: ``<name>_<ntype>``, its rows the type's ids,
    ``policy=node:<ntype>``; ``emb(ids, ntype)`` looks rows up), one optimizer over them.
    """

    def __init__(
        self, client: KVClient, name: str, num: int | Mapping[str, int], dim: int, lr: float
    ) -> None:
        self.client = client
        self.tables: dict[str | None, DistEmbedding] = {}
        if isinstance(num, Mapping):  # a heterograph's: the type's ids, policy node:<ntype>
            for t, rows in num.items():
                self.tables[t] = _table(client, rows, dim, f"{name}_{t}", PolicyName.node(t))
        else:
            self.tables[None] = _table(client, num, dim, name)
        self.emb = self.tables.get(None)  # a homogeneous graph's one table
        self.opt = SparseAdam(list(self.tables.values()), lr=lr)

    def __call__(self, ids: Tensor, ntype: str | None = None) -> Tensor:
        return self.table(ntype)(ids)

    def table(self, ntype: str | None) -> DistEmbedding:
        """The DistEmbedding of ``ntype`` (None: the homogeneous one)."""
        if ntype not in self.tables:
            known = [t for t in self.tables if t is not None] or "one, of every node (None)"
            raise ArgumentError(f"ntype: no embedding table of node type {ntype!r}; "
                                f"tables: {known}")  # fmt: skip
        return self.tables[ntype]

    def state(self) -> dict[str, Any]:
        """The rows and the optimizer's state, and while the job follows a live graph
        the rows of the new nodes at its version (``new_ids``, ``new_weight``,
        ``new_optimizer``); with a table per node type, those of each under ``types``
        (``{ntype: rows}``: each its type's new nodes)."""
        new = self.client.live_nodes() if self.client.version is not None else None
        out: dict[str, Any] = {"optimizer": self.opt.state_dict()}  # SparseAdam's m, v, step
        if None in self.tables:
            return {**self._rows(None, new), **out}
        return {**out, "types": {t: self._rows(t, new) for t in self.tables if t is not None}}

    def _rows(self, ntype: str | None, new: tuple[np.ndarray, np.ndarray] | None) -> dict[str, Any]:
        """One table's rows, and its new nodes' (those of ``ntype``) with their states."""
        emb = self.tables[ntype]
        out = {"weight": emb.weight[np.arange(emb.num_embeddings, dtype=np.int64)]}
        if new is not None:
            ids, types = new
            if ntype is not None:
                ids = ids[types == self.client.book.ntype_id(ntype)]
            out["new_ids"] = torch.from_numpy(ids)
            out["new_weight"] = emb.weight[ids]
            out["new_optimizer"] = self.opt.rows(ids, of=emb)
        return out

    def load_state(self, state: dict[str, Any]) -> None:
        """Write back :meth:`state`'s; new nodes' rows need a version that has them (a
        job resumed on the same live store follows its head). A checkpoint's tables are
        this embedding's, or an ArgumentError names the first that is not (before any
        row is written)."""
        types = state.get("types")
        per: dict[str | None, Any] = {None: state} if types is None else dict(types)
        if set(per) != set(self.tables):
            ours, theirs = _names(self.tables), _names(per)
            raise ArgumentError(f"embedding: the checkpoint's tables {theirs} are not this "
                                f"job's {ours}")  # fmt: skip
        for t, rows in per.items():
            emb = self.tables[t]
            w = rows["weight"]
            emb.weight[np.arange(w.shape[0], dtype=np.int64)] = w
        if "optimizer" in state:  # checkpoints written before it was saved have none
            self.opt.load_state_dict(state["optimizer"])
        for t, rows in per.items():
            if "new_ids" in rows:
                ids = np.asarray(rows["new_ids"], np.int64)
                self.tables[t].weight[ids] = rows["new_weight"]
                self.opt.load_rows(ids, rows["new_optimizer"])


def _names(tables: Mapping[str | None, Any]) -> list[str]:
    """A message's names of tables: their node types, or one of every node's."""
    return sorted("(every node)" if t is None else t for t in tables)


def _table(
    client: KVClient, rows: int, dim: int, name: str, policy: PolicyName | None = None
) -> DistEmbedding:
    """A table of ``rows`` x ``dim`` drawn from uniform(-0.1, 0.1)."""
    args = {"low": -0.1, "high": 0.1}
    return DistEmbedding(client, rows, dim, name, policy=policy, init="uniform", init_args=args)


class DistGraphData:
    """GraphData over a running store (see the module docstring)."""

    def __init__(
        self, graph: DistGraph, rank: int, world_size: int, num_workers: int = 0, seed: int = 0,
        cache_mb: int = 0,
    ) -> None:  # fmt: skip
        self.graph = graph
        self.book = graph.partition_book
        self.rank, self.world_size = rank, world_size
        self.partition = graph.local_partition
        # partitions read from shared memory: the rest is remote (the feature cache's)
        self.local_parts = tuple(graph.ctx.client.local_parts)
        self.node_types = tuple(graph.node_types)
        self.edge_types: tuple[tuple[str, str, str], ...] = tuple(
            (e[0], e[1], e[2]) for e in graph.edge_types
        )
        self.num_workers, self.seed = num_workers, seed
        self.cache_mb = cache_mb
        self._cache: CachePlan | None = None
        self._parts = trainer_partitions(world_size, self.book.num_parts)
        self._seeds: dict[tuple[str, str | None], Tensor] = {}
        self._edges: dict[tuple[str, EdgeSplit], Tensor] = {}
        self._loaders: dict[Any, Any] = {}
        self._tables: dict[str, DistTensor] = {}

    def num_nodes(self, ntype: str | None = None) -> int:
        return self.graph.num_nodes(ntype)

    def feature_dim(self, ntype: str, name: str) -> int | None:
        t = self.graph.node_feature(ntype, name)
        return None if t is None else int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1

    def num_classes(self, ntype: str, label: str) -> int:
        t = self.graph.node_feature(ntype, label)
        if t is None:
            raise ArgumentError(f"label: node type {ntype!r} has no feature {label!r}")
        top = t.reduce("max")  # computed by the servers: no label crosses the network
        if top is None:
            raise ArgumentError(f"label: node type {ntype!r} has no nodes")
        return int(top) + 1

    def seeds(self, split: str, ntype: str | None = None) -> Tensor:
        key = (split, ntype)
        if key not in self._seeds:
            ids = self.graph.mask_ids(f"{split}_mask", ntype)
            mode: Literal["pad", "trim"] = "pad" if split == "train" else "trim"
            self._seeds[key] = node_split(
                ids, self.book, self.rank, self.world_size, ntype=ntype,
                trainer_parts=self._parts, mode=mode,
            )  # fmt: skip
        return self._seeds[key]

    def loader(
        self, split: str, ntype: str | None, fanouts: Any, batch_size: int, shuffle: bool,
        epoch: int, x: str = "feat", y: str = "label", x_bf16: bool = False,
    ) -> Iterator[Batch]:  # fmt: skip
        key = ("node", split, ntype, batch_size, shuffle, x_bf16)
        live = self.graph.follow is not None
        if key not in self._loaders:
            self._loaders[key] = DistNodeDataLoader(
                self.graph, self.seeds(split, ntype), fanouts, batch_size=batch_size,
                ntype=ntype, shuffle=shuffle, x=x, y=y, seed=self.seed + self.rank,
                num_workers=self.num_workers if split == "train" else 0,
                cache=self.feature_cache(ntype, fanouts, batch_size, x, y),
                live_seeds=f"{split}_mask" if live and split == "train" else None,
                # what the node tasks' models read: no edge ids, the seeds' labels
                edge_ids=False, labels="seeds", x_bf16=x_bf16,
                # seeds of other partitions last: one batch makes their first hop's trip
                home=self._parts[self.rank] if split == "train" and not live else None,
            )  # fmt: skip
            self._start(self._loaders[key])
        loader = self._loaders[key]
        loader.set_epoch(epoch)
        if live and split == "train":  # the new seeds join now: the epoch's steps count them
            loader.begin_epoch()
            self._seeds[(split, ntype)] = loader.ids
        t = ntype
        return costed(loader, lambda d: int(d[t].batch_size if t else d.batch_size))

    def feature_cache(
        self, ntype: str | None, fanouts: Any, batch_size: int, x: str, y: str
    ) -> CachePlan:
        """The remote features this trainer's batches reach most (planned once, from its
        training seeds, for every loader); reported as one ``feature_cache`` event line."""
        if self._cache is None:
            t0 = time.perf_counter()
            self._cache = plan_feature_cache(
                self.graph, self.seeds("train", ntype), fanouts, batch_size=batch_size,
                budget_bytes=self.cache_mb << 20, ntype=ntype, x=x, y=y,
                seed=self.seed + self.rank,
            )  # fmt: skip
            emit(FeatureCache(
                rank=self.rank, rows=self._cache.num_rows, budget_mb=self.cache_mb,
                plan_s=round(time.perf_counter() - t0, 3),
            ))  # fmt: skip
        return self._cache

    def edges(self, split: str, edge_split: EdgeSplit) -> Tensor:
        """This trainer's positive edge ids of ``split`` for link prediction: of its share
        of all edges, those ``edge_split`` puts in ``split`` (held-out splits: at most
        ``EVAL_POSITIVES``, a fixed sample)."""
        key = (split, edge_split)
        if key not in self._edges:
            mine = edge_split_ids(
                torch.arange(self.graph.num_edges()), self.book, self.rank, self.world_size,
                trainer_parts=self._parts, mode="pad",
            )  # fmt: skip
            src, dst = self.graph.find_edges(mine)
            ids = split_edges(mine, src, dst, edge_split, split, self.graph.num_nodes())
            if split != "train":
                ids = eval_sample(ids, split, self.rank)
            self._edges[key] = ids
        return self._edges[key]

    def link_loader(
        self, split: str, fanouts: Any, batch_size: int, neg_k: int, shuffle: bool,
        epoch: int, x: str, edge_split: EdgeSplit,
    ) -> Iterator[Batch]:  # fmt: skip
        key = ("link", split, batch_size, shuffle, neg_k, edge_split)
        live = self.graph.follow is not None and split == "train"
        if key not in self._loaders:
            self._loaders[key] = DistLinkDataLoader(
                self.graph, self.edges(split, edge_split), fanouts, batch_size=batch_size,
                neg_k=neg_k, edge_split=edge_split, shuffle=shuffle, x=x,
                seed=self.seed + self.rank,
                num_workers=self.num_workers if split == "train" else 0,
                live_edges=live,  # a followed live graph's new training edges join
            )  # fmt: skip
            self._start(self._loaders[key])
        loader = self._loaders[key]
        loader.set_epoch(epoch)
        if live:  # the new positives join now: the epoch's steps count them
            loader.begin_epoch()
            self._edges[(split, edge_split)] = loader.ids
        return costed(loader, lambda d: int((d.edge_label > 0).sum()))

    def _start(self, loader: Any) -> None:
        """Start ``loader`` now; its sampler worker processes, which take seconds to start
        (the fork server imports torch and PyG, each worker joins the store) before the
        first epoch's first step, are announced as ``samplers_starting`` and
        ``samplers_ready`` event lines, the second with the seconds it took (the console
        shows trainer 0's)."""
        workers = loader.options.num_workers
        if workers:
            emit(SamplersStarting(rank=self.rank, workers=workers))
        t0 = time.perf_counter()
        loader.start()
        if workers:
            emit(SamplersReady(
                rank=self.rank, workers=workers, start_s=round(time.perf_counter() - t0, 2)
            ))  # fmt: skip

    def cover(self, split: str | None, ntype: str | None = None) -> Tensor:
        t = ntype or self.node_types[0]
        key = (f"cover:{split}", t)  # computed once, like seeds: every evaluation asks
        if key not in self._seeds:
            ids = (
                torch.arange(self.graph.num_nodes(t)) if split is None
                else self.graph.mask_ids(f"{split}_mask", t)
            )  # fmt: skip
            self._seeds[key] = node_split(
                ids, self.book, self.rank, self.world_size, ntype=t,
                trainer_parts=self._parts, mode="cover",
            )  # fmt: skip
        return self._seeds[key]

    def in_edges(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        got = self.graph.sample_neighbors(ids, ALL)  # on the servers owning the nodes
        return torch.from_numpy(got.src), torch.from_numpy(got.seed_index)

    def node_table(self, ntype: str, name: str, width: int | None = None) -> NodeTable:
        if width is None:
            feat = self.graph.node_feature(ntype, name)
            if feat is None:
                raise ArgumentError(f"feature: node type {ntype!r} has no feature {name!r}")
            return feat
        # a job tensor on the store: every trainer attaches to the same one (once, not at
        # every evaluation); freed when the job's last client leaves
        key = f"scratch/{ntype}/{name}/{width}"
        if key not in self._tables:
            self._tables[key] = DistTensor(
                self.graph.ctx.client, key, shape=(self.graph.num_nodes(ntype), width),
                policy=PolicyName.node(ntype),
            )  # fmt: skip
        return self._tables[key]

    def embedding(self, name: str, num: int | Mapping[str, int], dim: int, lr: float) -> Embedding:
        """``num``: rows, or ``{ntype: rows}`` for a table per node type (StoreEmbedding)."""
        return StoreEmbedding(self.graph.ctx.client, name, num, dim, lr)

    # ---- elastic trainers (graphrun.train.elastic) ----------------------------------------

    def split_seeds(
        self, ids: Tensor, rank: int, world: int, parts: list[int], ntype: str | None
    ) -> Tensor:
        """Trainer ``rank`` of ``world``'s share of ``ids`` (home partitions ``parts``)."""
        return node_split(ids, self.book, rank, world, ntype=ntype, trainer_parts=parts, mode="pad")

    def train_orders(self, epoch: int, ntype: str | None) -> list[Tensor]:
        """Every trainer's training seeds of ``epoch`` in the order its loader deals them
        (its home partition's first: :meth:`loader`'s ``home``)."""
        from graphrun.distributed.minibatch import shuffled

        ids = self.graph.mask_ids("train_mask", ntype)
        w, parts = self.world_size, list(self._parts)
        shares = [torch.as_tensor(self.split_seeds(ids, r, w, parts, ntype)) for r in range(w)]
        return [
            shuffled(share, self.seed + r, epoch, foreign(share, self.book, parts[r], ntype))
            for r, share in enumerate(shares)
        ]

    def regroup(self, rank: int, world: int, parts: list[int]) -> None:
        """Be trainer ``rank`` of ``world`` (home partitions ``parts``) from now on: every
        split is made again for the new group (the feature cache stays)."""
        self.close()
        self.rank, self.world_size, self._parts = rank, world, list(parts)
        self._seeds.clear()
        self._edges.clear()

    def rest_loader(
        self, ids: Tensor, ntype: str | None, fanouts: Any, batch_size: int, epoch: int,
        x: str = "feat", y: str = "label", x_bf16: bool = False,
    ) -> Iterator[Batch]:  # fmt: skip
        """Mini-batches over ``ids`` in their order: the rest of an epoch after a re-form."""
        loader = DistNodeDataLoader(
            self.graph, ids, fanouts, batch_size=batch_size, ntype=ntype, shuffle=False,
            x=x, y=y, seed=self.seed + self.rank, num_workers=0, x_bf16=x_bf16,
            cache=self.feature_cache(ntype, fanouts, batch_size, x, y),
        )  # fmt: skip
        loader.start()
        loader.set_epoch(epoch)
        self._loaders[("rest", len(self._loaders))] = loader  # closed with the others
        return costed(loader, lambda d: int(d[ntype].batch_size if ntype else d.batch_size))

    def close(self) -> None:
        for loader in self._loaders.values():
            loader.close()
        self._loaders.clear()
