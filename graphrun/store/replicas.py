"""Replicated partitions: a second main server of a partition on another machine.

A **replica** of partition K is a store server that loads ``part-K`` from the partition
files into its own shared memory (``ServerConfig.replica_of``: the primary's address),
serves reads like the primary and takes the primary's writes. It registers with the
primary (``register_replica``, retried until ``request_timeout``); clients that join
the primary learn its replicas from the join reply (``PartitionInfo.replicas``).

**Writes in one order.** The primary sends every write (``push``, ``init``,
``delete``) to each replica as a ``replicate`` request (the store's admin key only),
applies it while the replica does, and waits for the replica before it answers (a
write that waits for the log: at its loop turn's end, after the turn's sync, with the
turn's other writes, :mod:`graphrun.store.writes`). One server process handles one
request at a time, so every replica gets the writes in the primary's order, whichever
clients wrote them. A replica that does not answer within
:data:`REPLICA_WRITE_TIMEOUT`, or refuses a write the primary applied, is dropped from
the primary's write set and logged; the primary goes on alone. So when the client's
``push`` returns (the write is *acknowledged*), every copy still in the write set
holds it.

**A dropped replica is never failed over to.** The primary tells a replica it drops
(``replica_dropped``, after the writes it sent it, not waited for); the replica then
refuses every request (:data:`DROPPED`: a client or a partition asking a fate goes on
to the next replica, or fails) and is never promoted, and the primary refuses that
replica's index at ``register_replica`` (restarted, it missed writes): the replica
stops with one line naming ``replica_index`` (an ArgumentError: restarting it cannot
help). With a log directory (``--live-dir``) the primary keeps the dropped indices
there too (:class:`DroppedReplicas`, written and synced before a write is answered
without the replica), so that it still refuses them once restarted; without one they
are kept in memory only (nothing else of the store is durable then either). A replica
whose ``--live-dir`` is its primary's (a GraphJob's) reads that record before it serves
a client or is promoted (:func:`read_record`), and at start
(:func:`check_not_recorded`): named there, it is dropped though never told (its primary
died first). A
promoted replica that refuses a forward is not told (it serves the partition: this
primary is fenced).

**Exactly once across a failover.** Each write of a client session carries a write id
(``w``, increasing per session); a server remembers the last it applied per session
(``ServerState.applied``) and answers a write it has already applied without applying
it again. When the primary dies with writes in flight, the client sends the writes
that got no answer to the replica (:mod:`graphrun.store.session`): the ones the primary
had forwarded are skipped, the others applied — none twice, none lost.

**Fencing.** A replica that takes a write from a client (not forwarded: a client
failed over to it) is *promoted* and refuses the old primary's forwarded writes from
then on; a primary refused so is *fenced*: it answers that write and every later
request with a :data:`FENCED` StoreError, which sends its clients to the replica too.
So a primary that was only paused (SIGSTOP, a cut link) cannot go on acknowledging
writes its replica never saw.

**The live graph's sequencer** (partition 0's primary, :mod:`graphrun.store.live_ops`)
has a copy on partition 0's replica: ``live_begin`` and ``live_decide`` are writes like
any other, forwarded before they are answered, and the primary's own aborts (a version
undecided too long) are forwarded as ``live_decide`` too. So the replica holds every
version and id handed out and every decision acknowledged. A writer that fails over
begins and decides there (a ``live_begin`` sent again gets the same version and ids: the
handler answers repeats, :data:`ANSWERS_REPEATS`); a partition that asks the replica a
piece's fate promotes it, as a client's write does, since only the partition's server
aborts versions left undecided.

A replica holds the graph's tensors from the files and every job tensor created after
it registered; the launcher starts all stores before any client, so a job's tensors
are all replicated.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from graphrun.errors import (
    ArgumentError,
    AuthError,
    GraphrunError,
    RpcError,
    RpcTimeout,
    StoreError,
)
from graphrun.files import fsync_path, write_atomic
from graphrun.rpc.auth import KeyPair
from graphrun.rpc.transport import RpcClient
from graphrun.store.registry import Registry, Request, Response
from graphrun.store.requests import BackupBody, Named, ReplicateBody
from graphrun.store.state import ServerState
from graphrun.wire import Header, read_file, to_builtins

log = logging.getLogger("graphrun.store")

#: the operations that change a partition, forwarded to its replicas (a live graph's
#: pieces and their decisions too, and on partition 0 the sequencer's versions and
#: decisions: store/live_ops.py)
WRITE_OPS = frozenset(
    {
        "push",
        "push_tables",
        "move_sums",
        "init",
        "delete",
        "live_prepare",
        "live_commit",
        "live_begin",
        "live_decide",
    }
)
#: writes whose handler answers a repeat itself (the reply is not empty: ``live_begin``
#: gives the same version and ids again; ``live_decide`` its decision, which stands)
ANSWERS_REPEATS = frozenset({"live_begin", "live_decide"})
#: writes that wait for no log sync yet are answered only once their replicas answered,
#: without holding the loop meanwhile (``writes.Turn``): a partition's ``live_commit``,
#: whose decision the sequencer and its replica hold already (a promoted replica asks
#: the sequencer a pending piece's fate), so a read of it here before the replica has it
#: reads nothing a failover could take back. Not ``push`` and the like: a read here
#: could see a write that a failover before the replica took it would lose.
ANSWERED_LATER = frozenset({"live_commit"})
#: how a fenced primary's refusals begin (the client fails over on them)
FENCED = "fenced:"
#: how a dropped replica's refusals begin (it misses writes: the client, or a partition
#: asking a fate, goes on to the next replica, if any)
DROPPED = "dropped replica:"
#: a replica that does not take a forwarded write in this long leaves the write set (a
#: client waits longer than this for its write: it must not give up on a primary that is
#: only waiting for a replica)
REPLICA_WRITE_TIMEOUT = 5.0
#: the request id of a forward that could not be sent (:attr:`Replication.unsent`): its
#: replica is dropped when the write is collected, once it was applied here
UNSENT = -1


DROPPED_FORMAT, DROPPED_VERSION = "graphrun-dropped-replicas", 1


class DroppedReplicas(Header, kw_only=True):
    """``part-P.dropped.json`` in a primary's log directory: the indices of the replicas
    it dropped from its write set, with why. Written whole (a temporary file, synced,
    renamed, the directory synced) before a write is answered without the replica, and
    read when the primary starts: restarted, it still refuses them."""

    part: int
    dropped: dict[int, str]


def dropped_path(live_dir: Path, part: int) -> Path:
    return Path(live_dir) / f"part-{part}.dropped.json"


def load_dropped(path: Path, part: int) -> dict[int, str]:
    """The dropped replicas recorded at ``path`` (none if it is not there); one
    ArgumentError naming the file and field if it is not such a record of ``part``."""
    if not path.exists():
        return {}
    got = read_file(DroppedReplicas, path, "dropped replicas", DROPPED_FORMAT, DROPPED_VERSION,
                    ArgumentError)  # fmt: skip
    if got.part != part:
        raise ArgumentError(f"{path}: field 'part' is {got.part}, not partition {part}")
    return dict(got.dropped)


def save_dropped(path: Path, part: int, dropped: dict[int, str]) -> None:
    """Write the record of ``dropped`` durably (synced, and its directory)."""
    record = DroppedReplicas(DROPPED_FORMAT, DROPPED_VERSION, part=part, dropped=dropped)
    data = (json.dumps(to_builtins(record)) + "\n").encode()

    def write(f: BinaryIO) -> None:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())

    write_atomic(path, write, mode=0o600)
    fsync_path(path.parent)


def is_fenced(exc: BaseException) -> bool:
    """``exc`` is a fenced primary's refusal."""
    return isinstance(exc, StoreError) and FENCED in str(exc)


