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
(a version and ids; partition 0's piece rides in it, numbered and held there:
:meth:`Plan.folded <graphrun.distributed.writer_plan.Plan.folded>`), ``live_prepare``
of each other partition's piece in parallel (checked
wholly there; a partition past 3/4 of its delta bound answers ``retry_after`` and the
piece is sent again after that wait: slowed, not dropped), then ``live_decide`` (the
acknowledgement; partition 0's piece is applied there as decided) and ``live_commit``
to the other partitions (not waited for: their answers
are collected at the next batch; a partition that misses one asks the sequencer). Any
refusal aborts the version: nothing of the batch is applied, and the error is raised.
Bad arguments are refused when given (one ArgumentError naming the field), before
anything is sent. The head (the growth blocks' owners) and the graph's features are
asked once, again for a batch with new nodes or an id in a block not heard of.

**Pipelined** (``GraphWriter(client, window=N)``): ``submit()`` sends the batch on its
way and returns; each later ``submit`` moves the batches in flight one step on (begun ->
prepared -> decided) — those whose answers are here, and those due (waited for: a batch
is done four submits after its own at the latest once it used the ``N - 4`` submits of
slack, lock-step with ``N = 4``) — at most ``N`` stay in flight, and ``flush()`` waits
for them all and returns their versions. A decision rides to a partition in the next piece sent
there (``live_prepare``'s ``decided``: no ``live_commit`` a batch) and to the sequencer
in the next ``live_begin`` (its ``decided``: no ``live_decide`` a batch; its answer is
the acknowledgement; a refused begin took none, they go as ``live_decide`` then), so
each partition serves one request a batch, the sequencer too; ``flush()`` sends those
left as ``live_decide`` and ``live_commit``, as ``commit()`` does each batch. Each batch
is applied whole at its own version (the sequencer's order); a refused one is aborted
alone and raised by the next ``submit`` or ``flush`` once none is in flight.
``submit(tag=...)`` names a batch: :meth:`GraphWriter.answered` gives each answered
batch's tag with its version or the error that refused it (every refusal, not only
the one raised), so a caller can say which batches are in the store; a batch whose
commit was sent and whose answer was lost (the sequencer gone or silent) is answered
``unknown``, as it may be committed, and :meth:`GraphWriter.settle` asks again once the
session reaches a sequencer (its replica, or the server restarted). A batch
naming ends by original id first waits for the batches in flight that add nodes (they
must be known). ``commit()`` is ``submit`` + ``flush``.

Where a new node goes: LDG (:func:`graphrun.partition.streaming.assign`) from the
partitions of its batch's placed neighbours and of the batch's earlier new nodes, under
the capacity rule ``ceil(1.05 n / P)`` (:func:`~graphrun.partition.streaming.capacity_for`;
a partition's size counts its base nodes and its growth blocks whole).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import numpy as np

from graphrun.distributed.writer_flight import LOCKSTEP_AGE, Answer, Flight, Unknown, own_held
from graphrun.distributed.writer_plan import Plan, WriteBatch
from graphrun.errors import ArgumentError, GraphrunError, StoreError
from graphrun.names import TensorKey, etype_key
from graphrun.rpc.codec import Message
from graphrun.store.client import KVClient
from graphrun.store.live import (
    LIVE_DECIDE_TIMEOUT_S,
    MAX_PIECE_ROWS,
)
from graphrun.store.live_client import LiveView, fetch_head
from graphrun.store.session import Pending, lost
from graphrun.store.state import TensorInfo

log = logging.getLogger("graphrun.distributed")

MAX_WINDOW = 16  # batches one writer keeps in flight (the sequencer takes 64 undecided)
MAX_CARRIED = MAX_WINDOW  # decisions waiting for a piece to a partition (live_prepare's)
MAX_ACKNOWLEDGED = 1 << 16  # versions kept for flush(): a stream that never flushes, the last


class GraphWriter:
    """Writes batches to a live store through ``client`` (see the module docstring)."""

    def __init__(
        self, client: KVClient, retry_timeout: float = LIVE_DECIDE_TIMEOUT_S / 2, window: int = 1
    ) -> None:
        if not isinstance(window, int) or not 1 <= window <= MAX_WINDOW:
            raise ArgumentError(f"window: expected batches in flight in [1, {MAX_WINDOW}], "
                                f"got {window!r}")  # fmt: skip
        self.client = client
        self.book = client.book
        self.retry_timeout = retry_timeout
        self.window = window
        self._batch = WriteBatch()
        self.waited_s = 0.0  # time spent slowed by backpressure
        # versions acknowledged since the last flush (the latest MAX_ACKNOWLEDGED)
        self.acknowledged: deque[int] = deque(maxlen=MAX_ACKNOWLEDGED)
        self._last = 0
        self._flights: deque[Flight] = deque()
        self._commits: list[tuple[int, Pending]] = []  # live_commit sent, not answered yet
        self._told: dict[int, list[tuple[int, bool]]] = {}  # part -> decisions to carry
        self._deciding: list[Flight] = []  # decided here, for the next live_begin to carry
        self._error: BaseException | None = None
        self._answers: list[Answer] = []  # tagged, answered since the last ``answered()``
        # decided commit, the sequencer's answer lost (the latest MAX_ACKNOWLEDGED)
        self._unknown: deque[Unknown] = deque(maxlen=MAX_ACKNOWLEDGED)
        self._view: LiveView | None = None
        self._tensors: list[TensorInfo] | None = None
        self._features: dict[tuple[str, str], list[str]] = {}  # (kind, type) -> names

    # ---- building a batch

    def _feature(self, key: TensorKey, rows: Any, n: int, what: str) -> np.ndarray:
        ti = self.client.meta(str(key))
        a = np.asarray(rows)
        want = (n, *ti.row_shape)
        if a.dtype != np.dtype(ti.dtype) or a.shape != want:
            raise ArgumentError(f"{what}: got {a.dtype} {a.shape}, expected {ti.dtype} {want}")
        return np.ascontiguousarray(a)

    def _features_of(self, kind: str, type_: str) -> list[str]:
        """The graph's features of a node or edge type, asked once (fixed at partition
        time) and kept by type: each batch's ``add_edges`` asks them again."""
        got = self._features.get((kind, type_))
        if got is not None:
            return got
        if self._tensors is None:
            self._tensors = self.client.list_tensors()
        out = []
        for ti in self._tensors:
            key = TensorKey.parse(ti.name)
            if ti.job == "" and key is not None and key.kind == kind and key.type == type_:
                out.append(key.name)
        self._features[kind, type_] = sorted(out)
        return self._features[kind, type_]

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
        return self.looked_up(self.lookup_request(orig_ids))

    def lookup_request(self, orig_ids: Any) -> Pending:
        """:meth:`lookup` sent and not waited for (:meth:`looked_up` waits): a caller asks
        a batch's ends while the batches before it are on their way (``graphrun ingest``;
        ``add_edges(orig=True)`` asks them at ``submit``, waiting)."""
        o = np.ascontiguousarray(np.asarray(orig_ids, dtype=np.int64).reshape(-1))
        return self.client.session.request(0, "live_lookup", {}, tensors=(o,))

    def looked_up(self, pending: Pending) -> np.ndarray:
        """The graph ids a :meth:`lookup_request` asked for (-1 where unknown)."""
        return np.array(self.client.session.wait(pending).tensors[0], dtype=np.int64)

    # ---- committing

    def commit(self) -> int:
        """Apply the batch atomically; returns its version (visible to reads at it and
        above) once it is acknowledged, with every batch submitted before it. On any
        refusal nothing of it is applied and the error is raised; the batch is cleared
        either way."""
        self.submit()
        self.flush()
        return self._last

    def submit(self, tag: object = None) -> None:
        """Send the batch on its way and return (the pipelined ``commit``): at most
        ``window`` batches are in flight, each further one waits for the oldest.
        :meth:`flush` waits for them all and returns their versions. A refused batch is
        raised by the next ``submit`` or ``flush``, once none is in flight (the batches
        submitted after it are applied or refused on their own: each is atomic); its
        ``tag`` comes back in :meth:`answered`. An error raised here before the batch
        was sent (an empty batch, an unknown end, an earlier refusal raised while
        waiting for the batches adding nodes) leaves no answer for it: not sent."""
        batch, self._batch = self._batch, WriteBatch()
        if batch.rows() == 0:
            raise ArgumentError("commit: the batch is empty")
        self._reap_commits()
        adding = any(len(f.plan.orig) for f in self._flights)
        if adding and any(orig for *_, orig in batch.edges):
            self._drain(0)  # ends named by original ids: the new nodes in flight known first
        plan = Plan(self, batch, self.view(fresh=bool(batch.orig)))
        carried, self._deciding = self._deciding, []
        body: dict[str, object] = {"nodes": plan.node_counts(), "edges": plan.edge_counts()}
        if carried:  # the last submit's decisions ride with it: no live_decide each
            body["decided"] = [[f.version, f.commit] for f in carried]
        tensors = [plan.orig_by_part()]
        own = plan.folded()  # partition 0's piece rides in the begin: one request there
        if own is not None:
            body["piece"] = own[0]
            tensors += own[1]
        begun = self.client.session.request(0, "live_begin", body, tensors=tensors)
        new = Flight(plan, begun, tag=tag)
        for f in carried:
            f.carrier = new
        flying = list(self._flights)
        self._flights.append(new)
        for f in flying:  # each one stage on (not those it just carried), once its
            f.age += 1  # answers are here or it is due (waited for: see _due)
            if f.stage != "done" and f.carrier is not new and (self._due(f) or self._ready(f)):
                self._step(f)
        self._drain(self.window)

    def flush(self) -> list[int]:
        """Wait for every batch in flight; the versions acknowledged since the last
        ``flush``, in submission order (the latest :data:`MAX_ACKNOWLEDGED`: a stream
        that submits for days without a flush keeps no more). Raises the first refusal
        (after all answered)."""
        try:
            self._drain(0)
        finally:
            for p in list(self._told):  # no piece in flight to carry them
                self._tell(p)
        done = list(self.acknowledged)
        self.acknowledged.clear()
        return done

    def answered(self) -> list[Answer]:
        """The batches submitted with a ``tag`` and answered since the last call, in
        submission order: each one's ``tag`` with its version (acknowledged) or the error
        that refused it (aborted whole). A caller that stops at a refusal flushes first:
        then every batch it submitted has an answer here. Untagged batches (``commit()``,
        ``submit()``) are not kept: a writer that never asks keeps nothing."""
        done, self._answers = self._answers, []
        return done

    def view(self, fresh: bool = False) -> LiveView:
        """The head and the growth blocks' owners: asked once, again when ``fresh`` (a
        batch with new nodes places them by the partitions' sizes now) or when an id is
        in a block this writer has not heard of (a block's owner never changes)."""
        if fresh or self._view is None:
            self._view = fetch_head(self.client.session)
        return self._view

    def _drain(self, keep: int) -> None:
        while self._flights and (len(self._flights) > keep or self._flights[0].stage == "done"):
            f = self._flights[0]
            while f.stage != "done":
                self._step(f)
            self._flights.popleft()
            if f.tag is not None:
                v = f.version if f.error is None or f.unknown else 0
                self._answers.append(Answer(f.tag, v, f.error, f.unknown))
            if f.error is None:
                self.acknowledged.append(f.version)
                self._last = f.version
            elif self._error is None:
                self._error = f.error
        if self._error is not None and not self._flights:
            error, self._error = self._error, None
            raise error

    def _due(self, f: Flight) -> bool:
        """Whether ``f`` must move on now, waiting for its answers: a batch moves one
        stage a submit at the latest (begun at the next, prepared at the one after, its
        decision carried by the third and answered by the fourth) once it has used the
        window's slack (``window - 4`` submits): so it is done before the window is full
        and no decision has to go as a ``live_decide`` of its own."""
        return f.age >= LOCKSTEP_AGE[f.stage] + max(0, self.window - 4)

    def _ready(self, f: Flight) -> bool:
        """Whether moving ``f`` on would not wait for a server: the answers its stage
        needs are here (its begin's; its prepares'; its decision's carrier's begin)."""
        session = self.client.session
        if f.stage == "begin":
            return f.reply is not None or session.ready(f.begun)
        if f.stage == "prepare":
            return all(session.ready(p) for p in f.sent.values())
        c = f.carrier
        return c is not None and (c.reply is not None or session.ready(c.begun))

    def _step(self, f: Flight) -> None:
        """Move ``f`` one stage on: begun -> prepared -> decided -> done."""
        try:
            if f.stage == "begin":
                reply = self._begun(f)
                f.version = int(reply.body["version"])
                f.plan.give_ids(reply.body["nodes"], reply.body["edges"])
                f.stage = "prepare"  # begun: a refusal from here on aborts it
                held = own_held(reply)
                parts = [p for p in f.plan.parts() if p != 0 or not held]
                f.pieces = {p: f.plan.wire(p, f.version) for p in parts}
                f.deadline = time.monotonic() + self.retry_timeout
                self._send_prepares(f, parts)
            elif f.stage == "prepare":
                self._collect_prepares(f)
                self._decide(f, commit=True)
            else:
                self._decided(f)
        except BaseException as exc:
            f.error = f.error or exc
            if f.stage == "begin":  # nothing was begun: nothing to decide
                f.stage = "done"
            elif f.stage == "prepare":
                try:
                    self._decide(f, commit=False)
                except Exception as again:  # the sequencer's tick aborts it in time
                    log.warning("live_decide (abort) of version %d: %s", f.version, again)
                    f.stage = "done"
            else:
                f.stage = "done"
            if not isinstance(exc, Exception):
                raise

    def _send_prepares(self, f: Flight, parts: list[int]) -> None:
        session = self.client.session
        seq0 = session.part(0)  # the sequencer, then its replicas (a partition fails over)
        seq = {"seq": seq0.main.address, "seq_replicas": [r.address for r in seq0.replicas]}
        for p in parts:
            body, tensors = f.pieces[p]
            told = {"decided": self._told.pop(p)} if p in self._told else {}
            f.sent[p] = session.request(p, "live_prepare", {"piece": body, **seq, **told},
                                        tensors, main_only=True)  # fmt: skip

    def _collect_prepares(self, f: Flight) -> None:
        """Every prepare's answer; the pieces told ``retry_after`` are sent again after
        that wait (slowed, never dropped) until ``retry_timeout``."""
        session = self.client.session
        while f.sent:
            errors, again, wait = [], [], 0.0
            for p, pend in list(f.sent.items()):
                del f.sent[p]
                try:
                    reply = session.wait(pend)
                except Exception as exc:  # every answer first: none is left in flight
                    errors.append(exc)
                    continue
                if "retry_after" in reply.body:
                    again.append(p)
                    wait = max(wait, float(reply.body["retry_after"]))
            if errors:
                raise errors[0]
            if again:
                if time.monotonic() + wait > f.deadline:
                    raise StoreError(f"live: partitions {sorted(again)} stayed past 3/4 of "
                                     f"their delta bound for {self.retry_timeout} s")  # fmt: skip
                self.waited_s += wait
                time.sleep(wait)
                self._send_prepares(f, again)

    def _decide(self, f: Flight, commit: bool) -> None:
        """The decision, for the next ``live_begin`` to carry to the sequencer (or
        ``live_decide`` when none is sent before it is waited for: :meth:`_decided`)."""
        for pend in f.sent.values():  # a refusal: the other prepares' answers first
            try:
                self.client.session.wait(pend)
            except Exception as exc:
                log.info("live_prepare of version %d: %s", f.version, exc)
        f.sent.clear()
        f.commit = commit
        self._deciding.append(f)
        f.stage = "decide"

    def _begun(self, f: Flight) -> Message:
        """``f``'s ``live_begin`` answer, waited for once (the flights whose decisions it
        carried read it too)."""
        if f.reply is None:
            try:
                f.reply = self.client.session.wait(f.begun)
            except Exception as exc:
                f.reply = exc
        if isinstance(f.reply, Exception):
            raise f.reply
        return f.reply

    def _sequencer_decided(self, f: Flight) -> None:
        """The sequencer's answer to ``f``'s decision (the acknowledgement): a StoreError
        if it did not commit a commit. A refused carrier took no decision: sent again."""
        session = self.client.session
        if f.carrier is not None:
            try:
                taken = self._begun(f.carrier).body.get("decided")
            except (ArgumentError, StoreError):  # refused: decided nothing
                taken, f.carrier = None, None
            if f.carrier is not None:
                committed = {int(v): bool(c) for v, c in taken or []}.get(f.version, False)
                if f.commit and not committed:
                    why = f"undecided for {LIVE_DECIDE_TIMEOUT_S} s, or by its writer"
                    raise StoreError(f"live_begin: version {f.version} was aborted ({why})")
                return

        def send(g: Flight) -> Pending:
            g.decide = session.request(0, "live_decide", {"version": g.version,
                                                          "commit": g.commit})  # fmt: skip
            return g.decide

        pending = f.decide
        if pending is None:  # none carried it: every decision waiting goes now
            for g in self._deciding:
                if g is not f:
                    send(g)
            pending, self._deciding = send(f), []
        session.wait(pending)

    def _decided(self, f: Flight) -> None:
        """The sequencer's answer, then the decision for the partitions, carried by the
        next piece sent to each (or :meth:`_tell`; never waited for: a partition that
        misses it asks the sequencer)."""
        told = {0}  # the sequencer applied its own partition's piece as it decided
        try:
            self._sequencer_decided(f)
        except GraphrunError as exc:
            if f.commit and lost(exc):  # gone, silent, fenced: its answer is lost
                self._lost_answer(f, exc)
                return
            if not isinstance(exc, StoreError):
                raise
            f.error, f.commit, told = f.error or exc, False, set()  # aborted meanwhile
        for p in (p for p in f.pieces if p not in told):
            carried = self._told.setdefault(p, [])
            carried.append((f.version, f.commit))
            if len(carried) >= MAX_CARRIED:
                self._tell(p)
        f.stage = "done"

    def _lost_answer(self, f: Flight, exc: GraphrunError) -> None:
        """``f``'s commit decision was sent and the sequencer's answer lost (the server
        gone, or silent past the timeout): it may have been taken and synced before, so
        its fate is unknown, and the partitions are told nothing (told an abort, one would
        drop a piece the sequencer committed; a partition asks the sequencer itself).
        :meth:`settle` asks again."""
        f.unknown, f.stage = True, "done"
        why = f"the sequencer's answer to its commit was lost ({exc})"
        f.error = StoreError(f"live_decide: version {f.version}: {why}; committed or not "
                             "is unknown")  # fmt: skip
        f.error.__cause__ = exc
        self._unknown.append(Unknown(f.tag, f.version, tuple(p for p in f.pieces if p != 0)))

    def settle(self, timeout: float | None = None) -> list[Answer]:
        """The batches whose fate is unknown (:attr:`Answer.unknown`: their commit was
        sent and the answer lost) asked again: ``live_fate`` of each, through the
        session (a replica once the primary is gone, or the restarted server: asked
        again while the connection is lost, until ``timeout`` in all; None: the
        client's). One still pending (its commit never reached the sequencer's log) is
        aborted then (``live_decide``, commit false: the first decision a version gets
        stands, so a commit that arrives first still wins, and the answer says which),
        never committed: a sequencer restarted without its log hands the same versions
        out again, and a commit sent now could commit another writer's batch before its
        pieces are held. The partitions are then told. Returns the batches settled, as
        :meth:`answered` gives them (the others stay unknown, asked at the next call)."""
        session = self.client.session
        wait = session.part(0).main.timeout if timeout is None else timeout
        end, out = time.monotonic() + wait, []
        for u in list(self._unknown):
            committed = self._settled(u, end)
            if committed is None:
                continue
            self._unknown.remove(u)
            for p in u.parts:
                self._told.setdefault(p, []).append((u.version, committed))
            if committed:
                self.acknowledged.append(u.version)
            why = f"version {u.version} was aborted (its commit never reached the sequencer)"
            out.append(Answer(u.tag, u.version, None if committed else StoreError(why)))
        return out

    def _settled(self, u: Unknown, end: float) -> bool | None:
        """Whether ``u`` committed, from its ``live_fate`` (a pending one aborted, see
        :meth:`settle`); None when the sequencer did not answer by ``end``."""
        session = self.client.session
        while True:
            left = max(end - time.monotonic(), 0.001)
            try:
                said = self.fate(u.version, left)
                if said == "pending":
                    body = {"version": u.version, "commit": False}
                    reply = session.wait(session.request(0, "live_decide", body), left)
                    return bool(reply.body.get("committed"))
                return said == "committed"
            except GraphrunError as exc:  # its server not connected again yet: ask again
                if not lost(exc) or time.monotonic() + 0.2 >= end:
                    log.warning("version %d: its fate asked again: %s", u.version, exc)
                    return None
                time.sleep(0.2)

    def fate(self, version: int, timeout: float | None = None) -> str:
        """The sequencer's word on ``version`` (``live_fate``): ``committed``,
        ``aborted`` or ``pending`` (begun, undecided: aborted 30 s after its begin unless
        its writer decides it). For a batch whose answer was lost (:meth:`settle` asks,
        and aborts a pending one)."""
        pending = self.client.session.request(0, "live_fate", {"version": int(version)})
        return str(self.client.session.wait(pending, timeout).body.get("fate"))

    def _tell(self, p: int) -> None:
        """The decisions carried for partition ``p`` as ``live_commit`` now (the answers
        are reaped later: :meth:`_reap_commits`)."""
        session = self.client.session
        for version, commit in self._told.pop(p, []):
            body = {"version": version, "commit": commit}
            self._commits.append((version, session.request(p, "live_commit", body,
                                                           main_only=True)))  # fmt: skip

    def _reap_commits(self) -> None:
        """The answers of the ``live_commit`` sent before (they came meanwhile)."""
        commits, self._commits = self._commits, []
        for version, pend in commits:
            try:
                self.client.session.wait(pend)
            except Exception as exc:
                log.warning("live_commit of version %d not delivered: %s", version, exc)

    def close(self) -> None:
        """Wait for the batches in flight and the last decisions' deliveries."""
        try:
            self.flush()
        finally:
            self._reap_commits()
