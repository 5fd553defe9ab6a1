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
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from graphrun.distributed.batches import (
    BatchBuilder,
    BatchCost,
    BatchSpec,
    check_spec,
)
from graphrun.distributed.cache import CachePlan, plan_cache
from graphrun.distributed.dglnames import NeighborSampler as NeighborSamplerSpec
from graphrun.distributed.graph import DistGraph
from graphrun.distributed.live import id_bound, new_positives, new_seeds, to_homo, type_map
from graphrun.distributed.minibatch import epoch_seed, shuffled
from graphrun.distributed.split import foreign
from graphrun.distributed.workers import WorkerPool
from graphrun.errors import ArgumentError
from graphrun.names import TensorKey
from graphrun.sampling.edgesplit import TRAIN
from graphrun.sampling.sampler import NeighborSampler


def _check_count(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ArgumentError(f"{name}: expected an int >= {low}, got {value!r}")
    return value


@dataclass(frozen=True)
class LoaderOptions:
    """How a loader walks its seeds: torch ``DataLoader``'s options, and graphrun's
    ``prefetch`` (batches in flight in all) and ``seed`` (of the shuffle and of every
    batch's sampling). ``home``: the trainer's home partition; with ``shuffle`` the
    seeds it does not own are dealt last, together (:func:`shuffled`), so the batches
    before them sample their first hop without a round trip to another machine."""

    batch_size: int
    shuffle: bool = False
    drop_last: bool = False
    num_workers: int = 0
    prefetch: int = 2
    persistent_workers: bool = True
    pin_memory: bool = False
    prefetch_factor: int | None = None  # batches in flight per worker (torch's)
    seed: int = 0
    live_seeds: str | None = None  # a followed live graph: new nodes with this mask join
    live_edges: bool = False  # a followed live graph: new edges of a link loader's etype join
    home: int | None = None

    def __post_init__(self) -> None:
        _check_count(self.batch_size, "batch_size", 1)
        _check_count(self.num_workers, "num_workers", 0)
        _check_count(self.prefetch, "prefetch", 1)
        if self.prefetch_factor is not None:
            if self.num_workers == 0:
                raise ArgumentError("prefetch_factor: only with num_workers > 0 (as in torch)")
            _check_count(self.prefetch_factor, "prefetch_factor", 1)
        if self.home is not None:
            _check_count(self.home, "home", 0)
            if self.live_seeds is not None or self.live_edges:
                raise ArgumentError("home: not with live_seeds or live_edges (a new node's "
                                    "owner can change)")  # fmt: skip

    @property
    def in_flight(self) -> int:
        """Batches in flight in all."""
        if self.prefetch_factor is None:
            return self.prefetch
        return self.prefetch_factor * self.num_workers


_OPTIONS = frozenset(f.name for f in fields(LoaderOptions))
# BatchSpec fields either loader takes as keywords; the link loader also the negatives'
_SHARED = frozenset(
    {"output", "x", "y", "replace", "num_layers", "cache", "edge_ids", "labels", "x_bf16"}
)
_LINK = frozenset({"neg_k", "neg_mode", "edge_split"})


def _split(
    graph: DistGraph, kwargs: dict[str, Any], spec_names: frozenset[str]
) -> tuple[dict[str, Any], LoaderOptions]:
    """A loader's keywords: BatchSpec fields (``output`` and ``cache`` settled) and its
    LoaderOptions; ArgumentError naming a keyword that is neither."""
    unknown = sorted(set(kwargs) - spec_names - _OPTIONS)
    if unknown:
        raise ArgumentError(f"{unknown[0]}: not an argument of the loader")
    if "batch_size" not in kwargs:
        raise ArgumentError("batch_size: required")
    spec = {k: v for k, v in kwargs.items() if k in spec_names}
    spec["output"] = spec.get("output") or ("hetero" if graph.is_hetero else "data")
    cache = spec.get("cache")
    spec["cache"] = cache if cache is not None and cache.num_rows else None
    options = LoaderOptions(**{k: v for k, v in kwargs.items() if k in _OPTIONS})
    return spec, options


class _DistLoader:
    """A loader: a :class:`BatchSpec` (what each batch is) and :class:`LoaderOptions`
    (how the seeds are walked), over a graph."""

    def __init__(self, graph: DistGraph, ids: Any, spec: BatchSpec, options: LoaderOptions) -> None:
        self.graph = graph
        self.spec = spec
        self.options = options
        check_spec(spec, graph.book)
        self.ids = torch.as_tensor(ids).long().reshape(-1)
        self.prefetch = options.in_flight
        self.pin_memory = options.pin_memory and torch.cuda.is_available()
        self.epoch = 0
        self._builder: BatchBuilder | None = None
        self._pool: WorkerPool | None = None
        self.last_cost = BatchCost()  # of the batch yielded last
        self._live_seen: np.ndarray | None = None  # seeds so far (a followed live graph)
        self._edges_at: int | None = None  # the version new positives were asked at
        self._checked_at: int | None = None  # the version a link loader's were checked at
        if options.live_seeds is not None and spec.kind != "node":
            raise ArgumentError("live_seeds: a node loader's (a link loader's: live_edges)")
        if options.live_edges and spec.kind != "link":
            raise ArgumentError("live_edges: a link loader's (a node loader's: live_seeds)")
        self._begun = False  # begin_epoch() ran for the next iteration
        self._last: Tensor | None = None  # the seeds dealt last (``home``)
        if options.home is not None:
            self._last = foreign(self.ids, graph.book, options.home, spec.ntype)

    def __len__(self) -> int:
        n, size = self.ids.numel(), self.options.batch_size
        return n // size if self.options.drop_last else -(-n // size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _tasks(self) -> list[tuple[Tensor, int]]:
        seed, size = self.options.seed, self.options.batch_size
        order = self.ids
        if self.options.shuffle:
            order = shuffled(self.ids, seed, self.epoch, self._last)
        base = epoch_seed(seed, self.epoch)
        return [(order[i * size : (i + 1) * size], base) for i in range(len(self))]

    def start(self) -> None:
        """Build the batch builder, or start the sampler worker processes, now rather than
        on the first iteration (a trainer does it before its first epoch's clock starts)."""
        if self.options.num_workers == 0:
            if self._builder is None:
                self._builder = BatchBuilder(self.graph.ctx, self.spec)
        elif self._pool is None:
            self._pool = WorkerPool(
                self.graph.ctx.config, self.spec, self.options.num_workers,
                version=self.graph.version,
            )  # fmt: skip

    def begin_epoch(self) -> None:
        """Begin the next iteration's epoch now, as it begins otherwise: on a followed live
        graph the head, and the new seeds joining (``live_seeds``), so that ``len(self)``
        and ``ids`` count them before its first batch (a trainer agrees the epoch's steps
        from them)."""
        self._follow_epoch()
        self._begun = True

    def __iter__(self) -> Iterator[Data | HeteroData]:
        """One epoch's batches. Without ``persistent_workers`` the worker processes stop
        when the iteration ends, is broken out of or is dropped; with it (the default:
        a worker joins the store, which is worth doing once) at :meth:`close`."""
        if not self._begun:
            self._follow_epoch()
        self._begun = False
        tasks = self._tasks()
        self.start()
        if self._builder is not None:
            for ids, s in tasks:
                self.graph.refresh("batch")
                batch = self._builder.build(ids, s)
                self.last_cost = self._builder.last_cost
                yield self._pinned(batch)
            return
        assert self._pool is not None
        try:
            batches = self._pool.run(tasks, self.prefetch, lambda: self.graph.refresh("batch"))
            for batch, cost in batches:
                self.last_cost = cost
                yield self._pinned(batch)
        finally:
            if not self.options.persistent_workers:
                self.close()

    def _follow_epoch(self) -> None:
        """A followed live graph: the head at the epoch's start, and its new nodes whose
        ``live_seeds`` mask is true join the seeds, or (``live_edges``) its new edges of a
        link loader's ``etype`` the positives (distributed/live.py)."""
        if self.graph.follow is None:
            return
        self.graph.refresh("epoch")
        if self.options.live_seeds is not None and self.graph.follow != "pinned":
            ctx = self.graph.ctx
            if self._live_seen is None:
                self._live_seen = np.unique(self.ids.numpy())
            fresh, self._live_seen = new_seeds(
                ctx.client, self.options.live_seeds, self._live_seen, ctx.rank, ctx.world_size,
                self.spec.ntype,
            )  # fmt: skip
            self.ids = torch.cat([self.ids, fresh])
        if self.options.live_edges and self.graph.follow != "pinned":
            self._join_edges()
        if self.spec.kind == "link":
            self._leave_deleted()

    def _join_edges(self) -> None:
        """A followed live graph's new edges of the link loader's ``etype`` added since it
        last asked join the positives (those of the training split with ``edge_split``)."""
        ctx, spec, book = self.graph.ctx, self.spec, self.graph.book
        if self._live_seen is None:
            ids = self.ids.numpy()
            self._live_seen = np.unique(ids[ids >= book.num_edges])
        keep = None
        if spec.edge_split is not None:
            split = spec.edge_split

            def keep(eids: np.ndarray) -> np.ndarray:
                src, dst = ctx.sampler.find_edges(torch.from_numpy(eids))
                return (split.of(src, dst) == TRAIN).numpy()

        etype = book.etype_id(spec.etype or book.edge_types[0])
        fresh, self._live_seen = new_positives(
            ctx.client, etype, self._edges_at, self._live_seen, ctx.rank, ctx.world_size, keep
        )
        self._edges_at = ctx.client.version
        self.ids = torch.cat([self.ids, fresh])

    def _leave_deleted(self) -> None:
        """A link loader's positives deleted at the epoch's version leave it, so that
        ``len(self)`` counts the batches the epoch serves (each batch left them out, but
        the steps counted them): the ends of every positive asked again (``find_edges``
        with ``missing``, as a batch asks its own) whenever the version moved."""
        version = self.graph.ctx.client.version
        if version is None or version == self._checked_at or self.ids.numel() == 0:
            return
        self._checked_at = version
        etype = self.spec.etype or self.graph.book.edge_types[0]
        homo = self.graph.types.etype_to_homo(etype, self.ids.numpy())
        src, _ = self.graph.ctx.sampler.find_edges(torch.from_numpy(homo), missing=True)
        kept = src >= 0
        if not bool(kept.all()):
            self.ids = self.ids[kept]
            self._last = self._last[kept] if self._last is not None else None

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


class DistNodeDataLoader(_DistLoader):
    """Mini-batches around seed nodes (per-type ids of ``ntype`` on a heterograph).

    ``fanouts``: per hop (the hop next to the seeds first), or DistDGL's
    ``NeighborSampler(fanouts)`` (per model layer, input layer first), which also makes
    the loader yield DistDGL's ``(input_nodes, seeds, blocks)``. The other keywords:
    :class:`LoaderOptions` (``batch_size``, ``shuffle``, ``num_workers``, ...) and the
    :class:`BatchSpec` fields ``output``, ``x``, ``y``, ``replace``, ``num_layers``,
    ``cache``, ``edge_ids`` (False: a homogeneous graph's batches without ``e_id``, the
    edges' ids neither gathered nor sent) and ``labels`` (``"seeds"``: ``y`` of the
    seeds only, the first ``batch_size`` nodes) and ``x_bf16`` (True: a float32 ``x`` in
    bf16, converted as the rows are gathered)."""

    def __init__(
        self, graph: DistGraph, nodes: Any, fanouts: Any, *, ntype: str | None = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        if ntype is None and graph.is_hetero:
            raise ArgumentError(f"ntype: required on a heterograph ({list(graph.node_types)})")
        self.dgl_style = isinstance(fanouts, NeighborSamplerSpec)
        given, options = _split(graph, kwargs, _SHARED)
        hops, given["replace"] = _fanouts(fanouts, given.get("replace", False))
        spec = BatchSpec(kind="node", fanouts=hops, ntype=ntype, **given)
        super().__init__(graph, nodes, spec, options)
        if ntype is not None and graph.follow is not None:  # a new seed of another type:
            grown = self.ids.numpy()  # refused now, not at its batch (each batch checks too)
            graph.types.to_homo(ntype, grown[grown >= graph.book.num_nodes])

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
    no held-out edge and no edge joining a positive pair carries messages. The other
    keywords are those of :class:`DistNodeDataLoader` (``etype`` in place of ``ntype``).

    On a followed live graph (``DistGraph(ctx, follow=...)``) a new edge's per-type id is
    its id: new edges of ``etype`` are positives like base ones (one of another type is
    refused by name), and the negatives are drawn from the destination type's new nodes
    at the batch's version as well as its base nodes (docs/live.md). With
    ``live_edges=True`` the new edges of ``etype`` (of the training split with
    ``edge_split``) join the positives at each epoch's start, as ``live_seeds`` new nodes
    join a node loader's seeds; positives deleted at the epoch's version leave them then.
    """

    def __init__(
        self, graph: DistGraph, edges: Any, fanouts: Any, *,
        etype: tuple[str, str, str] | str | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        if etype is None and graph.is_hetero:
            raise ArgumentError("etype: required on a heterograph")
        canonical = None
        if etype is not None:
            canonical = graph.book.edge_types[graph.book.etype_id(etype)]
        given, options = _split(graph, kwargs, _SHARED | _LINK)
        _check_count(given.get("neg_k", 1), "neg_k", 1)
        hops, given["replace"] = _fanouts(fanouts, given.get("replace", False))
        spec = BatchSpec(kind="link", fanouts=hops, etype=canonical, **given)
        super().__init__(graph, edges, spec, options)
        if graph.follow is not None:  # a new positive of another type: refused now, not at
            grown = self.ids.numpy()  # its batch (each batch checks too)
            graph.types.etype_to_homo(canonical or graph.edge_types[0],
                                      grown[grown >= graph.book.num_edges])  # fmt: skip


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
    client = graph.ctx.client
    # a followed live graph: the probes may reach new nodes (never cached: cache.py)
    types = type_map(client, book, graph.ctx.sampler)
    sampler = NeighborSampler(graph.ctx.sampler, types, id_bound(client), fanouts)
    ids = torch.as_tensor(nodes).long().reshape(-1)
    if ntype is not None:
        ids = torch.from_numpy(to_homo(book, ntype, ids.numpy()))
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
