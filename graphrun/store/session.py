"""A client's session with a running store: join, heartbeat, requests with failover.

:class:`Session` joins the main server of every partition and the backups each one
announces (one session id for all), keeps the session alive with a heartbeat thread
(its own sockets), sends requests (load-balanced over main and backups) and, when a
backup is gone, drops it and sends the request again to the partition's main server.

With replicated partitions (:mod:`graphrun.store.replicas`) it also joins the replicas
each primary announces. When a primary stops answering (a request times out or its
connection is lost, with requests in flight or before the next is sent: a server
restarted on the address does not know the session) the partition **fails over**: its
replica becomes the server of
every later request (reads and writes), the primary's backups and shared memory are no
longer used (they would serve the dead primary's stale rows), and the requests still
waiting on the primary are sent to the replica at once. Writes (``push``, ``init``,
``delete``) carry a write id per session (``w``), so a write the primary had already
forwarded is not applied twice.
``traffic`` counts the tensor bytes of every reply, by ``(partition, op)``.

**Revocation.** A client on the store's machine reads its partitions' shared memory with
no request, so a store that refuses a revoked key's requests would not stop it. The main
server therefore counts its revocations in shared memory (``PartitionInfo.deletions[1]``)
and the session looks at that count before every read of a co-located partition (one
memory read: :meth:`Session.check_revoked`); when it moved, the session asks the server
whether its own key is still admitted (a ``heartbeat``) and, refused, raises the
:class:`AuthError` naming the revocation for that read and every later one, as the
heartbeat thread does when its own heartbeat is refused. The store sees a removed key
file within 0.2 s and counts it at its next tick (0.2 s): a co-located client stops
within :data:`REVOCATION_BOUND_S`. This is the library's own promise, not a wall: a
process of the store's user can map the segments itself (SECURITY.md).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from graphrun.errors import ArgumentError, AuthError, GraphrunError, RpcError, RpcTimeout
from graphrun.partition.book import PartitionBook
from graphrun.rpc.auth import KeyPair
from graphrun.rpc.codec import Message
from graphrun.rpc.events import LOST_TEXT
from graphrun.rpc.transport import RpcClient
from graphrun.store.replicas import WRITE_OPS, is_dropped, is_fenced
from graphrun.store.shm import OwnerWatch, same_host
from graphrun.store.state import PartitionInfo, received

log = logging.getLogger("graphrun.store")

# a backup (or replica) that does not answer a join in this long is skipped, and a
# primary with replicas given up on; one whose host refuses the connect (nothing listens
# there: a dead process on a live machine) at once
BACKUP_JOIN_S = 3.0
PRIMARY_JOIN_S = 5.0
# a heartbeat waits this long at most for a connection to its server (a server not
# connected now is skipped for the round: ZeroMQ reconnects it in the background)
HEARTBEAT_SEND_S = 0.1
# a co-located client of a revoked key stops reading shared memory within this long
# (the store's directory check and tick, 0.2 s each, and one request; see the docstring)
REVOCATION_BOUND_S = 2.0


@dataclass(frozen=True)
class ClientConfig:
    servers: Sequence[str]  # main server address of every partition
    job: str = "default"
    keys: KeyPair | None = None
    timeout: float = 30.0
    heartbeat_interval: float = 5.0  # <= 0: no heartbeat thread
    use_shm: bool | None = None  # None: when the server is on this machine
    load_balance: bool = True  # spread pulls and requests over main + backups
    # Split remote answers larger than this into requests all in flight at once (spread
    # over backups), so that one chunk's CURVE encryption on the server overlaps the
    # previous chunk's decryption here. None: 8 MiB with CURVE, off in plaintext (where
    # it lost on this machine); 0: off. See benchmarks/README.md.
    pull_chunk_bytes: int | None = None
    max_chunks: int = 16
    name: str = ""
    # servers[i]'s replicas, joined in its place when servers[i] does not answer the join
    # (a primary that died before this client started); later replicas come from the join
    replicas: Sequence[Sequence[str]] = ()


@dataclass
class PartServers:
    """The connections to one partition's servers."""

    main: RpcClient
    conns: list[RpcClient]  # main first, then backups
    info: PartitionInfo  # the main server's join reply
    rr: itertools.count = field(default_factory=itertools.count)
    local: bool = False  # on this machine: its shared memory can be mapped
    replicas: list[RpcClient] = field(default_factory=list)  # joined, in failover order
    dead: list[RpcClient] = field(default_factory=list)  # primaries given up on
    watch: OwnerWatch | None = None  # a co-located replicated primary's process
    revocations: np.ndarray | None = None  # a co-located main server's counters, mapped
    revocations_seen: int = 0  # revocations[1] when this session last asked
    stale: dict[str, tuple[int, int, np.ndarray | None]] = field(default_factory=dict)
    owner: OwnerWatch | None = None  # the co-located main server's process (live_client)


