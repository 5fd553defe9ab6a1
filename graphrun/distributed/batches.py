"""Building one mini-batch from ids: sample (distributed), fetch features, collate.

A :class:`BatchBuilder` needs only a :class:`~graphrun.distributed.context.DistContext`
and a :class:`BatchSpec` (a plain frozen value), so it runs the same in the trainer
(``num_workers=0``) and in a loader worker process, which builds its own context.
Every batch is sampled with a generator seed of the epoch's seed and its own seed
ids (:func:`~graphrun.distributed.minibatch.content_seed`), so a batch's content
does not depend on which process, or which loader (graphrun's or PyG's), built it.
What building it cost — seconds pulling features, bytes of structure and of
features from each partition — is its :class:`BatchCost` (``builder.last_cost``),
the profile record's inputs.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from graphrun.distributed.cache import CachePlan
from graphrun.distributed.context import DistContext
from graphrun.distributed.features import StoreFeatures
from graphrun.distributed.minibatch import MiniBatchSampler
from graphrun.errors import ArgumentError
from graphrun.placement.profile import BatchCost
from graphrun.sampling.edgesplit import EdgeSplit
from graphrun.sampling.mfg import SampledSubgraph
from graphrun.sampling.pyg import split_by_type, to_data
from graphrun.sampling.sampler import Output, collate

Kind = Literal["node", "link"]


@dataclass(frozen=True)
class BatchSpec:
    """What to build: fanouts, seed type, PyG output form, feature names, negatives."""

    kind: Kind
    fanouts: Any
    output: Output
    ntype: str | None = None
    etype: tuple[str, str, str] | None = None
    x: str = "feat"
    y: str = "label"
    replace: bool = False
    num_layers: int | None = None
    neg_k: int = 1
    neg_mode: Literal["uniform", "degree"] = "uniform"
    edge_split: EdgeSplit | None = None  # link batches: keep held-out and target edges out
    cache: CachePlan | None = None  # remote node features to keep in every building process
    # node batches of a homogeneous graph, for a model that reads no more: edge_ids False,
    # no ``e_id`` (none gathered, nor sent by a server); labels "seeds", ``y`` of the seeds
    # only (the first ``batch_size`` nodes, what a node task's loss reads)
    edge_ids: bool = True
    labels: Literal["all", "seeds"] = "all"
    # a float32 ``x`` in bf16, for a model whose first layer reads bf16 rows
    # (:class:`~graphrun.distributed.features.StoreFeatures`' ``bf16``)
    x_bf16: bool = False

    @property
    def without_edge_ids(self) -> bool:
        return not self.edge_ids and self.kind == "node" and self.output == "data"


FEATURE_OPS = ("pull", "pull:shm")


class _Meter:
    """The client's and sampler's byte counters and the feature clock, before a batch."""

    def __init__(self, ctx: DistContext, features: StoreFeatures) -> None:
        self.ctx, self.features = ctx, features
        self.traffic = Counter(ctx.client.traffic)
        self.local = Counter(ctx.sampler.local_bytes)
        self.fetch_s = features.seconds
        self.cache_bytes = features.cache_bytes
        self.disk = ctx.client.catalog.disk_counters()
        self.t0 = time.perf_counter()

    def cost(self) -> BatchCost:
        fetch_s = self.features.seconds - self.fetch_s
        structure: dict[int, int] = {}
        feature: dict[int, int] = {}
        for (part, op), n in (Counter(self.ctx.client.traffic) - self.traffic).items():
            d = feature if op in FEATURE_OPS else structure
            d[part] = d.get(part, 0) + n
        for part, n in (Counter(self.ctx.sampler.local_bytes) - self.local).items():
            structure[part] = structure.get(part, 0) + n
        disk = self.ctx.client.catalog.disk_counters()
        hit = disk["hit_bytes"] - self.disk["hit_bytes"]
        read = disk["disk_bytes"] - self.disk["disk_bytes"]
        return BatchCost(
            sample_s=time.perf_counter() - self.t0 - fetch_s, fetch_s=fetch_s,
            structure_bytes=structure, feature_bytes=feature,
            cache_bytes=self.features.cache_bytes - self.cache_bytes,
            disk_hit_bytes=hit if hit or read else None,
            disk_bytes=read if hit or read else None,
        )  # fmt: skip


class BatchBuilder:
    def __init__(self, ctx: DistContext, spec: BatchSpec) -> None:
        self.ctx = ctx
        self.spec = spec
        self.book = ctx.book
        self.minibatch = MiniBatchSampler(
            ctx, spec.fanouts, replace=spec.replace, num_layers=spec.num_layers,
            edge_ids=not spec.without_edge_ids,
        )  # fmt: skip
        self.types = self.minibatch.types
        cache = ctx.feature_cache(spec.cache) if spec.cache is not None else None
        self.features = StoreFeatures(ctx.client, cache, bf16=spec.x if spec.x_bf16 else None)
        self.features.warm(spec.x, spec.y)
        self.last_cost = BatchCost()

    def build(self, ids: Tensor, seed: int) -> Data | HeteroData:
        """The batch of ``ids``, sampled with ``content_seed(seed, ...)`` (``seed``: the
        epoch's, from :func:`~graphrun.distributed.minibatch.epoch_seed`); what it cost
        is then in ``last_cost``."""
        meter = _Meter(self.ctx, self.features)
        if self.spec.kind == "node":
            data = self.node_batch(ids, seed)
        else:
            data = self.link_batch(ids, seed)
        self.last_cost = meter.cost()
        return data

    def _collate(self, sub: SampledSubgraph) -> Data | HeteroData:
        return collate(
            sub, self.types, self.features, output=self.spec.output, x=self.spec.x, y=self.spec.y
        )

    def node_batch(self, ids: Tensor, seed: int) -> Data | HeteroData:
        """Seeds are per-type ids of ``spec.ntype`` (homogeneous ids when it is None)."""
        homo = self.minibatch.to_homo(self.spec.ntype, ids)
        sub = self.minibatch.nodes(homo, seed)
        if self.spec.labels == "seeds" and self.spec.output == "data":
            nt, f = self.types.node_types[0], self.features
            x = f.node_feature(nt, self.spec.x, sub.node)
            data = to_data(sub, x, f.node_feature(nt, self.spec.y, sub.node[: sub.batch_size]))
        else:
            data = self._collate(sub)
        if self.spec.without_edge_ids:
            del data.e_id  # NO_EDGE_ID each
        return data

    def link_batch(self, eids: Tensor, seed: int) -> Data | HeteroData:
        """Positive edges ``eids`` (per-type ids of ``spec.etype``) plus ``neg_k`` negatives each.

        Adds ``edge_label_index`` (local ids, positives first) and ``edge_label``
        (1 / 0), like PyG's ``LinkNeighborLoader`` in binary mode; on ``HeteroData``
        they sit on the edge type. With ``spec.edge_split``, the sampled edges exclude the
        held-out ones and those joining a positive pair (:meth:`EdgeSplit.exclude`).
        """
        etype = self.spec.etype or self.types.edge_types[0]
        # a followed live graph: a new edge's per-type id is its id, refused if not of etype
        homo_e = torch.from_numpy(self.types.etype_to_homo(etype, eids.numpy()))
        following = self.ctx.client.version is not None
        src, dst = self.ctx.sampler.find_edges(homo_e, missing=following)
        if following:  # a positive deleted by the batch's version is left out, not refused
            kept = src >= 0
            src, dst = src[kept], dst[kept]
        got = self.minibatch.links(
            src,
            dst,
            seed,
            etype,
            neg_k=self.spec.neg_k,
            neg_mode=self.spec.neg_mode,
            edge_split=self.spec.edge_split,
        )
        data = self._collate(got.sub)
        label = torch.cat([torch.ones(got.num_pos), torch.zeros(got.num_neg)])
        if isinstance(data, HeteroData):
            local = split_by_type(got.sub, self.types).local_in_type
            data[etype].edge_label_index = local[got.label_index]
            data[etype].edge_label = label
        else:
            data.edge_label_index = got.label_index
            data.edge_label = label
        return data


def check_spec(spec: BatchSpec, book: Any) -> None:
    """Validate in the trainer, so bad input fails there with a clear error, not in a worker."""
    from graphrun.sampling.fanout import normalize_fanouts

    normalize_fanouts(spec.fanouts, [tuple(e) for e in book.edge_types], spec.num_layers)
    if spec.ntype is not None and spec.ntype not in book.node_types:
        raise ArgumentError(
            f"ntype: unknown node type {spec.ntype!r}; known: {list(book.node_types)}"
        )
    if spec.etype is not None:
        book.etype_id(spec.etype)
    if not isinstance(spec.x_bf16, bool):
        raise ArgumentError(f"x_bf16: expected True or False, got {spec.x_bf16!r}")
    if spec.labels not in ("all", "seeds"):
        raise ArgumentError(f"labels: expected 'all' or 'seeds', got {spec.labels!r}")
    if spec.neg_mode not in ("uniform", "degree"):
        raise ArgumentError(f"neg_mode: expected 'uniform' or 'degree', got {spec.neg_mode!r}")
