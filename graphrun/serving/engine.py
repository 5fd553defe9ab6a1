"""One forward for a micro-batch of queries, over the running store.

A query's mini-batch is sampled as a trainer's evaluation samples its batches (the
:class:`~graphrun.distributed.minibatch.MiniBatchSampler` of a
:class:`~graphrun.distributed.batches.BatchBuilder`, through the distributed sampler);
the features of the whole micro-batch are then pulled at once, each distinct id once
(:class:`~graphrun.distributed.features.StoreFeatures`, the trainers' path): queries'
neighbourhoods overlap, and one pull costs the same store round trips as one query's.

* ``sampled``: a request's ids (distinct, in their order) are one mini-batch sampled with
  the job's fanouts and generator seed ``content_seed(epoch_seed(seed, 0), ids)`` —
  the batch a trainer whose loader seed is ``seed`` (``training.seed + rank``) builds in
  its evaluation for those seeds; answers equal its forward.
* ``full``: every neighbour (fanout -1): no randomness, so the micro-batch's ids are one
  mini-batch; answers equal layer-wise evaluation (:mod:`graphrun.train.inference`).
* ``precomputed``: the rows ``graphrun infer embed`` wrote (:mod:`graphrun.serving.embed`),
  one ``pull_tables`` request an owner for all of a micro-batch's queries.
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from graphrun.distributed import DistContext, DistGraph, initialize
from graphrun.distributed.features import StoreFeatures
from graphrun.distributed.live import id_bound
from graphrun.distributed.minibatch import MiniBatchSampler, epoch_seed
from graphrun.errors import ArgumentError, BadRequest, GraphrunError, StoreUnavailable
from graphrun.rpc.auth import KeyPair
from graphrun.sampling.mfg import SampledSubgraph
from graphrun.serving import embed, refresh
from graphrun.serving.embed import TABLES, table_name
from graphrun.serving.live_ids import NewNodes, stored
from graphrun.serving.model import ModelSpec, load_model
from graphrun.serving.protocol import Graph, Query
from graphrun.store.tables import pull_tables
from graphrun.train.distdata import DistGraphData
from graphrun.train.models import ByLayer, mfg_edges, mfg_targets

if TYPE_CHECKING:
    from graphrun.serving.config import Target


@dataclass
class Part:
    """One query's subgraph in PyG's hop layout: ``nsn[h]`` nodes of hop ``h``,
    ``nse[h]`` edges of hop ``h + 1``; ``node`` its nodes' ids, -1 for a new node's row
    (its features in ``given``: only seeds are new)."""

    node: Tensor
    edge_index: Tensor
    nsn: list[int]
    nse: list[int]
    given: Tensor | None = None


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
    ns: list[list[Tensor]] = [[] for _ in range(hops)]
    es: list[list[Tensor]] = [[] for _ in range(hops - 1)]
    starts = []
    for p in parts:
        local = torch.empty(sum(p.nsn), dtype=torch.long)
        lo = 0
        for h in range(hops):
            n = p.nsn[h]
            local[lo : lo + n] = torch.arange(n) + base[h] + before[h]
            ns[h].append(p.node[lo : lo + n])
            lo += n
        starts.append(base[0] + before[0])
        elo = 0
        for h in range(hops - 1):
            es[h].append(local[p.edge_index[:, elo : elo + p.nse[h]]])
            elo += p.nse[h]
        before = [b + n for b, n in zip(before, p.nsn, strict=True)]
    node = torch.cat([t for hop in ns for t in hop])
    edges = [t for hop in es for t in hop]
    ei = torch.cat(edges, dim=1) if edges else torch.empty((2, 0), dtype=torch.long)
    nse = [sum(p.nse[h] for p in parts) for h in range(hops - 1)]
    given = [p.given for p in parts if p.given is not None]  # hop 0's new rows, in order
    return Part(node, ei, total, nse, torch.cat(given) if given else None), starts


def forward(model: ByLayer, g: Part, x: Tensor) -> tuple[Tensor, Tensor]:
    """The model's output for the seeds of ``g`` (the first ``nsn[0]`` nodes; ``x`` the
    features of its nodes) and the seeds' input to the last layer (their embeddings):
    ``model.forward``'s layers."""
    layers = len(model.convs)
    emb = x
    for i in range(layers):
        if i == layers - 1:
            emb = x[: g.nsn[0]]
        n_dst = mfg_targets(g.nsn, layers, i)
        x = model._layer(i, x, mfg_edges(g.edge_index, g.nse, layers, i), n_dst)
    return x[: g.nsn[0]], emb