@dataclass(frozen=True)
class Pending:
    """A request in flight (see :meth:`Session.request`); kept whole for a failover."""

    conn: RpcClient
    request_id: int
    part: int = -1
    op: str = ""
    body: Mapping[str, Any] = field(default_factory=dict)
    tensors: Sequence[np.ndarray] = ()


def lost(exc: BaseException) -> bool:
    """``exc`` means the server is gone (timeout, lost connection), fenced, or a replica
    dropped from the write set (it misses writes)."""
    return type(exc) in (RpcError, RpcTimeout) or is_fenced(exc) or is_dropped(exc)


def _revocation_counter(info: PartitionInfo) -> np.ndarray | None:
    """A co-located main server's deletion, revocation (and live graph) counters, mapped
    (None: it has no revocation counter, or its memory is not visible from here)."""
    seg = info.deletions
    if seg is None or len(seg.shape) != 1 or not 2 <= seg.shape[0] <= 4:
        return None
    try:
        return seg.attach(info.shm_dir)
    except GraphrunError:
        return None


class _Heartbeat(threading.Thread):
    """Beats every server the session still uses, all at once: each round sends a
    heartbeat to every address ``addresses()`` gives now (a primary given up on, a
    replica pruned or a backup dropped is no longer among them), then waits for the
    answers under one deadline. A dead or stopped server thus costs a round one timeout
    however many there are, and never holds up the others' beats: the live servers hear
    from the session every ``interval`` + at most ``max(interval, 1)`` s, well inside
    their heartbeat timeout."""

    def __init__(
        self,
        addresses: Callable[[], list[str]],
        body: Callable[[], dict[str, Any]],
        cfg: ClientConfig,
        on_revoked: Callable[[AuthError], None],
    ) -> None:
        super().__init__(name="graphrun-heartbeat", daemon=True)
        self._addresses, self._body, self._cfg = addresses, body, cfg
        self._on_revoked = on_revoked
        self.stopped = threading.Event()
        self.rounds = 0  # finished rounds (tests)

    def run(self) -> None:
        interval = self._cfg.heartbeat_interval
        ctx = zmq.Context()
        timeout = max(interval, 1.0)
        conns: dict[str, RpcClient] = {}

        def connected(now: list[str]) -> list[RpcClient]:
            for gone in set(conns) - set(now):
                conns.pop(gone).close()
            for a in now:  # connected well before their first beat (a handshake's time)
                if a not in conns:
                    conns[a] = RpcClient(a, keys=self._cfg.keys, timeout=timeout, context=ctx)
            return [conns[a] for a in now]

        try:
            connected(self._addresses())
            while not self.stopped.wait(interval):
                self._round(connected(self._addresses()), timeout)
                self.rounds += 1
        finally:
            for c in conns.values():
                c.close()
            ctx.destroy(linger=0)

    def _round(self, conns: list[RpcClient], timeout: float) -> None:
        body = self._body()
        sent = []
        for c in conns:  # a server not connected now (gone, or reconnecting) is skipped
            try:
                sent.append((c, c.send("heartbeat", body, connect_timeout=HEARTBEAT_SEND_S)))
            except GraphrunError as exc:
                log.warning("heartbeat to %s failed: %s", c.address, exc)
        deadline = time.monotonic() + timeout
        for c, rid in sent:
            try:
                reply = c.wait(rid, max(0.0, deadline - time.monotonic()))
                if not reply.body.get("known", False):
                    log.warning("store %s no longer knows this client", c.address)
            except AuthError as exc:
                log.warning("heartbeat to %s refused: %s", c.address, exc)
                self._on_revoked(exc)
            except GraphrunError as exc:
                log.warning("heartbeat to %s failed: %s", c.address, exc)


