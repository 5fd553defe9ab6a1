"""A cache of remote node features: the rows sampling reaches most, kept in this process.

On a power-law graph a few nodes of other partitions appear in most mini-batches, and
every time their features cross the network (and CURVE, at both ends). SALIENT++
(Kaler et al., MLSys 2023) keeps the remote features a partition's batches reach most
often beside its own. Here they are found the plain way: before training,
:func:`plan_cache` samples a few mini-batches of the trainer's own seeds with the
sampler it trains with, counts how often each node of a remote partition appears, and
keeps the most frequent ones that fit the budget (``runtime.featureCacheMb``); what
budget is left goes to the halo — remote nodes by the number of edges they send into
the trainer's own partitions, the likeliest to be sampled next — and then to any other
remote node (a few probes see only part of what an epoch reaches; benchmarks/README.md
records what the halo saves).

The :class:`CachePlan` (ids only) travels in the loader's ``BatchSpec`` to every process
that builds batches; each materialises it once (:meth:`DistContext.feature_cache`) by
pulling the rows of every feature it will read, and :class:`StoreFeatures` serves hits
from it. A base graph's features are read-only while jobs run; a followed live graph's
are not (a writer overwrites rows, docs/live.md), so a cached feature remembers the
version its rows were read at, and when the client's version moves, the rows the store
says were updated in between (``graph_changes``, :mod:`graphrun.sampling.changes`) are
read again at the new version before the next hit: a cached row is never older than
the batch that reads it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from graphrun.errors import StoreError
from graphrun.names import TensorKey
from graphrun.partition.book import PartitionBook
from graphrun.sampling.changes import OP_CHANGES
from graphrun.sampling.sampler import NeighborSampler
from graphrun.store.client import KVClient

#: Id spaces up to this size map ids to cache slots with one dense int32 array
#: (4 bytes per id); bigger ones search the sorted cached ids instead.
DENSE_LIMIT = 1 << 26


@dataclass(frozen=True)
class CachePlan:
    """Which remote nodes to cache: sorted per-type ids for each node type."""

    ids: Mapping[str, np.ndarray] = field(compare=False, repr=False)
    token: str = ""  # identifies the plan (a digest of the ids)

    @property
    def num_rows(self) -> int:
        return sum(len(v) for v in self.ids.values())


class CachedRows:
    """Rows of one feature for a sorted set of ids, with an id -> slot lookup."""

    def __init__(
        self, ids: np.ndarray, rows: np.ndarray, id_space: int, version: int | None = None
    ) -> None:
        self.ids, self.rows = ids, rows
        self.version = version  # a followed live graph's version the rows were read at
        self.row_bytes = int(rows[:1].nbytes) if len(rows) else 0
        self._map: np.ndarray | None = None
        if id_space <= DENSE_LIMIT:
            self._map = np.full(id_space, -1, np.int32)
            self._map[ids] = np.arange(len(ids), dtype=np.int32)

    def slots(self, ids: np.ndarray) -> np.ndarray:
        """The cache slot of every id, -1 where it is not cached."""
        if self._map is not None:
            if len(ids) and int(ids.max()) >= len(self._map):  # a live graph's new nodes
                out = np.full(len(ids), -1, np.int32)
                known = ids < len(self._map)
                out[known] = self._map[ids[known]]
                return out
            return self._map[ids]
        pos = np.searchsorted(self.ids, ids).clip(max=max(len(self.ids) - 1, 0))
        hit = self.ids[pos] == ids if len(self.ids) else np.zeros(len(ids), bool)
        return np.where(hit, pos, -1).astype(np.int32)


class FeatureCache:
    """A :class:`CachePlan` made real in one process: rows pulled once per feature."""

    def __init__(self, client: KVClient, plan: CachePlan) -> None:
        self.client, self.plan = client, plan
        self._rows: dict[str, CachedRows | None] = {}

    def rows(self, ntype: str, name: str) -> CachedRows | None:
        """The cached rows of feature ``name`` of ``ntype`` (pulled on first use), at the
        client's version."""
        key = str(TensorKey.node(ntype, name))
        if key not in self._rows:
            ids = self.plan.ids.get(ntype)
            if ids is None or not len(ids):
                self._rows[key] = None
            else:
                space = self.client.meta(key).num_rows
                pulled = self.client.pull(key, ids)
                self._rows[key] = CachedRows(ids, pulled, space, self.client.version)
        got = self._rows[key]
        if got is not None and got.version != self.client.version:
            self._catch_up(key, got)
        return got

    def _catch_up(self, key: str, cached: CachedRows) -> None:
        """Read again, at the client's version, the cached rows of ``key`` updated since
        the version they were read at (all of them if the version went back, or if the
        store can no longer tell: a compaction folded that version into the base)."""
        v, since = self.client.version, cached.version
        stale = np.arange(len(cached.ids))
        if v is not None and since is not None and since <= v:
            try:
                slots = cached.slots(updated_since(self.client, since, key))
                stale = slots[slots >= 0]
            except StoreError:  # ``since`` was compacted into the base: not told apart
                pass
        if len(stale):
            cached.rows[stale] = self.client.pull(key, cached.ids[stale])
        cached.version = v

    @property
    def nbytes(self) -> int:
        return sum(r.rows.nbytes for r in self._rows.values() if r is not None)