def is_dropped(exc: BaseException) -> bool:
    """``exc`` is a dropped replica's refusal."""
    return isinstance(exc, StoreError) and DROPPED in str(exc)


def check_serving(state: ServerState, op: str = "") -> None:
    """Refuse every request on a fenced primary and on a dropped replica: told so, or
    named in its primary's record (:func:`read_record`; not read for the primary's own
    forwards, ``replicate``)."""
    if state.fenced:
        raise StoreError(f"{FENCED} partition {state.part} is served by its replica now")
    if not state.dropped and op != "replicate":
        read_record(state)
    if state.dropped:
        raise StoreError(f"{DROPPED} replica {state.replica} of partition {state.part} was "
                         f"dropped from its primary's write set ({state.dropped}): it misses "
                         "writes, so it serves nothing and is never promoted")  # fmt: skip


def read_record(state: ServerState) -> None:
    """A replica not promoted reads its primary's record of drops (``part-P.dropped.json``
    in its ``--live-dir``: a GraphJob gives a partition's primary and replicas one
    directory) before it serves a client or is promoted: named there, it is dropped
    (``state.dropped``), though the primary died before its ``replica_dropped`` came
    (the record is synced before any write is answered without the replica, so a
    replica that misses an acknowledged write is named there by then). Read again only
    when the file changed (a stat a request otherwise); a record that cannot be read
    refuses the request (ArgumentError naming the file), promotion included."""
    path = state.drop_record
    if path is None or not state.replica or state.promoted:
        return
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    seen = (st.st_ino, st.st_size, st.st_mtime_ns)
    if seen == state.drop_record_seen:
        return
    why = load_dropped(path, state.part).get(state.replica)
    state.drop_record_seen = seen
    if why is not None:
        state.dropped = f"{why}; read from {path}"
        log.warning("replica %d of partition %d is named in %s (%s): serving nothing from "
                    "now on", state.replica, state.part, path, why)  # fmt: skip