def _part(sub: SampledSubgraph) -> Part:
    return Part(sub.node, sub.edge_index(), list(sub.num_sampled_nodes),
                list(sub.num_sampled_edges))  # fmt: skip


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

            def sampler(fanouts: list[int]) -> MiniBatchSampler:
                return MiniBatchSampler(ctx, fanouts, num_layers=len(fanouts))

            self.samplers = {"sampled": sampler(list(s.fanouts)), "full": sampler([-1] * layers)}
            if layers > 1:
                self.tails = {
                    "sampled": sampler(list(s.fanouts[1:])),
                    "full": sampler([-1] * (layers - 1)),
                }
            self.features = StoreFeatures(ctx.client)
            self.data = data
            self._tables_found = False  # the precomputed tables seen in the store once
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
            with torch.inference_mode():
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
        kept = [i for i, q in enumerate(queries) if q.mode == "precomputed" and rows[i] is None]
        if kept:
            for i, got in zip(kept, self._stored([queries[i] for i in kept]), strict=True):
                rows[i] = got
        parts: list[Part] = []
        where: list[tuple[int, int, np.ndarray | None]] = []  # query, part, rows of its seeds
        t0 = time.perf_counter()
        full = [(i, q.ids) for i, q in enumerate(queries)
                if q.mode == "full" and q.ids is not None and rows[i] is None]  # fmt: skip
        if full:
            union = np.unique(np.concatenate([ids for _, ids in full]))
            sub = self.samplers["full"].nodes(torch.from_numpy(union), epoch_seed(0, 0))
            parts.append(_part(sub))
            where += [(i, 0, np.searchsorted(union, ids)) for i, ids in full]
        for i, q in enumerate(queries):
            if rows[i] is not None:  # answered already, or refused
                continue
            if q.ids is None:
                where.append((i, len(parts), None))
                parts.append(self._new_node(q))
            elif q.mode == "sampled":
                where.append((i, len(parts), None))
                sub = self.samplers["sampled"].nodes(torch.from_numpy(q.ids), epoch_seed(q.seed, 0))
                parts.append(_part(sub))
        stats.sample_s = time.perf_counter() - t0
        if parts:
            merged, starts = merge(parts)
            t0 = time.perf_counter()
            x = self._features(merged)
            stats.fetch_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            assert self.model is not None
            logits, emb = forward(self.model, merged, x)
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

    def _features(self, g: Part) -> Tensor:
        """The features of every node of ``g``: each distinct id pulled once for the whole
        micro-batch (its queries' neighbourhoods overlap: hubs), a new node's as given."""
        known = g.node >= 0
        ids = g.node[known] if g.given is not None else g.node
        uniq, inverse = torch.unique(ids, return_inverse=True)
        got = self.features.node_feature(self.ntype, self.spec.feature, uniq)
        assert got is not None  # connect() checked the store holds the feature
        if g.given is None:
            return got.float()[inverse]
        x = torch.empty((g.node.numel(), self.graph.in_dim))
        x[known] = got.float()[inverse]
        x[~known] = g.given
        return x

    def _new_node(self, q: Query) -> Part:
        assert q.features is not None and q.neighbors is not None
        k = int(q.neighbors.size)
        nbrs = torch.from_numpy(q.neighbors)
        if self.spec.layers == 1:
            tail = Part(nbrs, torch.empty((2, 0), dtype=torch.long), [k], [])
        else:
            mode = "full" if q.mode == "full" else "sampled"
            tail = _part(self.tails[mode].nodes(nbrs, epoch_seed(q.seed, 0)))
        first = torch.stack([torch.arange(1, k + 1), torch.zeros(k, dtype=torch.long)])
        return Part(
            torch.cat([torch.tensor([-1]), tail.node]),
            torch.cat([first, tail.edge_index + 1], dim=1),
            [1, *tail.nsn], [k, *tail.nse], torch.from_numpy(q.features).view(1, -1),
        )  # fmt: skip

    def _stored(self, queries: Sequence[Query]) -> list[dict[str, np.ndarray] | BadRequest]:
        """The stored rows of every ``precomputed`` query: one ``pull_tables`` request an
        owner partition for all of them (store/tables.py)."""
        assert self.ctx is not None
        client = self.ctx.client
        out: list[dict[str, np.ndarray] | BadRequest | None] = [None] * len(queries)
        for k, q in enumerate(queries):
            if q.ids is not None and (q.ids >= self.new_nodes.base).any():
                try:  # new nodes: the kept states' grown rows
                    got = stored(client, self.ntype, q.ids)
                except BadRequest as exc:  # this query's alone: the others are answered
                    out[k] = exc
                else:
                    out[k] = _kept(got)
        base = [(k, q.ids) for k, q in enumerate(queries) if out[k] is None and q.ids is not None]
        if not base:
            return [r for r in out if r is not None]
        names = [table_name(self.ntype, what) for what in TABLES]
        if not self._tables_found:
            if not set(names) <= {t.name for t in client.list_tensors()}:
                bad = BadRequest(
                    "parameters.mode: precomputed, but the store holds no embeddings of "
                    "this job (run `graphrun infer embed` first)"
                )
                return [bad if r is None else r for r in out]  # each query's alone
            self._tables_found = True
        union, inverse = np.unique(np.concatenate([ids for _, ids in base]), return_inverse=True)
        got = dict(zip(TABLES, pull_tables(client, names, union), strict=True))
        lo = 0
        for k, q_ids in base:
            at = inverse[lo : lo + q_ids.size]
            lo += q_ids.size
            out[k] = _kept(got, at)
        return [r for r in out if r is not None]