class Session:
    """One job's session with every partition of a store (see the module docstring)."""

    def __init__(self, cfg: ClientConfig) -> None:
        if not cfg.servers:
            raise ArgumentError("servers: at least one store server address is needed")
        if not cfg.job:
            raise ArgumentError("job: must be a non-empty name")
        self.cfg = cfg
        self.id = f"{cfg.name or 'client'}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.parts: dict[int, PartServers] = {}
        self.traffic: Counter[tuple[int, str]] = Counter()
        self._ctx = zmq.Context()  # one zmq I/O thread for all of this client's connections
        self._heartbeat: _Heartbeat | None = None
        self._stopped = False
        self._writes = itertools.count()
        self.failovers: list[tuple[int, str, str]] = []  # (partition, lost, took over)
        self.revoked: AuthError | None = None  # this session's key, refused by a server
        # a live graph's version every read carries ("v"; store/live_client.py); None: base
        self.version: int | None = None
        try:
            self._join()
        except BaseException:
            self.close()
            raise

    def _open(self, address: str, optional: bool = False) -> RpcClient:
        """A connection to ``address``; ``optional``: its join has somewhere else to go, so
        a refused connect (nothing listens there) gives up at once (RpcClient)."""
        return RpcClient(
            address,
            keys=self.cfg.keys,
            timeout=self.cfg.timeout,
            context=self._ctx,
            give_up_if_refused=optional,
        )

    def _join_others(
        self, what: str, addresses: Sequence[str], part: int, join: dict[str, Any]
    ) -> list[RpcClient]:
        """Connections to a partition's backups or replicas that answered ``join``."""
        joined = []
        for address in addresses:
            conn = self._open(address, optional=True)
            try:
                conn.call("join", join, timeout=min(self.cfg.timeout, BACKUP_JOIN_S))
            except GraphrunError as exc:  # gone, or a replica dropped since the join reply
                if not isinstance(exc, RpcError) and not is_dropped(exc):
                    conn.close()
                    raise
                log.warning("%s %s of partition %d skipped: %s", what, address, part, exc)
                conn.close()
                continue
            joined.append(conn)
        return joined

    def base(self) -> dict[str, Any]:
        """The fields every request of this session carries."""
        return {"s": self.id, "job": self.cfg.job}

    def in_use(self) -> list[str]:
        """The addresses of the servers this session still uses (its heartbeats' list):
        each partition's main server, backups and replicas, not those given up on."""
        return [c.address for p in list(self.parts.values()) for c in [*p.conns, *p.replicas]]

    def _beat(self) -> dict[str, Any]:
        """A heartbeat's body: a live session's version too (its pin: store/compact.py)."""
        v = self.version
        return self.base() if v is None else {**self.base(), "v": v}

    def _join(self) -> None:
        join = {**self.base(), "client": self.cfg.name}
        for i, address in enumerate(self.cfg.servers):
            fallbacks = self.cfg.replicas[i] if i < len(self.cfg.replicas) else ()
            conn, info = self._join_one(address, fallbacks, join)
            if info.index != 0:
                conn.close()
                raise ArgumentError(
                    f"servers: {address} is backup {info.index} of partition {info.part}; "
                    "give the main server's address (backups are found through it)"
                )
            if info.part in self.parts:
                conn.close()
                raise ArgumentError(f"servers: two addresses serve partition {info.part}")
            entry = PartServers(conn, [conn], info)
            self.parts[info.part] = entry
            # a backup or replica that does not answer is skipped, never fatal (the main
            # server, or the primary, serves alone)
            entry.conns += self._join_others("backup", info.backups, info.part, join)
            entry.replicas += self._join_others("replica", info.replicas, info.part, join)
            if self.cfg.use_shm is not False:
                entry.local = same_host(info.host, info.shm_dir)
            if entry.local:
                entry.revocations = _revocation_counter(info)
                if entry.revocations is not None and info.deletions is not None:
                    entry.revocations_seen = int(entry.revocations[1])
                    entry.owner = OwnerWatch(info.deletions.segment)  # while it is alive
            if entry.local and entry.replicas and info.deletions is not None:
                entry.watch = OwnerWatch(info.deletions.segment)
        first = next(iter(self.parts.values())).info
        self.book = PartitionBook.from_config(first.book, source="store server")
        if sorted(self.parts) != list(range(self.book.num_parts)):
            raise ArgumentError(
                f"servers: got partitions {sorted(self.parts)}, the graph has {self.book.num_parts}"
            )
        if self.cfg.heartbeat_interval > 0:
            self._heartbeat = _Heartbeat(self.in_use, self._beat, self.cfg, self._refused)
            self._heartbeat.start()

    def _join_one(
        self, address: str, fallbacks: Sequence[str], join: dict[str, Any]
    ) -> tuple[RpcClient, PartitionInfo]:
        """Join ``address``, or the first of its replicas that answers when it is gone."""
        candidates = [address, *fallbacks]
        for n, candidate in enumerate(candidates):
            last = n + 1 == len(candidates)
            conn = self._open(candidate, optional=not last)
            try:
                # with a replica to go to, a silent primary is given up on quickly (a
                # refused one at once): the sessions already joined must not time out
                # before the heartbeat starts
                wait = self.cfg.timeout if last else min(self.cfg.timeout, PRIMARY_JOIN_S)
                info = received(PartitionInfo, conn.call("join", join, timeout=wait).body)
            except BaseException as exc:
                conn.close()
                if last or not lost(exc):
                    raise
                log.warning("store server %s did not answer the join (%s)", candidate, exc)
                continue
            if n:
                self.failovers.append((info.part, address, candidate))
                log.warning("partition %d: its replica %s serves it", info.part, candidate)
            return conn, info
        raise ArgumentError("servers: no address to join")  # candidates is never empty

    def part(self, part: int) -> PartServers:
        try:
            return self.parts[int(part)]
        except (KeyError, ValueError, TypeError):
            raise ArgumentError(f"part: {part!r} is not a partition of this store") from None

    def local_ok(self, part: int) -> bool:
        """Whether partition ``part``'s rows may be read from shared memory. A replicated
        partition's co-located primary may have died without this client sending it
        anything yet: its memory would serve rows the replica has since changed, so its
        process is looked at (a pidfd poll) and, if it is gone, the partition fails over."""
        e = self.part(part)
        self.check_revoked(part)
        if e.local and e.watch is not None and e.watch.gone():
            self._fail_over(part, e, RpcError("its process is gone", address=e.main.address))
        return e.local

    def check_revoked(self, part: int) -> None:
        """Raise the :class:`AuthError` of this session's key once a server refused it; a
        co-located partition's shared memory is read only after this check (see the
        module docstring: one memory read, a request only after some key was revoked)."""
        if self.revoked is not None:
            raise self.revoked
        e = self.parts.get(part)
        counter = e.revocations if e is not None and e.local else None
        if e is None or counter is None or int(counter[1]) == e.revocations_seen:
            return
        now = int(counter[1])
        try:
            e.main.call("heartbeat", self.base(), timeout=min(self.cfg.timeout, 5.0))
        except AuthError as exc:
            self._refused(exc)
            raise
        e.revocations_seen = now

    def _refused(self, exc: AuthError) -> None:
        """A server refused this session's key: no shared memory is read from now on."""
        if self.revoked is None:
            log.warning("this job's key is refused (%s): its shared memory is not read", exc)
            self.revoked = exc

    def use_network(self, part: int) -> None:
        """Reach partition ``part`` over the network from now on: its shared memory
        turned out not to be usable from here (the catalog could not map it)."""
        self.part(part).local = False

    def _pick(self, part: int) -> RpcClient:
        e = self.part(part)
        if not self.cfg.load_balance or len(e.conns) == 1:
            return e.main
        return e.conns[next(e.rr) % len(e.conns)]

    def request(
        self,
        part: int,
        op: str,
        body: Mapping[str, Any] | None = None,
        tensors: Sequence[np.ndarray] = (),
        main_only: bool = False,
    ) -> Pending:
        """Send ``op`` to a server of ``part`` (load-balanced unless ``main_only``)."""
        full = {**(body or {}), **self.base()}
        if self.version is not None and op not in WRITE_OPS and "v" not in full:
            full["v"] = self.version  # the delta is the main server's: a read goes there
            main_only = True
        conn = self.part(part).main if main_only or op in WRITE_OPS else self._pick(part)
        conn = self._joined(part, conn)
        if op in WRITE_OPS:
            full["w"] = next(self._writes)
        return Pending(conn, conn.send(op, full, tensors), part, op, full, tensors)

    def _joined(self, part: int, conn: RpcClient) -> RpcClient:
        """``conn``, or the server to ask instead when its connection was lost since this
        session joined: its server is gone, or restarted on the address without the
        session (it refuses the requests that need one). As for a request in flight on
        it then: a backup is dropped, a primary with replicas fails over; a main server
        without replicas is kept (a restarted one answers what needs no session)."""
        e = self.part(part)
        while True:
            conn.take_in()  # the connection's news (a loss fails its requests in flight)
            if not conn.losses or (conn is e.main and not e.replicas):
                return conn
            lost = RpcError(LOST_TEXT, address=conn.address)
            if conn is e.main:
                self._fail_over(part, e, lost)
            else:
                self._drop_backup(e, conn, lost)
            conn = e.main

    def _drop_backup(self, e: PartServers, conn: RpcClient, exc: Exception) -> None:
        log.warning("backup %s failed (%s); using the main server", conn.address, exc)
        if conn in e.conns:
            e.conns.remove(conn)
            conn.close()

    def ready(self, pending: Pending) -> bool:
        """Whether :meth:`wait` for ``pending`` would not block on its server (its reply
        or error is here; one sent before a failover is sent again by ``wait``)."""
        e = self.parts.get(pending.part)
        return (e is not None and pending.conn in e.dead) or pending.conn.ready(pending.request_id)

    def wait(self, pending: Pending, timeout: float | None = None) -> Message:
        """The reply; a backup that is gone (timeout, lost connection) is dropped from the
        rotation and the request is sent again to the partition's main server; a primary
        that is gone fails over to its replica (see the module docstring)."""
        e = self.parts.get(pending.part)
        if e is not None and pending.conn in e.dead:  # sent before the failover
            msg = self._resend(e, pending, timeout)
        else:
            try:
                msg = pending.conn.wait(pending.request_id, timeout)
            except GraphrunError as exc:
                if e is None or not lost(exc):
                    raise
                if pending.conn is e.main:
                    if not e.replicas:
                        raise
                    self._fail_over(pending.part, e, exc)
                else:
                    self._drop_backup(e, pending.conn, exc)
                msg = self._resend(e, pending, timeout)
        if e is not None and e.replicas and "replicas" in msg.body:
            self._prune(pending.part, e, msg.body["replicas"])
        self.traffic[pending.part, pending.op] += sum(t.nbytes for t in msg.tensors)
        return msg

    def wait_all(self, pending: Sequence[Pending]) -> list[Message]:
        """The replies to ``pending``, in order: every one waited for before the first
        error is raised, so that none is left in flight."""
        got, errors = [], []
        for p in pending:
            try:
                got.append(self.wait(p))
            except GraphrunError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        return got

    def _prune(self, part: int, e: PartServers, write_set: Any) -> None:
        """Forget the replicas the primary dropped from its write set: they miss writes,
        and failing over to one would lose them."""
        keep = set(write_set) if isinstance(write_set, list) else set()
        for r in [r for r in e.replicas if r.address not in keep]:
            log.warning("partition %d: replica %s left the write set; not used", part, r.address)
            e.replicas.remove(r)
            r.close()

    def _resend(self, e: PartServers, pending: Pending, timeout: float | None) -> Message:
        while True:
            main = e.main
            try:
                return main.wait(main.send(pending.op, pending.body, pending.tensors), timeout)
            except GraphrunError as exc:
                if not lost(exc) or not e.replicas:
                    raise
                self._fail_over(pending.part, e, exc)

    def _fail_over(self, part: int, e: PartServers, exc: Exception) -> None:
        """Partition ``part``'s server ``e.main`` is gone: its next replica serves."""
        lost, e.main = e.main, e.replicas.pop(0)
        for c in e.conns:
            if c is not lost:
                c.close()  # the lost primary's backups: its shared memory has stale rows
        e.dead.append(lost)
        e.conns, e.local = [e.main], False
        for w in (e.watch, e.owner):
            if w is not None:
                w.close()
        e.watch = e.owner = None
        self.failovers.append((part, lost.address, e.main.address))
        log.warning(
            "partition %d: server %s lost (%s); replica %s took over",
            part,
            lost.address,
            exc,
            e.main.address,
        )

    def call(self, part: int, op: str, body: Mapping[str, Any] | None = None, **kw: Any) -> Message:
        return self.wait(self.request(part, op, body, **kw))

    def call_all(self, op: str, body: Mapping[str, Any] | None = None) -> dict[int, Message]:
        """``op`` on every partition's main server at once: the replies by partition.
        Every server answers before an error is raised, so none is still mid-way (a
        failed ``init`` cleaning up its segment) when the caller goes on."""
        pending = {p: self.request(p, op, body, main_only=True) for p in self.parts}
        replies: dict[int, Message] = {}
        error: GraphrunError | None = None
        for p, r in pending.items():
            try:
                replies[p] = self.wait(r)
            except GraphrunError as exc:
                error = error or exc
        if error is not None:
            raise error
        return replies

    def stop_servers(self) -> None:
        """Ask every server to shut down (backups first). A server that goes before it
        answers is fine; one that refuses (a job key: only the store's admin key may stop
        it) raises AuthError."""
        for p in self.parts.values():
            for c in p.replicas + p.conns[::-1]:
                try:
                    c.call("stop", self.base(), timeout=5)
                except AuthError:
                    raise
                except RpcError as exc:  # gone before it answered, or already gone
                    log.info("stop %s: %s", c.address, exc)
        self._stopped = True

    def stop_heartbeat(self) -> None:
        """Stop sending heartbeats (before stopping the servers: a heartbeat to a stopped
        server is a warning)."""
        if self._heartbeat is not None:
            self._heartbeat.stopped.set()
            self._heartbeat.join(5)
            self._heartbeat = None

    def close(self) -> None:
        """Leave every server (frees this job's tensors if it was the last client)."""
        self.stop_heartbeat()
        for e in self.parts.values():
            for w in (e.watch, e.owner):
                if w is not None:
                    w.close()
            for c in e.dead:
                c.close()
            for c in e.conns + e.replicas:
                if not self._stopped:
                    with contextlib.suppress(GraphrunError):
                        c.call("leave", self.base(), timeout=2)
                c.close()
        self.parts.clear()
        self._ctx.destroy(linger=0)  # closes any socket still open; never blocks