def check_not_recorded(path: Path, part: int, index: int) -> None:
    """A replica starting: ArgumentError (``replica_index``) if its primary's record at
    ``path`` names it (dropped before: it missed writes), as the primary's
    ``register_replica`` would refuse it, even while the primary is down."""
    why = load_dropped(path, part).get(index)
    if why is not None:
        raise ArgumentError(f"replica_index: {DROPPED} replica {index} was dropped from the "
                            f"write set ({why}; {path}): it misses writes and may not "
                            "rejoin")  # fmt: skip


@dataclass
class Replication:
    """A primary's links to its replicas (its write set)."""

    keys: KeyPair | None
    timeout: float
    links: dict[str, RpcClient] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    indices: dict[str, int] = field(default_factory=dict)  # address -> replica index
    dropped_indices: dict[int, str] = field(default_factory=dict)  # index -> why
    told: list[RpcClient] = field(default_factory=list)  # dropped replicas' links, told so
    record: Path | None = None  # where the dropped indices are kept (a log directory's)
    unsent: dict[str, GraphrunError] = field(default_factory=dict)  # address -> why

    @classmethod
    def of(cls, keys: KeyPair | None, timeout: float, part: int,
           live_dir: Path | None) -> Replication:  # fmt: skip
        """Partition ``part``'s primary's write set; with ``live_dir`` the replicas it
        dropped before a restart, read back from there (:func:`load_dropped`)."""
        if live_dir is None:
            return cls(keys, timeout)
        record = dropped_path(live_dir, part)
        return cls(keys, timeout, record=record, dropped_indices=load_dropped(record, part))

    def add(self, address: str, index: int = 0) -> None:
        """Replica ``index`` (0: not given) at ``address`` joins the write set; one
        dropped before may not (a replica restarted: it missed writes)."""
        if index and index in self.dropped_indices:
            raise StoreError(f"{DROPPED} replica {index} was dropped from the write set "
                             f"({self.dropped_indices[index]}): it misses writes and may "
                             "not rejoin")  # fmt: skip
        if index:
            self.indices[address] = index
        if address not in self.links:
            timeout = min(self.timeout, REPLICA_WRITE_TIMEOUT)
            self.links[address] = RpcClient(address, keys=self.keys, timeout=timeout)

    def remove(self, address: str) -> None:
        link = self.links.pop(address, None)
        if link is not None:
            link.close()

    @property
    def addresses(self) -> list[str]:
        return list(self.links)

    def send(self, part: int, req: Request) -> list[tuple[str, RpcClient, int]]:
        """Send write ``req`` to every replica (before it is applied here, so that the
        replicas apply it while this server does: the forward costs one round trip less
        than it would after); :meth:`collect` waits for them."""
        body: dict[str, Any] = {"op": req.op, "job": req.job, "s": "", "session": req.session}
        body["admin"], body["body"] = req.admin, dict(req.body)
        sent = []
        for address, link in list(self.links.items()):
            try:
                sent.append((address, link, link.send("replicate", body, req.tensors)))
            except GraphrunError as exc:  # dropped once the write is applied (or not) here
                self.unsent[address] = exc
                sent.append((address, link, UNSENT))
        return sent

    def collect(
        self,
        part: int,
        sent: list[tuple[str, RpcClient, int]],
        applied: bool,
        waited: float = 0.0,
    ) -> None:
        """Wait for the replicas' answers to a write this server ``applied`` (or refused),
        sent ``waited`` seconds ago: until :data:`REPLICA_WRITE_TIMEOUT` after it was.
        A replica that is gone, silent that long, or that refused a write applied here,
        is dropped from the write set and logged; one that refused a write refused here
        too stays (the same check failed on both). A promoted replica's refusal raises
        :data:`FENCED`; a drop that could not be recorded, a StoreError (the write is
        not acknowledged; the replica stays)."""
        fenced, unrecorded = None, None
        left = max(0.0, min(self.timeout, REPLICA_WRITE_TIMEOUT) - waited)
        for address, link, rid in sent:
            if self.links.get(address) is not link:  # dropped (and closed) since
                continue
            try:
                if rid == UNSENT:
                    raise self.unsent.pop(address, None) or RpcError("not sent", address=address)
                if not link.ready(rid) and left <= 0:
                    raise RpcTimeout(f"no answer to a forwarded write within "
                                     f"{REPLICA_WRITE_TIMEOUT:g} s", address=address)  # fmt: skip
                link.wait(rid, timeout=left)
            except GraphrunError as exc:
                if is_fenced(exc):  # promoted: it serves the partition, not told dropped
                    fenced = fenced or address
                elif not applied and type(exc) not in (RpcError, RpcTimeout):
                    continue
                unrecorded = self._drop(part, address, exc, tell=not is_fenced(exc)) or unrecorded
        if fenced is not None:
            raise StoreError(f"{FENCED} partition {part} is served by replica {fenced} now")
        if unrecorded is not None:
            raise unrecorded

    def answered(self, sent: list[tuple[str, RpcClient, int]]) -> bool:
        """Whether :meth:`collect` of ``sent`` would return at once: every replica still
        in the write set answered (read without blocking)."""
        return all(
            self.links.get(a) is not link or rid == UNSENT or link.ready(rid)
            for a, link, rid in sent
        )

    def _drop(
        self, part: int, address: str, exc: Exception, tell: bool = True
    ) -> StoreError | None:
        """Drop ``address`` from the write set and tell it so (``replica_dropped``, after
        the writes sent it before, on the same connection; not waited for: it may be
        stopped), so that it refuses to serve or be promoted, whoever fails over to it.
        With a log directory the drop is recorded first; one that cannot be is not made,
        and its error returned (the write that found it is not acknowledged)."""
        why = f"partition {part}'s primary: {exc}"
        if address in self.indices:
            try:
                self._remember(part, self.indices[address], why)
            except StoreError as failed:
                log.error("replica %s of partition %d not dropped: %s", address, part, failed)
                return failed
        log.warning("replica %s of partition %d dropped from the write set: %s", address, part, exc)
        self.dropped.append(address)
        link = self.links.pop(address, None)
        if link is None:
            return None
        if tell:
            try:
                link.send("replica_dropped", {"why": why}, connect_timeout=0)
                self.told.append(link)
                return None
            except GraphrunError as told_exc:  # gone: a restarted one may not rejoin
                log.info("replica %s not told it was dropped: %s", address, told_exc)
        link.close()
        return None

    def _remember(self, part: int, index: int, why: str) -> None:
        """Keep replica ``index``'s drop, first in :attr:`record` (with a log directory),
        before any write is answered without it; StoreError if it cannot be written."""
        dropped = {**self.dropped_indices, index: why}
        if self.record is not None:
            try:
                save_dropped(self.record, part, dropped)
            except OSError as exc:
                raise StoreError(f"{self.record}: cannot record that replica {index} was "
                                 f"dropped ({exc.strerror or exc}): the write is not "
                                 "acknowledged") from None  # fmt: skip
        self.dropped_indices = dropped

    def close(self) -> None:
        for address in list(self.links):
            self.remove(address)
        for link in self.told:
            link.close()
        self.told.clear()


