"""One write batch of :class:`~graphrun.distributed.writer.GraphWriter` laid out over the
partitions: where its new nodes go (LDG), who owns each new edge, deletion and update,
the ids ``live_begin`` gave them, and each partition's :class:`~graphrun.store.live.Piece`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import numpy as np

from graphrun.errors import ArgumentError, StoreError
from graphrun.names import TensorKey
from graphrun.names import owners as base_owners
from graphrun.partition.streaming import Neighbours, assign, capacity_for
from graphrun.store.live import GROWTH_BLOCK, Piece, Rows
from graphrun.store.live_client import LiveView
from graphrun.store.live_index import run_ids
from graphrun.store.live_wire import PieceWire, end_dtype

if TYPE_CHECKING:
    from graphrun.partition.book import PartitionBook

MASKED_PARTS = 4  # up to this many partitions, a mask each beats a sort (and a search)
_NONE = np.empty(0, np.int64)


class Writer(Protocol):
    """What a plan asks of its :class:`~graphrun.distributed.writer.GraphWriter`."""

    book: PartitionBook

    def lookup(self, orig_ids: Any) -> np.ndarray: ...

    def view(self, fresh: bool = False) -> LiveView: ...


@dataclass
class WriteBatch:
    """What a writer added since its last commit."""

    orig: list[np.ndarray] = field(default_factory=list)
    ntype: list[np.ndarray] = field(default_factory=list)
    feats: dict[str, list[np.ndarray]] = field(default_factory=dict)  # key -> rows per add
    edges: list[tuple[int, np.ndarray, np.ndarray, bool]] = field(default_factory=list)
    edge_feats: dict[str, list[np.ndarray]] = field(default_factory=dict)
    deleted: list[np.ndarray] = field(default_factory=list)
    updates: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)

    def rows(self) -> int:
        n = sum(len(a) for a in self.orig) + sum(len(e[1]) for e in self.edges)
        return n + sum(len(a) for a in self.deleted) + sum(len(u[1]) for u in self.updates)


class Plan:
    """One batch laid out over the partitions: who owns each new node and edge, their
    ids once ``live_begin`` gave them, and each partition's :class:`Piece`."""

    def __init__(self, w: Writer, b: WriteBatch, view: LiveView) -> None:
        book = w.book
        self.writer = w
        self.book, self.view, self.batch = book, view, b
        self.num_parts = book.num_parts
        self.orig = _cat(b.orig, np.int64)
        self.ntype = _cat(b.ntype, np.int32)
        if len(self.orig) and len(np.unique(self.orig)) != len(self.orig):
            raise ArgumentError("add_nodes: the batch's original ids repeat")
        self.etype = _cat([np.full(len(e[1]), e[0], np.int32) for e in b.edges], np.int32)
        ends = [self._ends(e[1], e[2], e[3], w) for e in b.edges]
        self.src = _cat([e[0] for e in ends], np.int64)  # new nodes: -(i + 1)
        self.dst = _cat([e[1] for e in ends], np.int64)
        dst_part = [e[2] for e in ends if e[2] is not None]  # graph ids': known already
        if len(book.node_types) > 1:  # one node type: every end has it
            self._check_types()
        self.node_part = self._place() if len(self.orig) else np.empty(0, np.int64)
        if len(dst_part) == len(ends):
            self.edge_part = _cat(dst_part, np.int64)
        else:
            self.edge_part = self._owner(self.dst)
        self.deleted = _cat(b.deleted, np.int64)
        self.deleted_part = self._edge_owner(self.deleted) if len(self.deleted) else _NONE
        self.node_id = np.empty(0, np.int64)
        self._eids: list[list[tuple[int, int]]] = []  # each partition's new edges' id runs
        self._by_part: list[list[np.ndarray]] | None = None  # made once ids are given

    def _place(self) -> np.ndarray:
        """The partition of each new node (LDG under the capacity rule)."""
        sizes = np.diff(self.book.node_offsets).astype(np.int64)
        sizes += np.bincount(self.view.node_owner, minlength=self.num_parts) * GROWTH_BLOCK
        placed = Neighbours.from_lists(self._neighbour_parts())
        capacity = capacity_for(sizes, len(self.orig))
        return assign(placed, sizes, capacity, within=self._within())

    def _ends(
        self, src: np.ndarray, dst: np.ndarray, orig: bool, w: Writer
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Both ends as graph ids (the batch's new nodes ``-(i + 1)``), and the owners of
        ``dst`` when they are known already (graph ids: no new node among them)."""
        if not orig and _base_only(src, dst, self.book.node_offsets[-1]):
            return src, dst, _inner_owners(self.book.node_offsets, dst)  # the common case
        both = np.concatenate([src, dst])
        dst_owner = None
        if orig:
            order = np.argsort(self.orig)
            pos = np.minimum(np.searchsorted(self.orig[order], both), max(len(order) - 1, 0))
            new = self.orig[order][pos] == both if len(order) else np.zeros(len(both), bool)
            out = w.lookup(both)
            out[new] = -(order[pos[new]] + 1)
            what = "original id"
            known = (out < 0) | self._owner(np.maximum(out, 0), strict=False) >= 0
            known &= (out >= -len(self.orig) - 1) & ~((out == -1) & ~np.isin(both, self.orig))
        else:  # graph ids: a negative one is no node (the batch's new nodes: -(i + 1))
            out, what = both, "graph id"
            owner = self._owner(np.maximum(out, 0), strict=False)
            known = (owner >= 0) & (out >= 0)
            dst_owner = owner[len(src) :]
        if not known.all():
            i = int(np.flatnonzero(~known)[0])
            end = "src" if i < len(src) else "dst"
            raise ArgumentError(f"add_edges {end}: {what} {int(both[i])} is not a node of the "
                                "graph or of this batch")  # fmt: skip
        return out[: len(src)], out[len(src) :], dst_owner

    def _owner(self, ids: np.ndarray, strict: bool = True) -> np.ndarray:
        """The partition of each node id (new nodes of the batch: -(i+1), once placed)."""
        from graphrun.store.live import id_owners

        self._known(ids, nodes=True)
        out = id_owners(ids, self.book.node_offsets, self.view.num_nodes, self.view.node_owner)
        new = ids < 0
        if new.any() and hasattr(self, "node_part"):
            out[new] = self.node_part[-ids[new] - 1]
        if strict and (out < 0).any():
            raise ArgumentError(f"id {int(ids[np.flatnonzero(out < 0)[0]])} has no owner")
        return out

    def _edge_owner(self, eids: np.ndarray) -> np.ndarray:
        from graphrun.store.live import id_owners

        self._known(eids, nodes=False)
        out = id_owners(eids, self.book.edge_offsets, self.view.num_edges, self.view.edge_owner)
        if (out < 0).any():
            i = int(np.flatnonzero(out < 0)[0])
            raise ArgumentError(f"delete_edges: eid {int(eids[i])} is not an edge of the graph")
        return out

    def _known(self, ids: np.ndarray, nodes: bool) -> None:
        """The head again if an id is in a growth block the writer's view predates."""
        v = self.view
        first, owner = (v.num_nodes, v.node_owner) if nodes else (v.num_edges, v.edge_owner)
        if len(ids) and int(ids.max()) >= first + len(owner) * GROWTH_BLOCK:
            self.view = self.writer.view(fresh=True)

    def _check_types(self) -> None:
        """Each end of a new edge has its edge type's node type (new nodes of this batch
        and base nodes; a node added earlier is checked by its owner)."""
        ends = [(s, d) for s, _, d in self.book.edge_types]
        for col, ids in ((0, self.src), (1, self.dst)):
            want = np.asarray([self.book.ntype_id(e[col]) for e in ends], np.int32)[self.etype]
            got = np.full(len(ids), -1, np.int32)
            new = ids < 0
            got[new] = self.ntype[-ids[new] - 1]
            base = (ids >= 0) & (ids < self.view.num_nodes)
            if base.any():
                got[base] = self.book.to_per_type(ids[base])[0]
            bad = (got >= 0) & (got != want)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ArgumentError(f"add_edges: edge {i}'s {('src', 'dst')[col]} has node "
                                    f"type {self.book.node_types[got[i]]!r}, its edge type "
                                    f"needs {self.book.node_types[want[i]]!r}")  # fmt: skip

    def _neighbour_parts(self) -> list[np.ndarray]:
        """The partitions of each new node's neighbours in the batch (placed ones)."""
        a = np.concatenate([self.src, self.dst])
        b = np.concatenate([self.dst, self.src])
        keep = (a < 0) & (b >= 0)
        node, other = -a[keep] - 1, self._owner(b[keep])
        order = np.argsort(node, kind="stable")
        cuts = np.searchsorted(node[order], np.arange(len(self.orig) + 1))
        return [other[order[cuts[i] : cuts[i + 1]]] for i in range(len(self.orig))]

    def _within(self) -> Neighbours:
        """Each new node's neighbours among the batch's new nodes (batch indices)."""
        a = np.concatenate([self.src, self.dst])
        b = np.concatenate([self.dst, self.src])
        keep = (a < 0) & (b < 0) & (a != b)
        return Neighbours.from_pairs(-a[keep] - 1, -b[keep] - 1, len(self.orig))

    def node_counts(self) -> list[int]:
        return [len(pos) for pos in self._split()[0]]

    def edge_counts(self) -> list[int]:
        return [len(pos) for pos in self._split()[1]]

    def orig_by_part(self) -> np.ndarray:
        return np.ascontiguousarray(self.orig[self._node_order()]) if len(self.orig) else self.orig

    def _node_order(self) -> np.ndarray:
        """The new nodes' positions in partition order (the batch's order within one):
        :meth:`_split`'s, one after the other."""
        return np.concatenate(self._split()[0])

    def give_ids(self, node_runs: list[Any], edge_runs: list[Any]) -> None:
        """The ids ``live_begin`` handed out, in partition order; then the ends."""
        nodes, edges, _ = self._split()
        self.node_id = _spread(nodes, node_runs, len(self.node_part))
        self._eids = _counted(edges, edge_runs)
        for ends in (self.src, self.dst) if len(self.orig) else ():
            new = ends < 0
            ends[new] = self.node_id[-ends[new] - 1]

    def parts(self) -> list[int]:
        used = {p for kind in self._split() for p, pos in enumerate(kind) if len(pos)}
        for k, i, _ in self.batch.updates:
            used.update(np.unique(self._update_owner(k, i)).tolist())
        return sorted(used)

    def _update_owner(self, key: str, ids: np.ndarray) -> np.ndarray:
        from graphrun.names import owners
        from graphrun.store.live import block_owner_of

        k = TensorKey.parse(key)
        assert k is not None
        ranges = self.book.node_ranges(k.type)
        self._known(ids, nodes=True)
        n = self.view.num_nodes
        out = np.full(len(ids), -1, np.int64)
        base = (ids >= 0) & (ids < ranges[-1])
        out[base] = owners(ranges, ids[base])
        grow = ids >= n
        out[grow] = block_owner_of(ids[grow], n, self.view.node_owner)
        if (out < 0).any():
            i = int(np.flatnonzero(out < 0)[0])
            raise ArgumentError(f"update_features {key}: id {int(ids[i])} is not a row of it")
        return out

    def piece(self, p: int, version: int) -> Piece:
        """Partition ``p``'s piece of the batch at ``version``."""
        a = self._arrays(p)

        def rows(x: np.ndarray | None) -> Rows | None:
            return None if x is None else Rows.of(x)

        return Piece(
            version=version, new_nodes=rows(a.nodes), node_types=rows(a.ntypes),
            node_orig=rows(a.orig), new_edges=rows(a.edges), edge_ids=a.edge_ids,
            edge_types=rows(a.etypes), deleted_edges=rows(a.deleted),
            node_features={k: Rows.of(r) for k, r in a.node_feats.items()},
            edge_features={k: Rows.of(r) for k, r in a.edge_feats.items()},
            updates={k: (Rows.of(i), Rows.of(r)) for k, (i, r) in a.updates.items()},
        )  # fmt: skip

    def wire(self, p: int, version: int) -> tuple[dict[str, object], list[np.ndarray]]:
        """``live_prepare``'s body and tensors of :meth:`piece` (its arrays as they are:
        no copy into bytes)."""
        return self._wire(self._arrays(p), version, [])

    def folded(self) -> tuple[dict[str, object], list[np.ndarray]] | None:
        """Partition 0's piece for ``live_begin`` to carry, before any id is given (None:
        the batch has none there): no ``new_nodes`` (the sequencer fills in its run), new
        edges as ``[2, m]`` src, dst (it adds their ids), a new node of the batch among
        the ends as ``-(k + 1)``, ``k`` its place in :meth:`orig_by_part`; the tensors
        numbered from 1 (tensor 0 is :meth:`orig_by_part`)."""
        if 0 not in self.parts():
            return None
        return self._wire(self._arrays(0, numbered=False), 0, [self.orig[:0]])

    def _wire(
        self, a: _PieceArrays, version: int, tensors: list[np.ndarray]
    ) -> tuple[dict[str, object], list[np.ndarray]]:
        """The body of ``a`` at ``version``, its arrays appended to ``tensors`` (the
        body names their indexes); the tensors past those given."""
        first = len(tensors)

        def put(x: np.ndarray) -> int:
            tensors.append(np.ascontiguousarray(x))
            return len(tensors) - 1

        def maybe(x: np.ndarray | None) -> int | None:
            return None if x is None else put(x)

        wire = PieceWire(
            version=version, new_nodes=maybe(a.nodes), node_types=maybe(a.ntypes),
            node_orig=maybe(a.orig), new_edges=maybe(a.edges), edge_ids=a.edge_ids,
            edge_types=maybe(a.etypes), deleted_edges=maybe(a.deleted),
            node_features={k: put(r) for k, r in a.node_feats.items()},
            edge_features={k: put(r) for k, r in a.edge_feats.items()},
            updates={k: (put(i), put(r)) for k, (i, r) in a.updates.items()},
        )  # fmt: skip
        return msgspec.to_builtins(wire), tensors[first:]

    def _split(self) -> list[list[np.ndarray]]:
        """Each partition's new nodes, edges and deletions (positions, in batch order),
        made once (:func:`_by_part`); their lengths are the counts ``live_begin`` asks."""
        if self._by_part is None:
            kinds = (self.node_part, self.edge_part, self.deleted_part)
            self._by_part = [_by_part(part, self.num_parts) for part in kinds]
        return self._by_part

    def _edge_rows(self, pos: np.ndarray) -> np.ndarray | None:
        """``[src, dst]`` of new edges (at ``pos``), gathered in place (int32 where the
        graph's ids fit: :func:`end_dtype`; every end is a node id the plan checked);
        their ids travel as runs beside them (``edge_ids``: ``live_begin``'s), not a row."""
        if not len(pos):
            return None
        out = np.empty((2, len(pos)), end_dtype(self.book.num_nodes))
        np.take(self.src, pos, out=out[0])
        np.take(self.dst, pos, out=out[1])
        return out

    def _unnumbered_ends(self, pos: np.ndarray) -> np.ndarray | None:
        """``[src, dst]`` of new edges at ``pos`` before ids are given: a new node of the
        batch as ``-(k + 1)``, ``k`` its place in :meth:`orig_by_part` (see :meth:`folded`)."""
        if not len(pos):
            return None
        out = np.empty((2, len(pos)), end_dtype(self.book.num_nodes))
        np.take(self.src, pos, out=out[0])
        np.take(self.dst, pos, out=out[1])
        new = out < 0 if len(self.orig) else None  # no new node: no end to renumber
        if new is not None and new.any():
            place = np.empty(len(self.orig), np.int64)
            place[self._node_order()] = np.arange(len(self.orig))
            out[new] = -place[-out[new] - 1] - 1
        return out

    def _arrays(self, p: int, numbered: bool = True) -> _PieceArrays:
        """Partition ``p``'s piece as arrays; not ``numbered``: before ids are given
        (no new nodes' ids or edge ids, new nodes among the ends as :meth:`folded` names
        them). No edge types where the graph has one: each new edge is type 0."""
        nodes, edges, deleted = (pos[p] for pos in self._split())
        b = self.batch
        node_feats = _rows_of(b.feats, self.ntype, nodes, lambda k: self.book.ntype_id(k.type))
        edge_feats = _rows_of(b.edge_feats, self.etype, edges,
                              lambda k: self.book.etype_id(k.type))  # fmt: skip
        updates = {}
        for key, ids, vals in b.updates:
            here = self._update_owner(key, ids) == p
            if here.any():
                updates[key] = (ids[here], vals[here])

        def some(x: np.ndarray, pos: np.ndarray) -> np.ndarray | None:
            return x[..., pos] if len(pos) else None

        node_ids = some(self.node_id, nodes) if numbered else None
        new_edges = self._edge_rows(edges) if numbered else self._unnumbered_ends(edges)
        eids = self._eids[p] if numbered and len(edges) else None
        etypes = some(self.etype, edges) if len(self.book.edge_types) > 1 else None
        return _PieceArrays(
            node_ids, some(self.ntype, nodes), some(self.orig, nodes),
            new_edges, eids, etypes, some(self.deleted, deleted),
            node_feats, edge_feats, updates,
        )  # fmt: skip


@dataclass
class _PieceArrays:
    """One partition's piece as arrays (None: none of that kind)."""

    nodes: np.ndarray | None
    ntypes: np.ndarray | None
    orig: np.ndarray | None
    edges: np.ndarray | None  # [2, m] src, dst
    edge_ids: list[tuple[int, int]] | None  # their ids: (start, count) runs
    etypes: np.ndarray | None
    deleted: np.ndarray | None
    node_feats: dict[str, np.ndarray]
    edge_feats: dict[str, np.ndarray]
    updates: dict[str, tuple[np.ndarray, np.ndarray]]


def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    """One array of ``parts`` (the plan's own: a single part is not copied again)."""
    if len(parts) == 1:
        return parts[0].astype(dtype, copy=False)
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)


def _base_only(src: np.ndarray, dst: np.ndarray, n: int) -> bool:
    """Whether every end is a base node's graph id (in ``[0, n)``): nothing to look up,
    no new node, the owners by the partitions' ranges (the ends are not copied)."""
    return bool(len(src)) and min(src.min(), dst.min()) >= 0 and max(src.max(), dst.max()) < n


def _inner_owners(bounds: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """:func:`~graphrun.names.owners` of ids known to lie in ``[bounds[0], bounds[-1])``:
    for a few blocks, the count of inner bounds at or below each id (a comparison a
    bound, a sixth of a binary search's CPU for 10k ids over 2 partitions)."""
    if len(bounds) > MASKED_PARTS + 1:
        return base_owners(bounds, ids)
    out = np.zeros(len(ids), np.int64)
    for b in bounds[1:-1]:
        out += ids >= b
    return out


def _by_part(part: np.ndarray, num_parts: int) -> list[np.ndarray]:
    """The positions of each partition's items in ``part``, in order: for a few
    partitions a mask each (a third of a sort's CPU for 2), else one stable sort (int16
    where the partitions fit: a radix sort), cut by the counts."""
    if not len(part):
        return [part[:0]] * num_parts
    if num_parts <= MASKED_PARTS:
        return [np.flatnonzero(part == p) for p in range(num_parts)]
    small = np.int16 if num_parts <= np.iinfo(np.int16).max else np.int64
    order = np.argsort(part.astype(small), kind="stable")
    cuts = [0, *np.cumsum(np.bincount(part, minlength=num_parts)).tolist()]
    return [order[cuts[p] : cuts[p + 1]] for p in range(num_parts)]


def _counted(by_part: list[np.ndarray], runs: list[Any]) -> list[list[tuple[int, int]]]:
    """Each partition's ``(start, count)`` runs, ``runs[p]``, as many ids as its items
    (``by_part[p]``); StoreError otherwise."""
    if len(runs) != len(by_part):
        raise StoreError(f"live_begin: ids for {len(runs)} partitions, asked {len(by_part)}")
    out = [[(int(s), int(c)) for s, c in r] for r in runs]
    for p, mine in enumerate(by_part):
        if sum(c for _, c in out[p]) != len(mine):
            raise StoreError(f"live_begin: {sum(c for _, c in out[p])} ids for partition "
                             f"{p}, asked {len(mine)}")  # fmt: skip
    return out


def _spread(by_part: list[np.ndarray], runs: list[Any], n: int) -> np.ndarray:
    """Ids per item: partition ``p``'s items (positions ``by_part[p]``, in order) take
    ``runs[p]``'s ids."""
    out = np.empty(n, np.int64)
    for mine, r in zip(by_part, _counted(by_part, runs), strict=True):
        out[mine] = run_ids(r)
    return out


def _rows_of(
    feats: dict[str, list[np.ndarray]], types: np.ndarray, pos: np.ndarray, type_of: Any
) -> dict[str, np.ndarray]:
    """Each feature's rows of the items at positions ``pos`` (in order), if any."""
    out: dict[str, np.ndarray] = {}
    if not feats:
        return out
    mine = np.zeros(len(types), bool)
    mine[pos] = True
    for key, chunks in feats.items():
        k = TensorKey.parse(key)
        assert k is not None
        of_type = types == type_of(k)
        rows = np.concatenate(chunks)[mine[of_type]]
        if len(rows):
            out[key] = rows
    return out