def updated_since(client: KVClient, since: int, key: str) -> np.ndarray:
    """Node ids (graph ids) whose feature ``key`` was written in ``(since, the client's
    version]``, new nodes included: every partition's ``graph_changes``, asked at once."""
    s = client.session
    body = {"since": since, "features": [key]}
    pending = [s.request(p, OP_CHANGES, body) for p in range(client.num_parts)]
    got = [np.asarray(s.wait(r).tensors[0], np.int64) for r in pending]
    return np.unique(np.concatenate([np.empty(0, np.int64), *got]))


def plan_cache(
    sampler: NeighborSampler,
    book: PartitionBook,
    local_parts: list[int],
    seeds: torch.Tensor,
    batch_size: int,
    budget_bytes: int,
    row_bytes: Mapping[str, int],
    probes: int = 4,
    seed: int = 0,
    halo: np.ndarray | None = None,
) -> CachePlan:
    """The remote nodes the mini-batches of ``seeds`` (homogeneous ids) reach most often.

    Samples ``probes`` batches of ``batch_size`` seeds (spread over all of them), counts
    how often every node owned by a partition outside ``local_parts`` appears, and keeps
    the most frequent ones whose rows (``row_bytes`` per node type with the feature; types
    without it are never cached) fit ``budget_bytes``. ``halo`` (edges from each node
    into ``local_parts``, by homogeneous id) ranks the nodes the probes did not reach,
    and breaks ties among those they did; with it, remote nodes neither reached nor in
    the halo fill what budget is left."""
    empty = CachePlan({})
    if budget_bytes <= 0 or seeds.numel() == 0 or not row_bytes:
        return empty
    gen = torch.Generator().manual_seed(seed)
    shuffled = seeds[torch.randperm(seeds.numel(), generator=gen)]
    counts = np.zeros(book.num_nodes, np.int64)
    for i in range(probes):
        batch = shuffled[i * batch_size : (i + 1) * batch_size]
        if batch.numel() == 0:
            break
        sub = sampler.sample(batch, generator=seed * 1000 + i)
        node = sub.node.numpy()
        counts[node[node < book.num_nodes]] += 1  # a live graph's new nodes: never planned
    remote = np.ones(book.num_nodes, bool)
    for p in local_parts:
        lo, hi = book.node_offsets[p], book.node_offsets[p + 1]
        remote[lo:hi] = False
    # with the halo every remote node is a candidate: the unreached ones come last
    candidates = np.flatnonzero((remote & (counts > 0)) if halo is None else remote)
    types, per_type = book.to_per_type(candidates)
    cost = np.array([row_bytes.get(t, 0) for t in book.node_types], np.int64)[types]
    cached = cost > 0  # node types without the feature are never cached
    candidates, types, per_type, cost = (a[cached] for a in (candidates, types, per_type, cost))
    if halo is None:
        ranked = np.argsort(-counts[candidates], kind="stable")
    else:  # by probe count, then by halo edges (lexsort's last key is the first)
        ranked = np.lexsort((-halo[candidates], -counts[candidates]))
    keep = ranked[np.cumsum(cost[ranked]) <= budget_bytes]
    if not len(keep):
        return empty
    ids = {}
    for t, ntype in enumerate(book.node_types):
        mine = per_type[keep[types[keep] == t]]
        if len(mine):
            ids[ntype] = np.sort(mine).astype(np.int64)
    digest = hashlib.sha256(b"".join(k.encode() + v.tobytes() for k, v in ids.items()))
    return CachePlan(ids, digest.hexdigest()[:16])
