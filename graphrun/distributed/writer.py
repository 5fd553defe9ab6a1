"""``GraphWriter``: write a live store's graph — new nodes and edges, deletions, updates.

    from graphrun.distributed.writer import GraphWriter
    w = GraphWriter(client)                      # a KVClient opened with a write_graph key
    w.add_nodes("paper", orig_ids, {"feat": rows, "label": labels})
    w.add_edges("cites", src, dst, orig=True)    # ends named by original ids
    w.delete_edges("cites", eids)
    w.update_features("paper", "feat", ids, rows)
    version = w.commit()                         # wholly visible at ``version``, or not at all

A batch is what was added since the last ``commit``. Ids: graph ids are homogeneous ids
(what the sampler returns); a new node's id is allocated at commit
(:mod:`graphrun.store.live`), so a batch names its new nodes by their original ids —
``orig=True`` in ``add_edges`` resolves both ends by original id, new nodes of this batch
included; :meth:`GraphWriter.lookup` gives graph ids afterwards.

``commit`` runs the two-phase commit of :mod:`graphrun.store.live_ops`: ``live_begin``
(a version and ids), ``live_prepare`` of each partition's piece in parallel (checked
wholly there; a partition past 3/4 of its delta bound answers ``retry_after`` and the
piece is sent again after that wait: slowed, not dropped), then ``live_decide`` (the
acknowledgement) and ``live_commit`` to the partitions. Any refusal aborts the version:
nothing of the batch is applied, and the error is raised. Bad arguments are refused
when given (one ArgumentError naming the field), before anything is sent.

Where a new node goes: LDG (:func:`graphrun.partition.streaming.assign`) from the
partitions of its batch's placed neighbours and of the batch's earlier new nodes, under
the capacity rule ``ceil(1.05 n / P)`` (:func:`~graphrun.partition.streaming.capacity_for`;
a partition's size counts its base nodes and its growth blocks whole).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphrun.errors import ArgumentError, StoreError
from graphrun.names import TensorKey, etype_key
from graphrun.partition.streaming import Neighbours, assign, capacity_for
from graphrun.store.client import KVClient
from graphrun.store.live import LIVE_DECIDE_TIMEOUT_S, MAX_PIECE_ROWS, Piece, Rows, run_ids
from graphrun.store.live_client import LiveView, fetch_head
from graphrun.store.live_ops import piece_to_wire

log = logging.getLogger("graphrun.distributed")


@dataclass
class _Batch:
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


class GraphWriter:
    """Writes batches to a live store through ``client`` (see the module docstring)."""

    def __init__(self, client: KVClient, retry_timeout: float = LIVE_DECIDE_TIMEOUT_S / 2):
        self.client = client
        self.book = client.book
        self.retry_timeout = retry_timeout
        self._batch = _Batch()
        self.waited_s = 0.0  # time spent slowed by backpressure

    # ---- building a batch

    def _feature(self, key: TensorKey, rows: Any, n: int, what: str) -> np.ndarray:
        ti = self.client.meta(str(key))
        a = np.asarray(rows)
        want = (n, *ti.row_shape)
        if a.dtype != np.dtype(ti.dtype) or a.shape != want:
            raise ArgumentError(f"{what}: got {a.dtype} {a.shape}, expected {ti.dtype} {want}")
        return np.ascontiguousarray(a)

    def _features_of(self, kind: str, type_: str) -> list[str]:
        out = []
        for ti in self.client.list_tensors():
            key = TensorKey.parse(ti.name)
            if ti.job == "" and key is not None and key.kind == kind and key.type == type_:
                out.append(key.name)
        return sorted(out)

    def _room(self, n: int) -> None:
        if self._batch.rows() + n > MAX_PIECE_ROWS:
            raise ArgumentError(f"batch: more than {MAX_PIECE_ROWS} rows; commit() first")

    def add_nodes(
        self, ntype: str, orig_ids: Any, features: dict[str, Any], label: Any = None
    ) -> None:
        """New nodes of ``ntype`` named by their original ids, with every node feature of
        the type (``label``: the feature ``label``, for short)."""
        t = self.book.ntype_id(ntype)
        orig = np.asarray(orig_ids)
        if orig.ndim != 1 or orig.dtype.kind not in "iu":
            raise ArgumentError(f"orig_ids: expected 1-d integer ids, got {orig.dtype} "
                                f"{orig.shape}")  # fmt: skip
        self._room(len(orig))
        given = dict(features)
        if label is not None:
            given["label"] = label
        names = self._features_of("node", ntype)
        missing = sorted(set(names) - set(given))
        if missing:
            raise ArgumentError(f"features: {missing} of node type {ntype!r} are missing")
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ArgumentError(f"features: {unknown} are not features of node type {ntype!r}")
        rows = {
            str(TensorKey.node(ntype, n)): self._feature(
                TensorKey.node(ntype, n), given[n], len(orig), f"features[{n!r}]"
            )
            for n in names
        }
        b = self._batch
        b.orig.append(orig.astype(np.int64))
        b.ntype.append(np.full(len(orig), t, np.int32))
        for key, r in rows.items():
            b.feats.setdefault(key, []).append(r)

    def add_edges(
        self, etype: Any, src: Any, dst: Any, features: dict[str, Any] | None = None,
        orig: bool = False,
    ) -> None:  # fmt: skip
        """New edges ``src -> dst`` of ``etype``: graph ids, or original ids (``orig``)."""
        r = self.book.etype_id(etype)
        key = etype_key(self.book.edge_types[r])
        s, d = np.asarray(src), np.asarray(dst)
        ints = s.dtype.kind in "iu" and d.dtype.kind in "iu"
        if s.ndim != 1 or d.shape != s.shape or not ints:
            raise ArgumentError(f"src, dst: expected two 1-d integer arrays of one length, got "
                                f"{s.dtype} {s.shape} and {d.dtype} {d.shape}")  # fmt: skip
        self._room(len(s))
        names = self._features_of("edge", key)
        given = dict(features or {})
        if sorted(given) != names:
            raise ArgumentError(f"features: edge type {key} has features {names}, "
                                f"got {sorted(given)}")  # fmt: skip
        rows = {
            str(TensorKey.edge(key, n)): self._feature(
                TensorKey.edge(key, n), given[n], len(s), f"features[{n!r}]"
            )
            for n in names
        }  # all checked before any is kept
        for k, got in rows.items():
            self._batch.edge_feats.setdefault(k, []).append(got)
        self._batch.edges.append((r, s.astype(np.int64), d.astype(np.int64), orig))

    def delete_edges(self, etype: Any, eids: Any) -> None:
        """Delete edges ``eids`` (graph edge ids) of ``etype``."""
        self.book.etype_id(etype)
        e = np.asarray(eids)
        if e.ndim != 1 or e.dtype.kind not in "iu":
            raise ArgumentError(f"eids: expected 1-d integer ids, got {e.dtype} {e.shape}")
        self._room(len(e))
        self._batch.deleted.append(e.astype(np.int64))

    def update_features(self, ntype: str, name: str, ids: Any, rows: Any) -> None:
        """Overwrite rows ``ids`` (the type's ids; a new node's is its graph id) of node
        feature ``name`` of ``ntype``."""
        self.book.ntype_id(ntype)
        key = TensorKey.node(ntype, name)
        i = np.asarray(ids)
        if i.ndim != 1 or i.dtype.kind not in "iu":
            raise ArgumentError(f"ids: expected 1-d integer ids, got {i.dtype} {i.shape}")
        self._room(len(i))
        vals = self._feature(key, rows, len(i), f"rows of {key}")
        self._batch.updates.append((str(key), i.astype(np.int64), vals))

    def lookup(self, orig_ids: Any) -> np.ndarray:
        """Graph ids of original ids at the head (-1 where unknown)."""
        o = np.ascontiguousarray(np.asarray(orig_ids, dtype=np.int64).reshape(-1))
        reply = self.client.session.call(0, "live_lookup", {}, tensors=(o,))
        return np.array(reply.tensors[0], dtype=np.int64)

    # ---- committing

    def commit(self) -> int:
        """Apply the batch atomically; returns its version (visible to reads at it and
        above). On any refusal nothing of it is applied and the error is raised; the
        batch is cleared either way."""
        batch, self._batch = self._batch, _Batch()
        if batch.rows() == 0:
            raise ArgumentError("commit: the batch is empty")
        plan = _Plan(self, batch, fetch_head(self.client.session))
        session = self.client.session
        counts = {"nodes": plan.node_counts(), "edges": plan.edge_counts()}
        begun = session.call(0, "live_begin", counts, tensors=(plan.orig_by_part(),))
        version = int(begun.body["version"])
        plan.give_ids(begun.body["nodes"], begun.body["edges"])
        pieces = {p: plan.piece(p, version) for p in plan.parts()}
        try:
            self._prepare(pieces)
        except BaseException:
            self._finish(version, list(pieces), commit=False)
            raise
        self._finish(version, list(pieces), commit=True)
        return version

    def _prepare(self, pieces: dict[int, Piece]) -> None:
        """``live_prepare`` every piece at once; again after ``retry_after`` if told."""
        session = self.client.session
        seq0 = session.part(0)  # the sequencer, then its replicas (a partition fails over)
        seq = {"seq": seq0.main.address, "seq_replicas": [r.address for r in seq0.replicas]}
        todo = dict(pieces)
        deadline = time.monotonic() + self.retry_timeout
        while todo:
            sent = {}
            for p, piece in todo.items():
                body, tensors = piece_to_wire(piece)
                sent[p] = session.request(p, "live_prepare", {"piece": body, **seq},
                                          tensors, main_only=True)  # fmt: skip
            errors, wait = [], 0.0
            for p, pend in sent.items():
                try:
                    reply = session.wait(pend)
                except Exception as exc:  # every answer first: none is left in flight
                    errors.append(exc)
                    continue
                if "retry_after" in reply.body:
                    wait = max(wait, float(reply.body["retry_after"]))
                else:
                    del todo[p]
            if errors:
                raise errors[0]
            if todo:
                if time.monotonic() + wait > deadline:
                    raise StoreError(f"live: partitions {sorted(todo)} stayed past 3/4 of "
                                     f"their delta bound for {self.retry_timeout} s")  # fmt: skip
                self.waited_s += wait
                time.sleep(wait)

    def _finish(self, version: int, parts: list[int], commit: bool) -> None:
        """Decide ``version`` at the sequencer (the acknowledgement), then tell the
        partitions (best effort: one that misses it asks the sequencer)."""
        session = self.client.session
        refused: StoreError | None = None
        try:
            session.call(0, "live_decide", {"version": version, "commit": commit})
        except StoreError as exc:  # aborted meanwhile (undecided too long): tell them so
            refused, commit = exc, False
        body = {"version": version, "commit": commit}
        pending = [session.request(p, "live_commit", body, main_only=True) for p in parts]
        for pend in pending:
            try:
                session.wait(pend)
            except Exception as exc:
                log.warning("live_commit of version %d not delivered: %s", version, exc)
        if refused is not None:
            raise refused


class _Plan:
    """One batch laid out over the partitions: who owns each new node and edge, their
    ids once ``live_begin`` gave them, and each partition's :class:`Piece`."""

    def __init__(self, w: GraphWriter, b: _Batch, view: LiveView) -> None:
        book = w.book
        self.book, self.view, self.batch = book, view, b
        self.num_parts = book.num_parts
        self.orig = _cat(b.orig, np.int64)
        self.ntype = _cat(b.ntype, np.int32)
        if len(np.unique(self.orig)) != len(self.orig):
            raise ArgumentError("add_nodes: the batch's original ids repeat")
        self.etype = _cat([np.full(len(e[1]), e[0], np.int32) for e in b.edges], np.int32)
        ends = [self._ends(e[1], e[2], e[3], w) for e in b.edges]
        self.src = _cat([e[0] for e in ends], np.int64)  # new nodes: -(i + 1)
        self.dst = _cat([e[1] for e in ends], np.int64)
        self._check_types()
        sizes = np.diff(book.node_offsets).astype(np.int64)
        from graphrun.store.live import GROWTH_BLOCK

        sizes += np.bincount(view.node_owner, minlength=self.num_parts) * GROWTH_BLOCK
        placed = Neighbours.from_lists(self._neighbour_parts())
        capacity = capacity_for(sizes, len(self.orig))
        self.node_part = assign(placed, sizes, capacity, within=self._within())
        self.edge_part = self._owner(self.dst)
        self.deleted = _cat(b.deleted, np.int64)
        self.deleted_part = self._edge_owner(self.deleted)
        self.node_id = np.empty(0, np.int64)
        self.eid = np.empty(0, np.int64)

    def _ends(
        self, src: np.ndarray, dst: np.ndarray, orig: bool, w: GraphWriter
    ) -> tuple[np.ndarray, np.ndarray]:
        both = np.concatenate([src, dst])
        if orig:
            order = np.argsort(self.orig)
            pos = np.minimum(np.searchsorted(self.orig[order], both), max(len(order) - 1, 0))
            new = self.orig[order][pos] == both if len(order) else np.zeros(len(both), bool)
            out = w.lookup(both)
            out[new] = -(order[pos[new]] + 1)
            what = "original id"
        else:
            out, what = both.copy(), "graph id"
        known = (out < 0) | self._owner(np.maximum(out, 0), strict=False) >= 0
        known &= out >= -len(self.orig) - 1
        if orig:
            known &= ~((out == -1) & ~np.isin(both, self.orig))
        if not known.all():
            i = int(np.flatnonzero(~known)[0])
            end = "src" if i < len(src) else "dst"
            raise ArgumentError(f"add_edges {end}: {what} {int(both[i])} is not a node of the "
                                "graph or of this batch")  # fmt: skip
        return out[: len(src)], out[len(src) :]

    def _owner(self, ids: np.ndarray, strict: bool = True) -> np.ndarray:
        """The partition of each node id (new nodes of the batch: -(i+1), once placed)."""
        from graphrun.store.live import id_owners

        out = id_owners(ids, self.book.node_offsets, self.view.num_nodes, self.view.node_owner)
        new = ids < 0
        if new.any() and hasattr(self, "node_part"):
            out[new] = self.node_part[-ids[new] - 1]
        if strict and (out < 0).any():
            raise ArgumentError(f"id {int(ids[np.flatnonzero(out < 0)[0]])} has no owner")
        return out

    def _edge_owner(self, eids: np.ndarray) -> np.ndarray:
        from graphrun.store.live import id_owners

        out = id_owners(eids, self.book.edge_offsets, self.view.num_edges, self.view.edge_owner)
        if (out < 0).any():
            i = int(np.flatnonzero(out < 0)[0])
            raise ArgumentError(f"delete_edges: eid {int(eids[i])} is not an edge of the graph")
        return out

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
        return np.bincount(self.node_part, minlength=self.num_parts).tolist()

    def edge_counts(self) -> list[int]:
        return np.bincount(self.edge_part, minlength=self.num_parts).tolist()

    def orig_by_part(self) -> np.ndarray:
        return np.ascontiguousarray(self.orig[np.argsort(self.node_part, kind="stable")])

    def give_ids(self, node_runs: list[Any], edge_runs: list[Any]) -> None:
        """The ids ``live_begin`` handed out, in partition order; then the ends."""
        self.node_id = _spread(self.node_part, node_runs, self.num_parts)
        self.eid = _spread(self.edge_part, edge_runs, self.num_parts)
        for ends in (self.src, self.dst):
            new = ends < 0
            ends[new] = self.node_id[-ends[new] - 1]

    def parts(self) -> list[int]:
        used = [self.node_part, self.edge_part, self.deleted_part]
        used += [self._update_owner(k, i) for k, i, _ in self.batch.updates]
        return sorted(set(np.concatenate(used).tolist()))

    def _update_owner(self, key: str, ids: np.ndarray) -> np.ndarray:
        from graphrun.names import owners
        from graphrun.store.live import block_owner_of

        k = TensorKey.parse(key)
        assert k is not None
        ranges = self.book.node_ranges(k.type)
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
        b = self.batch
        nodes = self.node_part == p
        edges = self.edge_part == p
        node_feats = _rows_of(b.feats, self.ntype, nodes, lambda k: self.book.ntype_id(k.type))
        edge_feats = _rows_of(b.edge_feats, self.etype, edges, lambda k: self.book.etype_id(k.type))
        updates = {}
        for key, ids, vals in b.updates:
            mine = self._update_owner(key, ids) == p
            if mine.any():
                updates[key] = (Rows.of(ids[mine]), Rows.of(vals[mine]))
        return Piece(
            version=version,
            new_nodes=Rows.of(self.node_id[nodes]) if nodes.any() else None,
            node_types=Rows.of(self.ntype[nodes]) if nodes.any() else None,
            node_orig=Rows.of(self.orig[nodes]) if nodes.any() else None,
            node_features=node_feats,
            new_edges=Rows.of(np.vstack([self.src[edges], self.dst[edges], self.eid[edges]]))
            if edges.any() else None,
            edge_types=Rows.of(self.etype[edges]) if edges.any() else None,
            edge_features=edge_feats,
            deleted_edges=Rows.of(self.deleted[self.deleted_part == p])
            if (self.deleted_part == p).any() else None,
            updates=updates,
        )  # fmt: skip


def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.empty(0, dtype)


def _spread(part: np.ndarray, runs: list[Any], num_parts: int) -> np.ndarray:
    """Ids per item: partition ``p``'s items (in order) take ``runs[p]``'s ids."""
    out = np.empty(len(part), np.int64)
    for p in range(num_parts):
        mine = np.flatnonzero(part == p)
        ids = run_ids(runs[p])
        if len(ids) != len(mine):
            raise StoreError(f"live_begin: {len(ids)} ids for partition {p}, asked {len(mine)}")
        out[mine] = ids
    return out


def _rows_of(
    feats: dict[str, list[np.ndarray]], types: np.ndarray, mine: np.ndarray, type_of: Any
) -> dict[str, Rows]:
    """Each feature's rows of the items in ``mine``, in their order."""
    out = {}
    for key, chunks in feats.items():
        k = TensorKey.parse(key)
        assert k is not None
        of_type = types == type_of(k)
        rows = np.concatenate(chunks)[mine[of_type]]
        if len(rows):
            out[key] = Rows.of(rows)
    return out
