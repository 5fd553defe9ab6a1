"""One forward for a micro-batch of queries, over the running store.

A query's mini-batch is built as a trainer's evaluation builds its batches: the
:class:`~graphrun.distributed.batches.BatchBuilder` samples through the distributed
sampler and pulls features through :class:`~graphrun.distributed.features.StoreFeatures`.

* ``sampled``: a request's ids (distinct, in their order) are one mini-batch sampled with
  the job's fanouts and generator seed ``content_seed(epoch_seed(seed, 0), ids)`` —
  the batch a trainer whose loader seed is ``seed`` (``training.seed + rank``) builds in
  its evaluation for those seeds; answers equal its forward.
* ``full``: every neighbour (fanout -1): no randomness, so the micro-batch's ids are one
  mini-batch; answers equal layer-wise evaluation (:mod:`graphrun.train.inference`).
* ``precomputed``: the rows ``graphrun infer embed`` wrote (:mod:`graphrun.serving.embed`).
* a new node (``features``, ``neighbors``): its given in-edges are its first hop (all of
  them), the neighbours' hops beyond are sampled as the mode says.

Every query's subgraph is kept in PyG's hop layout (seeds, then each hop's nodes; hop 1's
edges first), so the micro-batch's subgraphs merge hop by hop (:func:`merge`) into one
forward whose every layer computes the same rows from the same edges as the query's
own forward would.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from graphrun.distributed import DistContext, DistGraph, initialize
from graphrun.distributed.batches import BatchBuilder, BatchSpec
from graphrun.distributed.live import id_bound
from graphrun.distributed.minibatch import epoch_seed
from graphrun.errors import ArgumentError, BadRequest, GraphrunError, StoreUnavailable
from graphrun.rpc.auth import KeyPair
from graphrun.serving.embed import TABLES, table_name
from graphrun.serving.live_ids import NewNodes, stored
from graphrun.serving.model import ModelSpec, load_model
from graphrun.serving.protocol import Graph, Query
from graphrun.store.dist_tensor import DistTensor
from graphrun.train.distdata import DistGraphData
from graphrun.train.models import ByLayer, mfg_edges, mfg_targets


@dataclass
class Part:
    """One query's subgraph in PyG's hop layout: ``nsn[h]`` nodes of hop ``h``,
    ``nse[h]`` edges of hop ``h + 1``."""

    x: Tensor
    edge_index: Tensor
    nsn: list[int]
    nse: list[int]


@dataclass
class Stats:
    """What a micro-batch cost: seconds sampling and pulling features, ids answered."""

    sample_s: float = 0.0
    fetch_s: float = 0.0
    forward_s: float = 0.0
    ids: int = 0
    # per query: its output rows, or the BadRequest that query alone gets
    rows: list[dict[str, np.ndarray] | BadRequest] = field(default_factory=list)


def merge(parts: Sequence[Part]) -> tuple[Part, list[int]]:
    """The parts as one subgraph, hop by hop (every part's hop-``h`` nodes after every
    part's hop ``h - 1``), and where each part's seeds start."""
    hops = len(parts[0].nsn)
    total = [sum(p.nsn[h] for p in parts) for h in range(hops)]
    base = np.concatenate([[0], np.cumsum(total)]).tolist()
    before = [0] * hops
    xs: list[list[Tensor]] = [[] for _ in range(hops)]
    es: list[list[Tensor]] = [[] for _ in range(hops - 1)]
    starts = []
    for p in parts:
        local = torch.empty(sum(p.nsn), dtype=torch.long)
        lo = 0
        for h in range(hops):
            n = p.nsn[h]
            local[lo : lo + n] = torch.arange(n) + base[h] + before[h]
            xs[h].append(p.x[lo : lo + n])
            lo += n
        starts.append(base[0] + before[0])
        elo = 0
        for h in range(hops - 1):
            es[h].append(local[p.edge_index[:, elo : elo + p.nse[h]]])
            elo += p.nse[h]
        before = [b + n for b, n in zip(before, p.nsn, strict=True)]
    x = torch.cat([t for hop in xs for t in hop])
    edges = [t for hop in es for t in hop]
    ei = torch.cat(edges, dim=1) if edges else torch.empty((2, 0), dtype=torch.long)
    nse = [sum(p.nse[h] for p in parts) for h in range(hops - 1)]
    return Part(x, ei, total, nse), starts


def forward(model: ByLayer, g: Part) -> tuple[Tensor, Tensor]:
    """The model's output for the seeds of ``g`` (the first ``nsn[0]`` nodes) and the
    seeds' input to the last layer (their embeddings): ``model.forward``'s layers."""
    layers = len(model.convs)
    x, emb = g.x, g.x
    for i in range(layers):
        if i == layers - 1:
            emb = x[: g.nsn[0]]
        n_dst = mfg_targets(g.nsn, layers, i)
        x = model._layer(i, x, mfg_edges(g.edge_index, g.nse, layers, i), n_dst)
    return x[: g.nsn[0]], emb


def _part(data: object) -> Part:
    d: Any = data
    return Part(d.x.float(), d.edge_index, list(d.num_sampled_nodes), list(d.num_sampled_edges))


class Engine:
    """The model, its store connection and its batch builders (used from one thread)."""

    def __init__(
        self, spec: ModelSpec, checkpoint: Path, servers: Sequence[str], keys: KeyPair, job: str,
        timeout: float = 5.0, follow: str | None = None, version: int | None = None,
    ) -> None:  # fmt: skip
        self.follow, self.version = follow, version  # a live graph: the head, or pinned
        self.spec, self.checkpoint = spec, checkpoint
        self.servers, self.keys, self.job, self.timeout = tuple(servers), keys, job, timeout
        self.model: ByLayer | None = None
        self.ctx: DistContext | None = None
        self.graph = Graph(0, 0)
        self.connect()

    @property
    def connected(self) -> bool:
        return self.ctx is not None

    def connect(self) -> None:
        """Join the store (again) and build what the batches need; the model once."""
        self.close()
        ctx = initialize(
            self.servers, job=self.job, keys=self.keys, rank=0, world_size=1,
            name="serving", timeout=self.timeout,
        )  # fmt: skip
        try:
            data = DistGraphData(DistGraph(ctx, follow=self.follow), 0, 1, seed=self.spec.seed)
            if self.version is not None:
                ctx.client.follow(self.version)
            if len(data.edge_types) != 1 or len(data.node_types) != 1:
                raise ArgumentError(
                    "the endpoint answers on homogeneous graphs (one node and edge type)"
                )
            s = self.spec
            self.ntype = s.ntype or data.node_types[0]
            in_dim = data.feature_dim(self.ntype, s.feature)
            if in_dim is None:
                raise ArgumentError(
                    f"spec.training.feature: the store has no node feature {s.feature!r}"
                )
            if self.model is None:
                classes = data.num_classes(self.ntype, s.label)
                self.model = load_model(s, self.checkpoint, in_dim, classes)
            self.graph = Graph(id_bound(ctx.client), in_dim)  # new nodes: serving/live_ids.py
            self.new_nodes = NewNodes(ctx.client)
            layers = s.layers

            def builder(fanouts: list[int]) -> BatchBuilder:
                spec = BatchSpec(
                    "node", fanouts, "data", x=s.feature, y=s.label, num_layers=len(fanouts)
                )
                return BatchBuilder(ctx, spec)

            self.builders = {"sampled": builder(list(s.fanouts)), "full": builder([-1] * layers)}
            if layers > 1:
                self.tails = {
                    "sampled": builder(list(s.fanouts[1:])),
                    "full": builder([-1] * (layers - 1)),
                }
            self.data = data
            self._tables: dict[str, DistTensor] = {}
        except BaseException:
            ctx.close()
            raise
        self.ctx = ctx

    def close(self) -> None:
        if self.ctx is not None:
            ctx, self.ctx = self.ctx, None
            with contextlib.suppress(GraphrunError):  # a store that is gone: nothing to leave
                ctx.close()

    def answer(self, queries: Sequence[Query]) -> Stats:
        """Output rows for each query (in order), from one forward."""
        if self.ctx is None:
            raise StoreUnavailable("not connected to the store (waiting for it to come back)")
        try:
            with torch.no_grad():
                return self._answer(queries)
        except BadRequest:
            raise
        except (GraphrunError, OSError) as exc:
            self.close()  # joined again once the store answers the probe
            raise StoreUnavailable(f"the store did not answer ({exc})") from exc

    def _answer(self, queries: Sequence[Query]) -> Stats:
        self.data.graph.refresh("batch")  # following the head: the head of each forward
        stats = Stats(ids=sum(q.size for q in queries))
        rows: list[dict[str, np.ndarray] | BadRequest | None] = [None] * len(queries)
        for i, q in enumerate(queries):  # a new node's id that is none at this version
            try:
                self.new_nodes.check_query(q)
            except BadRequest as exc:  # this query's alone: the others are answered
                rows[i] = exc
        parts: list[Part] = []
        where: list[tuple[int, int, np.ndarray | None]] = []  # query, part, rows of its seeds
        full = [(i, q.ids) for i, q in enumerate(queries)
                if q.mode == "full" and q.ids is not None and rows[i] is None]  # fmt: skip
        if full:
            union = np.unique(np.concatenate([ids for _, ids in full]))
            parts.append(self._build("full", union, 0, stats))
            where += [(i, 0, np.searchsorted(union, ids)) for i, ids in full]
        for i, q in enumerate(queries):
            if rows[i] is not None:
                continue
            if q.mode == "precomputed":
                try:
                    rows[i] = self._stored(q)
                except BadRequest as exc:  # this query's alone: the others are answered
                    rows[i] = exc
            elif q.ids is None:
                where.append((i, len(parts), None))
                parts.append(self._new_node(q, stats))
            elif q.mode == "sampled":
                where.append((i, len(parts), None))
                parts.append(self._build("sampled", q.ids, q.seed, stats))
        if parts:
            t0 = time.perf_counter()
            merged, starts = merge(parts)
            assert self.model is not None
            logits, emb = forward(self.model, merged)
            stats.forward_s = time.perf_counter() - t0
            for i, p, at in where:
                n = queries[i].size
                idx = (
                    torch.from_numpy(at) + starts[p]
                    if at is not None
                    else torch.arange(n) + starts[p]
                )
                rows[i] = _rows(logits[idx], emb[idx])
        stats.rows = [r for r in rows if r is not None]
        return stats

    def _build(self, mode: str, ids: np.ndarray, seed: int, stats: Stats) -> Part:
        b = self.builders[mode]
        data = b.build(torch.from_numpy(ids), epoch_seed(seed, 0))
        stats.sample_s += b.last_cost.sample_s
        stats.fetch_s += b.last_cost.fetch_s
        return _part(data)

    def _new_node(self, q: Query, stats: Stats) -> Part:
        assert q.features is not None and q.neighbors is not None
        k = int(q.neighbors.size)
        feats = torch.from_numpy(q.features).view(1, -1)
        if self.spec.layers == 1:
            t0 = time.perf_counter()
            b = self.builders["full"]
            got = b.features.node_feature(
                self.ntype, self.spec.feature, torch.from_numpy(q.neighbors)
            )
            stats.fetch_s += time.perf_counter() - t0
            assert got is not None
            tail = Part(got.float(), torch.empty((2, 0), dtype=torch.long), [k], [])
        else:
            mode = "full" if q.mode == "full" else "sampled"
            b = self.tails[mode]
            data = b.build(torch.from_numpy(q.neighbors), epoch_seed(q.seed, 0))
            stats.sample_s += b.last_cost.sample_s
            stats.fetch_s += b.last_cost.fetch_s
            tail = _part(data)
        first = torch.stack([torch.arange(1, k + 1), torch.zeros(k, dtype=torch.long)])
        return Part(
            torch.cat([feats, tail.x]), torch.cat([first, tail.edge_index + 1], dim=1),
            [1, *tail.nsn], [k, *tail.nse],
        )  # fmt: skip

    def _stored(self, q: Query) -> dict[str, np.ndarray]:
        assert q.ids is not None and self.ctx is not None
        client = self.ctx.client
        if (q.ids >= self.new_nodes.base).any():  # new nodes: the kept states' grown rows
            got = stored(client, self.ntype, q.ids)
            return {"logits": got["logits"], "embeddings": got["embeddings"],
                    "predictions": got["predictions"].astype(np.int64)}  # fmt: skip
        got = {}
        for what in TABLES:
            name = table_name(self.ntype, what)
            if name not in self._tables:
                if name not in {t.name for t in client.list_tensors()}:
                    raise BadRequest(
                        "parameters.mode: precomputed, but the store holds no embeddings of "
                        "this job (run `graphrun infer embed` first)"
                    )
                self._tables[name] = DistTensor(client, name)
            got[what] = self._tables[name][q.ids].numpy()
        return {"logits": got["logits"], "embeddings": got["embeddings"],
                "predictions": got["predictions"].astype(np.int64)}  # fmt: skip


def _rows(logits: Tensor, emb: Tensor) -> dict[str, np.ndarray]:
    return {
        "logits": logits.float().numpy(),
        "predictions": logits.argmax(-1).numpy().astype(np.int64),
        "embeddings": emb.float().numpy(),
    }