def _kept(
    got: dict[str, np.ndarray], at: np.ndarray | slice = slice(None)
) -> dict[str, np.ndarray]:
    """A ``precomputed`` answer: rows ``at`` of the kept tables."""
    return {"logits": got["logits"][at], "embeddings": got["embeddings"][at],
            "predictions": got["predictions"][at].astype(np.int64)}  # fmt: skip


def _rows(logits: Tensor, emb: Tensor) -> dict[str, np.ndarray]:
    return {
        "logits": logits.float().numpy(),
        "predictions": logits.argmax(-1).numpy().astype(np.int64),
        "embeddings": emb.float().numpy(),
    }


@contextlib.contextmanager
def job_pass(
    t: Target, *, threads: int = 1, timeout: float = 5.0, batch_size: int = 4096
) -> Iterator[tuple[ByLayer, DistGraphData, str, str, int]]:
    """What a whole-graph pass of the job ``t`` runs on (:mod:`.embed`, :mod:`.refresh`):
    its model, its data in the store, node type, feature and batch size, with the store
    open meanwhile."""
    torch.set_num_threads(threads)
    engine = Engine(t.spec, t.checkpoint, t.servers, t.keys, t.job_name, timeout)
    try:
        assert engine.model is not None
        yield engine.model, engine.data, engine.ntype, t.spec.feature, batch_size
    finally:
        engine.close()


def embed_job(
    t: Target, *, threads: int = 1, timeout: float = 5.0, batch_size: int = 4096,
    how: Literal["live", "refresh"] | None = None, version: int | None = None,
) -> dict[str, object]:  # fmt: skip
    """``graphrun infer embed``: every node's embeddings, logits and predictions of the
    job ``t`` into its store (:mod:`.embed`; ``how``: :mod:`.refresh`'s pass at the head
    whose states it keeps, or its refresh of them); the job and what it took."""
    out: dict[str, float | int | list[int]]
    with job_pass(t, threads=threads, timeout=timeout, batch_size=batch_size) as what:
        if how is None:
            out = {**embed.embed(*what)}
        elif how == "live":
            out = {**refresh.full(*what, version=version)}
        else:
            out = refresh.refresh(*what, version=version)
    return {"job": t.job_name, **out}