def write_id(req: Request) -> int | None:
    """The write id ``w`` of a client's write, None when it has none."""
    w = req.body.get("w")
    if w is None:
        return None
    if not isinstance(w, int) or isinstance(w, bool) or w < 0:
        raise ArgumentError(f"{req.op}: field 'w' must be an integer >= 0")
    return w


def apply_write(state: ServerState, req: Request, apply: Callable[[Request], Response]) -> Response:
    """Apply write ``req`` once per write id (see the module docstring); a duplicate is
    answered as its first application was, without changing anything."""
    w = write_id(req)
    if w is not None and req.session and state.applied.get(req.session, -1) >= w:
        return apply(req) if req.op in ANSWERS_REPEATS else _duplicate_reply(state, req)
    resp = apply(req)
    if w is not None and req.session:
        state.applied[req.session] = w
    return resp


def _duplicate_reply(state: ServerState, req: Request) -> Response:
    if req.op == "init":
        info = state.find(req.job, req.args(Named).name).info
        return Response({"info": to_builtins(info), "created": False})
    if req.op == "delete":
        return Response({"deleted": True})
    return Response({})


def register_ops(registry: Registry) -> None:
    """``replicate`` (the primary's forwarded write) and ``register_replica``."""

    def replicate(state: ServerState, req: Request) -> Response:
        if not req.admin:
            raise AuthError("replicate: only the store's own key forwards writes")
        if state.replica == 0:
            raise ArgumentError("replicate: this server is a primary, not a replica")
        if state.promoted:
            raise StoreError(f"{FENCED} this replica serves partition {state.part} now")
        fwd = req.args(ReplicateBody)
        op = fwd.op
        if op not in WRITE_OPS:
            raise ArgumentError(f"replicate: {op!r} is not a write ({sorted(WRITE_OPS)})")
        inner = Request(
            op, fwd.body, req.tensors, job=fwd.job, session=fwd.session, admin=fwd.admin,
            user=req.user, forwarded=True,
        )  # fmt: skip
        handler = registry.get(op).handler
        return apply_write(state, inner, lambda r: handler(state, r))

    def register_replica(state: ServerState, req: Request) -> Response:
        if not req.admin:
            raise AuthError("register_replica: only the store's own key registers replicas")
        if state.replica != 0 or state.replication is None:
            raise ArgumentError("register_replica: this server is not a partition's primary")
        body = req.args(BackupBody)
        if body.remove:
            state.replication.remove(body.address)
        else:
            state.replication.add(body.address, body.replica)
            log.info("partition %d: replica %s registered", state.part, body.address)
        return Response({})

    def replica_dropped(state: ServerState, req: Request) -> Response:
        if not req.admin:
            raise AuthError("replica_dropped: only the store's own key drops replicas")
        if state.replica == 0:
            raise ArgumentError("replica_dropped: this server is a primary, not a replica")
        why = req.body.get("why", "")
        if state.promoted:  # it serves the partition: the old primary is fenced
            return Response({"dropped": False})
        state.dropped = why if isinstance(why, str) and why else "no reason given"
        log.warning("replica %d of partition %d dropped from the write set (%s): serving "
                    "nothing from now on", state.replica, state.part, state.dropped)  # fmt: skip
        return Response({"dropped": True})

    registry.add("replicate", replicate, needs_session=False)
    registry.add("register_replica", register_replica, needs_session=False)
    registry.add("replica_dropped", replica_dropped, needs_session=False)


def register_with_primary(
    primary: RpcClient, address: str, deadline_s: float, index: int = 0
) -> None:
    """Announce replica ``index`` at ``address`` to its primary, retrying while the
    primary is not up yet (it may start after this machine's stores) until
    ``deadline_s`` seconds; a refusal (a replica dropped before) raises."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            primary.call("register_replica", {"address": address, "replica": index}, timeout=5)
            return
        except StoreError as exc:  # a dropped replica's index: restarting cannot help
            if is_dropped(exc):
                raise ArgumentError(f"replica_index: {exc}") from None
            raise
        except RpcError as exc:
            if type(exc) not in (RpcError, RpcTimeout):  # refused: not a lost connection
                raise
            if time.monotonic() > end:
                raise
            log.info("primary %s not answering yet (%s); retrying", primary.address, exc)
            time.sleep(0.5)


def replica_state_fields(state: ServerState) -> dict[str, Any]:
    """What ``stats`` reports about replication."""
    rep = state.replication
    return {
        "replica": state.replica,
        "replicas": rep.addresses if rep is not None else [],
        "dropped_replicas": list(rep.dropped) if rep is not None else [],
        "dropped": state.dropped,  # a replica's: why its primary dropped it ("": not)
        "promoted": state.promoted,
    }
