"""``DistNodeDataLoader`` / ``DistLinkDataLoader``: PyG mini-batches from the store.

    ctx = initialize(servers, rank=r, world_size=w)
    g = DistGraph(ctx)
    train = node_split(g.mask_ids("train_mask"), g.book, r, w)
    loader = DistNodeDataLoader(g, train, [25, 10], batch_size=1000, shuffle=True,
                                num_workers=2)
    for epoch in range(n):
        loader.set_epoch(epoch)
        for batch in loader:          # torch_geometric Data (HeteroData on heterographs)
            out = model(batch.x, batch.edge_index)[: batch.batch_size]

Composition: a loader holds a :class:`~graphrun.distributed.batches.BatchSpec` and either
builds batches in this process (``num_workers=0``) or hands them to a
:class:`~graphrun.distributed.workers.WorkerPool` with a prefetch window (``prefetch``
batches in all, or torch's ``prefetch_factor`` per worker). As torch's loaders:
``persistent_workers`` (default True here: a worker joins the store once),
``pin_memory`` (when CUDA is there); iterating again starts a new epoch's run, and
breaking out, dropping the iterator or :meth:`close` leave no worker behind (a
persistent pool stops at ``close``, ``with`` or garbage collection). The order of
seeds per epoch and every batch's sampling seed derive from ``(seed, epoch,
index)``, so results do not depend on the number of workers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from graphrun.distributed.batches import (
    BatchBuilder,
    BatchCost,
    BatchSpec,
    Kind,
    check_spec,
)
from graphrun.distributed.cache import CachePlan, plan_cache
from graphrun.distributed.dglnames import NeighborSampler as NeighborSamplerSpec
from graphrun.distributed.graph import DistGraph
from graphrun.distributed.minibatch import epoch_seed, shuffled
from graphrun.distributed.workers import WorkerPool
from graphrun.errors import ArgumentError
from graphrun.names import TensorKey
from graphrun.sampling.edgesplit import EdgeSplit
from graphrun.sampling.partitioned import BookTypeMap
from graphrun.sampling.sampler import NeighborSampler, Output


def _check_count(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ArgumentError(f"{name}: expected an int >= {low}, got {value!r}")
    return value


class _DistLoader:
    def __init__(
        self,
        graph: DistGraph,
        ids: Any,
        spec: BatchSpec,
        *,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        num_workers: int,
        prefetch: int,
        seed: int,
        persistent_workers: bool = True,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
    ) -> None:
        self.graph = graph
        self.spec = spec
        check_spec(spec, graph.book)
        self.ids = torch.as_tensor(ids).long().reshape(-1)
        self.batch_size = _check_count(batch_size, "batch_size", 1)
        self.num_workers = _check_count(num_workers, "num_workers", 0)
        self.prefetch = _check_count(prefetch, "prefetch", 1)
        if prefetch_factor is not None:
            if self.num_workers == 0:
                raise ArgumentError("prefetch_factor: only with num_workers > 0 (as in torch)")
            self.prefetch = _check_count(prefetch_factor, "prefetch_factor", 1) * num_workers
        self.persistent_workers = bool(persistent_workers)
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = int(seed)
        self.epoch = 0
        self._builder: BatchBuilder | None = None
        self._pool: WorkerPool | None = None
        self.last_cost = BatchCost()  # of the batch yielded last

    def __len__(self) -> int:
        n = self.ids.numel()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _tasks(self) -> list[tuple[Tensor, int]]:
        order = shuffled(self.ids, self.seed, self.epoch) if self.shuffle else self.ids
        base = epoch_seed(self.seed, self.epoch)
        return [
            (order[i * self.batch_size : (i + 1) * self.batch_size], base) for i in range(len(self))
        ]

    def start(self) -> None:
        """Build the batch builder, or start the sampler worker processes, now rather than
        on the first iteration (a trainer does it before its first epoch's clock starts)."""
        if self.num_workers == 0:
            if self._builder is None:
                self._builder = BatchBuilder(self.graph.ctx, self.spec)
        elif self._pool is None:
            self._pool = WorkerPool(self.graph.ctx.config, self.spec, self.num_workers)

    def __iter__(self) -> Iterator[Data | HeteroData]:
        """One epoch's batches. Without ``persistent_workers`` the worker processes stop
        when the iteration ends, is broken out of or is dropped; with it (the default:
        a worker joins the store, which is worth doing once) at :meth:`close`."""
        tasks = self._tasks()
        self.start()
        if self._builder is not None:
            for ids, s in tasks:
                batch = self._builder.build(ids, s)
                self.last_cost = self._builder.last_cost
                yield self._pinned(batch)
            return
        assert self._pool is not None
        try:
            for batch, cost in self._pool.run(tasks, self.prefetch):
                self.last_cost = cost
                yield self._pinned(batch)
        finally:
            if not self.persistent_workers:
                self.close()

    def _pinned(self, batch: Data | HeteroData) -> Data | HeteroData:
        return batch.pin_memory() if self.pin_memory else batch

    @property
    def worker_pids(self) -> list[int | None]:
        return self._pool.pids if self._pool else []

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> _DistLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _fanouts(fanouts: Any, replace: bool) -> tuple[Any, bool]:
    """Fanouts per hop, or DistDGL's ``NeighborSampler(fanouts)`` (per layer, reversed)."""
    if isinstance(fanouts, NeighborSamplerSpec):
        return fanouts.hops, fanouts.replace or replace
    return fanouts, replace


def _dgl_triple(batch: Data | HeteroData, ntype: str | None) -> tuple[Any, Any, list[Any]]:
    """DistDGL's ``(input_nodes, seeds, blocks)`` of a batch; ``blocks`` = ``[batch]``."""
    if isinstance(batch, HeteroData):
        assert ntype is not None
        size = int(batch[ntype].batch_size)
        inputs = {t: batch[t].n_id for t in batch.node_types}
        return inputs, {ntype: batch[ntype].n_id[:size]}, [batch]
    return batch.n_id, batch.n_id[: batch.batch_size], [batch]


def _output(graph: DistGraph, output: Output | None) -> Output:
    return output or ("hetero" if graph.is_hetero else "data")


class DistNodeDataLoader(_DistLoader):
    """Mini-batches around seed nodes (per-type ids of ``ntype`` on a heterograph).

    ``fanouts``: per hop (the hop next to the seeds first), or DistDGL's
    ``NeighborSampler(fanouts)`` (per model layer, input layer first), which also makes
    the loader yield DistDGL's ``(input_nodes, seeds, blocks)``."""

    def __init__(
        self,
        graph: DistGraph,
        nodes: Any,
        fanouts: Any,
        *,
        batch_size: int,
        ntype: str | None = None,
        shuffle: bool = False,
        drop_last: bool = False,
        num_workers: int = 0,
        prefetch: int = 2,
        persistent_workers: bool = True,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        output: Output | None = None,
        x: str = "feat",
        y: str = "label",
        replace: bool = False,
        num_layers: int | None = None,
        seed: int = 0,
        cache: CachePlan | None = None,
    ) -> None:
        if ntype is None and graph.is_hetero:
            raise ArgumentError(f"ntype: required on a heterograph ({list(graph.node_types)})")
        self.dgl_style = isinstance(fanouts, NeighborSamplerSpec)
        fanouts, replace = _fanouts(fanouts, replace)
        spec = BatchSpec(
            kind="node",
            fanouts=fanouts,
            output=_output(graph, output),
            ntype=ntype,
            x=x,
            y=y,
            replace=replace,
            num_layers=num_layers,
            cache=cache if cache is not None and cache.num_rows else None,
        )
        super().__init__(
            graph,
            nodes,
            spec,
            batch_size=batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            num_workers=num_workers,
            prefetch=prefetch,
            seed=seed,
            persistent_workers=persistent_workers,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor,
        )

    def __iter__(self) -> Iterator[Any]:
        """PyG batches; DistDGL's ``(input_nodes, seeds, blocks)`` when the loader was
        given a ``NeighborSampler`` (see :class:`~graphrun.distributed.NeighborSampler`)."""
        for batch in super().__iter__():
            yield _dgl_triple(batch, self.spec.ntype) if self.dgl_style else batch


class DistLinkDataLoader(_DistLoader):
    """Mini-batches around positive edges (per-type ids of ``etype``) plus negatives.

    Each batch carries ``edge_label_index`` (local ids; positives first) and
    ``edge_label`` (1 positive, 0 negative); ``neg_k`` negatives per positive,
    ``neg_mode`` ``"uniform"`` or ``"degree"`` (∝ in-degree ** 0.75). With ``edge_split``
    no held-out edge and no edge joining a positive pair carries messages.
    """

    def __init__(
        self,
        graph: DistGraph,
        edges: Any,
        fanouts: Any,
        *,
        batch_size: int,
        etype: tuple[str, str, str] | str | None = None,
        neg_k: int = 1,
        neg_mode: Literal["uniform", "degree"] = "uniform",
        edge_split: EdgeSplit | None = None,
        shuffle: bool = False,
        drop_last: bool = False,
        num_workers: int = 0,
        prefetch: int = 2,
        persistent_workers: bool = True,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        output: Output | None = None,
        x: str = "feat",
        y: str = "label",
        replace: bool = False,
        num_layers: int | None = None,
        seed: int = 0,
        cache: CachePlan | None = None,
    ) -> None:
        if etype is None and graph.is_hetero:
            raise ArgumentError("etype: required on a heterograph")
        canonical = None
        if etype is not None:
            canonical = tuple(graph.book.edge_types[graph.book.etype_id(etype)])
        _check_count(neg_k, "neg_k", 1)
        fanouts, replace = _fanouts(fanouts, replace)
        kind: Kind = "link"
        spec = BatchSpec(
            kind=kind,
            fanouts=fanouts,
            output=_output(graph, output),
            etype=canonical,  # type: ignore[arg-type]
            x=x,
            y=y,
            replace=replace,
            num_layers=num_layers,
            neg_k=neg_k,
            neg_mode=neg_mode,
            edge_split=edge_split,
            cache=cache if cache is not None and cache.num_rows else None,
        )
        super().__init__(
            graph,
            edges,
            spec,
            batch_size=batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            num_workers=num_workers,
            prefetch=prefetch,
            seed=seed,
            persistent_workers=persistent_workers,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor,
        )


DistEdgeDataLoader = DistLinkDataLoader  # DistDGL's name


def plan_feature_cache(
    graph: DistGraph,
    nodes: Any,
    fanouts: Any,
    *,
    batch_size: int,
    budget_bytes: int,
    ntype: str | None = None,
    x: str = "feat",
    y: str = "label",
    probes: int = 4,
    seed: int = 0,
) -> CachePlan:
    """Which remote node features to cache for mini-batches around ``nodes`` (per-type
    ids of ``ntype``): see :func:`graphrun.distributed.cache.plan_cache`. Pass the plan as
    ``cache=`` to every loader of the trainer; they share one copy per process."""
    book = graph.book
    spec = BatchSpec(kind="node", fanouts=fanouts, output="data", ntype=ntype, x=x, y=y)
    check_spec(spec, book)
    sampler = NeighborSampler(graph.ctx.sampler, BookTypeMap(book), book.num_nodes, fanouts)
    ids = torch.as_tensor(nodes).long().reshape(-1)
    if ntype is not None:
        ids = torch.from_numpy(book.to_homo(ntype, ids.numpy()))
    client = graph.ctx.client
    names = {t.name for t in client.list_tensors()}
    row_bytes = {}
    for nt in book.node_types:
        keys = [str(TensorKey.node(nt, name)) for name in (x, y)]
        if keys[0] in names:  # a type without the feature is not worth caching
            row_bytes[nt] = sum(client.meta(k).row_bytes for k in keys if k in names)
    halo = np.zeros(book.num_nodes, np.int64)
    for csc in graph.ctx.sampler.local.values():  # in-edges of the co-located partitions
        halo += np.bincount(csc.indices, minlength=book.num_nodes)
    return plan_cache(
        sampler, book, client.local_parts, ids, batch_size, budget_bytes, row_bytes, probes,
        seed, halo,
    )  # fmt: skip
