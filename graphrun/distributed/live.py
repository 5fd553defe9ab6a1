"""Following a live graph from a job: which version a trainer reads, and when it moves.

``DistGraph(ctx, follow=MODE)`` (docs/live.md):

* ``pinned`` — the head when the graph was opened, for the whole job;
* ``epoch`` — the head at each epoch's start (a loader asks it in ``__iter__``); new nodes
  whose seed mask is true (``live_seeds="train_mask"`` on the loader) join its seeds then;
* ``head`` — the head before every batch (and the seeds as ``epoch``).

A new node's id is its homogeneous id (``>= num_nodes`` of the base), also its id in its
type's space: the store routes and serves it so (a pull of ``node/<type>/<feature>``, a
``DistEmbedding`` row), it never changes as the graph grows (a rank among a type's new
nodes would: growth blocks of several partitions interleave), and it cannot be taken for
a base node of any type (base per-type ids are ``< num_nodes(t) <= num_nodes``). On a
heterograph the client asks the new nodes' types (:class:`LiveNodeTypes`) when it meets
a new node it does not know, those added since it last asked; a homogeneous graph's are
its one type, asked of no one. A new edge's type is the sampler's answer in a batch; by
its id alone (a typed ``find_edges``) it is asked of the edge's owner
(:class:`LiveEdgeTypes`), and a typed call refuses an id of another type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError
from graphrun.names import CanonicalEtype
from graphrun.partition.book import PartitionBook
from graphrun.sampling.changes import OP_NEW_EDGES
from graphrun.sampling.distributed import DistOneHopSampler
from graphrun.sampling.partitioned import BookTypeMap
from graphrun.store.client import KVClient
from graphrun.store.live import GROWTH_BLOCK, MAX_GROWTH_BLOCKS, MAX_LIVE_NODES

FOLLOW_MODES = ("head", "epoch", "pinned")


def check_follow(mode: str | None) -> str | None:
    if mode is None:
        return None
    if mode not in FOLLOW_MODES:
        raise ArgumentError(f"follow: {mode!r} is not one of {list(FOLLOW_MODES)}")
    return mode


def id_bound(client: KVClient) -> int:
    """Above every node id a followed graph may hold (the base and every growth block)."""
    view = client.live
    n = client.book.num_nodes
    return n if view is None else n + MAX_GROWTH_BLOCKS * GROWTH_BLOCK


class LiveNodeTypes:
    """The node type of each new node a heterograph's client meets: the sorted ids and
    types of the new nodes (``live_nodes``) at ``version``, asked again only when a
    look-up meets an id it does not hold, and then only for the nodes added since
    (``since``; the ids only grow, and a node's type never changes). At most
    ``MAX_LIVE_NODES`` (2^22) entries, 12 bytes each: the sequencer holds no more new
    nodes (folded ones included)."""

    def __init__(self, client: KVClient) -> None:
        self.client = client
        self.version: int | None = None
        self.ids = np.empty(0, np.int64)
        self.types = np.empty(0, np.int32)

    def of(self, ids: np.ndarray) -> np.ndarray:
        """The type index of each of ``ids`` (new nodes at the client's version)."""
        types, hit = self._find(ids)
        if not hit.all():
            self._ask()
            types, hit = self._find(ids)
        if not hit.all():
            bad, v = int(ids[~hit][0]), self.client.version
            raise ArgumentError(f"node {bad}: not a node of the live graph at version {v}")
        return types

    def _find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _find(self.ids, self.types, ids)

    def _ask(self) -> None:
        v = self.client.version
        assert v is not None  # a LiveTypeMap is made while following
        since = self.version if self.version is not None and self.version <= v else None
        got, types = self.client.live_nodes(since)
        if len(got):
            ids, first = np.unique(np.concatenate([self.ids, got]), return_index=True)
            if len(ids) > MAX_LIVE_NODES:
                raise ArgumentError(f"live_nodes: {len(ids)} new nodes, over {MAX_LIVE_NODES}")
            self.ids, self.types = ids, np.concatenate([self.types, types])[first]
        self.version = v if self.version is None else max(self.version, v)


class NewNodes:
    """Every new node at the client's version (``live_nodes``: sorted ids and types): the
    candidates a link batch draws negatives from beside the base nodes. Asked again when
    the version moves, then only for the nodes added since (the ids only grow); every
    one when it moved back (a sampler worker's task at an older version), so that a
    batch's candidates are exactly those at its version, whoever builds it."""

    def __init__(self, client: KVClient) -> None:
        self.client = client
        self.version: int | None = None
        self.ids = np.empty(0, np.int64)
        self.types = np.empty(0, np.int32)

    def of_type(self, t: int) -> np.ndarray:
        """The sorted ids of the new nodes of type index ``t`` at the client's version."""
        v = self.client.version
        if v is None:  # not following: the base only
            return self.ids[:0]
        if v != self.version:
            grows = self.version is not None and self.version < v
            got, types = self.client.live_nodes(self.version if grows else None)
            if grows:
                ids, first = np.unique(np.concatenate([self.ids, got]), return_index=True)
                got, types = ids, np.concatenate([self.types, types])[first]
            self.ids, self.types, self.version = got, types, v
        return self.ids[self.types == t]


def _find(table: np.ndarray, types: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(type, held)`` of each of ``ids`` in a table of sorted ids and their types."""
    if len(table) == 0:
        return np.zeros(len(ids), np.int32), np.zeros(len(ids), bool)
    pos = np.searchsorted(table, ids).clip(max=len(table) - 1)
    return types[pos], table[pos] == ids


#: The most new edges' types a :class:`LiveEdgeTypes` keeps (12 bytes each).
MAX_LIVE_EDGE_TYPES = 1 << 22


class LiveEdgeTypes:
    """The edge type of each new edge a heterograph's client looks up by its id alone (a
    typed ``find_edges``; a batch's come with the sampler's answer): the ids it does not
    hold are asked of their owners (``ask``: ``graph_edge_types`` at the client's version,
    which refuses an id that is no edge there), and kept, an edge's type never changing.
    At most :data:`MAX_LIVE_EDGE_TYPES` entries: past it, the table keeps the last
    look-up's. Not a table of every new edge: a live graph's grow without bound."""

    def __init__(self, ask: Callable[[np.ndarray], np.ndarray]) -> None:
        self.ask = ask
        self.ids = np.empty(0, np.int64)
        self.types = np.empty(0, np.int32)

    def of(self, eids: np.ndarray) -> np.ndarray:
        """The type index of each of ``eids`` (new edges at the client's version)."""
        types, hit = _find(self.ids, self.types, eids)
        if hit.all():
            return types
        miss = np.unique(eids[~hit])
        got = np.asarray(self.ask(miss), np.int32)
        types[~hit] = got[np.searchsorted(miss, eids[~hit])]
        ids, types_held = np.concatenate([self.ids, miss]), np.concatenate([self.types, got])
        if len(ids) > MAX_LIVE_EDGE_TYPES:
            ids, types_held = miss, got
        order = np.argsort(ids, kind="stable")
        self.ids, self.types = ids[order], types_held[order]
        return types


@dataclass(frozen=True)
class LiveTypeMap(BookTypeMap):
    """The book's type map, with new nodes and edges (ids at or above the base's counts):
    a node of the type ``nodes`` says (a heterograph's), or of the one node type; an edge
    of the type its sampler answered (``known``: ``SampledSubgraph.edge_type``, which
    :func:`~graphrun.sampling.pyg.split_by_type` passes), else of the type ``edges`` says
    (a graph of several edge types), or of the one. A new node's (edge's) per-type id is
    its id: :meth:`to_homo` and :meth:`etype_to_homo` take it as such once it is of the
    type named, and refuse it otherwise."""

    nodes: LiveNodeTypes | None = None
    edges: LiveEdgeTypes | None = None

    def nodes_per_type(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        t, per = self._split(ids, self.book.num_nodes, super().nodes_per_type)
        if self.nodes is not None:
            grow = ids >= self.book.num_nodes
            if bool(grow.any()):
                t[grow] = torch.from_numpy(self.nodes.of(ids[grow].numpy()).astype(np.int64))
        return t, per

    def edges_per_type(self, ids: Tensor, known: Tensor | None = None) -> tuple[Tensor, Tensor]:
        t, per = self._split(ids, self.book.num_edges, super().edges_per_type)
        grow = ids >= self.book.num_edges
        if known is not None:
            t[grow] = known[grow]
        elif self.edges is not None and bool(grow.any()):
            t[grow] = torch.from_numpy(self.edges.of(ids[grow].numpy()).astype(np.int64))
        return t, per

    def to_homo(self, ntype: str, ids: np.ndarray) -> np.ndarray:
        out = to_homo(self.book, ntype, ids)
        grow = out >= self.book.num_nodes
        if self.nodes is not None and grow.any():
            t = self.book.ntype_id(ntype)
            _of_type(self.nodes.of(out[grow]), t, out[grow], "node", ntype, self.book.node_types)
        return out

    def etype_to_homo(self, etype: CanonicalEtype | str, ids: np.ndarray) -> np.ndarray:
        out = etype_to_homo(self.book, etype, ids)
        grow = out >= self.book.num_edges
        if self.edges is not None and grow.any():
            r = self.book.etype_id(etype)
            names = [":".join(e) for e in self.book.edge_types]
            _of_type(self.edges.of(out[grow]), r, out[grow], "edge", names[r], names)
        return out

    @staticmethod
    def _split(
        ids: Tensor, base: int, of_base: Callable[[Tensor], tuple[Tensor, Tensor]]
    ) -> tuple[Tensor, Tensor]:
        grow = ids >= base
        if not bool(grow.any()):
            return of_base(ids)
        t = torch.zeros(ids.numel(), dtype=torch.long)
        per = ids.clone()
        old = ~grow
        if bool(old.any()):
            t[old], per[old] = of_base(ids[old])
        return t, per


def _of_type(
    got: np.ndarray, want: int, ids: np.ndarray, what: str, name: str, names: Sequence[str]
) -> None:
    """ArgumentError naming the first of ``ids`` whose type ``got`` is not ``want``."""
    bad = np.flatnonzero(got != want)
    if len(bad):
        i = int(bad[0])
        raise ArgumentError(f"{what} {int(ids[i])} is a new {what} of type "
                            f"{names[int(got[i])]!r}, not of {name!r}")  # fmt: skip


def type_map(client: KVClient, book: PartitionBook, sampler: DistOneHopSampler) -> BookTypeMap:
    """The type map a client's batches are collated with: the book's, or while it follows
    a live graph a :class:`LiveTypeMap` (asking new nodes' types on a heterograph, new
    edges' where there are several edge types, through ``sampler``)."""
    if client.live is None:
        return BookTypeMap(book)
    nodes = LiveNodeTypes(client) if len(book.node_types) > 1 else None
    edges = None
    if len(book.edge_types) > 1:
        edges = LiveEdgeTypes(lambda e: sampler.edge_types(torch.from_numpy(e)).numpy())
    return LiveTypeMap(book, nodes, edges)


def to_homo(book: PartitionBook, ntype: str, ids: np.ndarray) -> np.ndarray:
    """Homogeneous ids of per-type ids of ``ntype``: a new node's (``>= num_nodes``) is
    itself; a base node's the book's (which refuses one past the type's count)."""
    return _past(ids, book.num_nodes, lambda base: book.to_homo(ntype, base))


def etype_to_homo(book: PartitionBook, etype: CanonicalEtype | str, ids: np.ndarray) -> np.ndarray:
    """Homogeneous ids of per-type edge ids of ``etype``, new edges' the same way."""
    return _past(ids, book.num_edges, lambda base: book.etype_to_homo(etype, base))


def _past(ids: np.ndarray, first: int, of_base: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    arr = np.asarray(ids)
    grow = arr >= first
    if not grow.any():
        return of_base(arr)
    out = arr.astype(np.int64, copy=True)
    out[~grow] = of_base(arr[~grow])
    return out


def new_seeds(
    client: KVClient, mask: str, seen: np.ndarray, rank: int = 0, world_size: int = 1,
    ntype: str | None = None,
) -> tuple[Tensor, np.ndarray]:  # fmt: skip
    """This trainer's share of the new nodes of ``ntype`` (default: the first node type)
    at the client's version whose feature ``mask`` is true and that are not in ``seen``
    (their ids, also their per-type ids), and ``seen`` with them: every trainer gets as
    many (:func:`share`), so that their epochs stay as long."""
    ids, types = client.live_nodes()
    ntype = ntype or client.book.node_types[0]
    ids = ids[types == client.book.ntype_id(ntype)]
    if len(ids) == 0:
        return torch.empty(0, dtype=torch.long), seen
    on = np.asarray(client.pull(f"node/{ntype}/{mask}", ids)).reshape(len(ids), -1).any(axis=1)
    fresh = ids[on & ~np.isin(ids, seen)]
    return torch.from_numpy(share(fresh, rank, world_size)), np.union1d(seen, fresh)


def new_positives(
    client: KVClient, etype: int, since: int | None, seen: np.ndarray, rank: int = 0,
    world_size: int = 1, keep: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[Tensor, np.ndarray]:  # fmt: skip
    """This trainer's share of the new edges of type index ``etype`` at the client's
    version added after version ``since`` (None: every one; more after a compaction)
    that are not in ``seen`` and that ``keep`` keeps (a mask: a link loader's training
    split), their ids, also their per-type ids; and ``seen`` with every one asked:
    every partition's ``graph_new_edges``, asked at once; as many for every trainer
    (:func:`share`)."""
    s = client.session
    body = {"since": -1 if since is None else since, "etype": etype}
    pending = [s.request(p, OP_NEW_EDGES, body) for p in range(client.num_parts)]
    got = [np.asarray(s.wait(r).tensors[0], np.int64) for r in pending]
    eids = np.unique(np.concatenate([np.empty(0, np.int64), *got]))
    eids = eids[~np.isin(eids, seen)]
    fresh = eids if keep is None or len(eids) == 0 else eids[keep(eids)]
    return torch.from_numpy(share(fresh, rank, world_size)), np.union1d(seen, eids)


def share(fresh: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Trainer ``rank``'s part of ``fresh``: every ``world_size``-th id from its rank, and
    as many for every trainer (``ceil(n / world_size)``: the shorter parts wrap around)."""
    n = len(fresh)
    if n == 0:
        return fresh
    per = -(-n // world_size)
    return fresh[(rank + world_size * np.arange(per)) % n]
