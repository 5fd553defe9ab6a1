"""A client's session with a running store: join, heartbeat, requests with failover.

:class:`Session` joins the main server of every partition and the backups each one
announces (one session id for all), keeps the session alive with a heartbeat thread
(its own sockets), sends requests (load-balanced over main and backups) and, when a
backup is gone, drops it and sends the request again to the partition's main server.
``traffic`` counts the tensor bytes of every reply, by ``(partition, op)``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from graphrun.errors import ArgumentError, AuthError, GraphrunError, RpcError, RpcTimeout
from graphrun.partition.book import PartitionBook
from graphrun.rpc.auth import KeyPair
from graphrun.rpc.codec import Message
from graphrun.rpc.transport import RpcClient
from graphrun.store.shm import same_host
from graphrun.store.state import PartitionInfo

log = logging.getLogger("graphrun.store")

BACKUP_JOIN_S = 3.0  # a backup that does not answer a join in this long is skipped


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


@dataclass
class PartServers:
    """The connections to one partition's servers."""

    main: RpcClient
    conns: list[RpcClient]  # main first, then backups
    info: PartitionInfo  # the main server's join reply
    rr: itertools.count = field(default_factory=itertools.count)
    local: bool = False  # on this machine: its shared memory can be mapped


@dataclass(frozen=True)
class Pending:
    """A request in flight (see :meth:`Session.request`); kept whole for a failover."""

    conn: RpcClient
    request_id: int
    part: int = -1
    op: str = ""
    body: Mapping[str, Any] = field(default_factory=dict)
    tensors: Sequence[np.ndarray] = ()


class _Heartbeat(threading.Thread):
    def __init__(self, addresses: list[str], body: dict[str, Any], cfg: ClientConfig) -> None:
        super().__init__(name="graphrun-heartbeat", daemon=True)
        self._addresses, self._body, self._cfg = addresses, body, cfg
        self.stopped = threading.Event()

    def run(self) -> None:
        interval = self._cfg.heartbeat_interval
        ctx = zmq.Context()
        timeout = max(interval, 1.0)
        conns = [
            RpcClient(a, keys=self._cfg.keys, timeout=timeout, context=ctx) for a in self._addresses
        ]
        try:
            while not self.stopped.wait(interval):
                for c in conns:
                    try:
                        if not c.call("heartbeat", self._body).body.get("known", False):
                            log.warning("store %s no longer knows this client", c.address)
                    except GraphrunError as exc:
                        log.warning("heartbeat to %s failed: %s", c.address, exc)
        finally:
            for c in conns:
                c.close()
            ctx.destroy(linger=0)


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
        try:
            self._join()
        except BaseException:
            self.close()
            raise

    def _open(self, address: str) -> RpcClient:
        return RpcClient(address, keys=self.cfg.keys, timeout=self.cfg.timeout, context=self._ctx)

    def base(self) -> dict[str, Any]:
        """The fields every request of this session carries."""
        return {"s": self.id, "job": self.cfg.job}

    def _join(self) -> None:
        join = {**self.base(), "client": self.cfg.name}
        for address in self.cfg.servers:
            conn = self._open(address)
            try:
                info = PartitionInfo.from_wire(conn.call("join", join).body)
            except BaseException:
                conn.close()
                raise
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
            for b in info.backups:
                bc = self._open(b)
                try:  # a backup that does not answer is skipped, never fatal
                    bc.call("join", join, timeout=min(self.cfg.timeout, BACKUP_JOIN_S))
                except RpcError as exc:
                    log.warning("backup %s of partition %d skipped: %s", b, info.part, exc)
                    bc.close()
                    continue
                entry.conns.append(bc)
            if self.cfg.use_shm is not False:
                entry.local = same_host(info.host, info.shm_dir)
        first = next(iter(self.parts.values())).info
        self.book = PartitionBook.from_config(first.book, source="store server")
        if sorted(self.parts) != list(range(self.book.num_parts)):
            raise ArgumentError(
                f"servers: got partitions {sorted(self.parts)}, the graph has {self.book.num_parts}"
            )
        if self.cfg.heartbeat_interval > 0:
            addresses = [c.address for p in self.parts.values() for c in p.conns]
            self._heartbeat = _Heartbeat(addresses, self.base(), self.cfg)
            self._heartbeat.start()

    def part(self, part: int) -> PartServers:
        try:
            return self.parts[int(part)]
        except (KeyError, ValueError, TypeError):
            raise ArgumentError(f"part: {part!r} is not a partition of this store") from None

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
        conn = self.part(part).main if main_only else self._pick(part)
        full = {**(body or {}), **self.base()}
        return Pending(conn, conn.send(op, full, tensors), part, op, full, tensors)

    def wait(self, pending: Pending, timeout: float | None = None) -> Message:
        """The reply; a backup that is gone (timeout, lost connection) is dropped from the
        rotation and the request is sent again to the partition's main server."""
        try:
            msg = pending.conn.wait(pending.request_id, timeout)
        except RpcError as exc:
            e = self.parts.get(pending.part)
            if type(exc) not in (RpcError, RpcTimeout) or e is None or pending.conn is e.main:
                raise
            log.warning("backup %s failed (%s); using the main server", pending.conn.address, exc)
            if pending.conn in e.conns:
                e.conns.remove(pending.conn)
                pending.conn.close()
            rid = e.main.send(pending.op, pending.body, pending.tensors)
            msg = e.main.wait(rid, timeout)
        self.traffic[pending.part, pending.op] += sum(t.nbytes for t in msg.tensors)
        return msg

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
            for c in p.conns[::-1]:
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
            for c in e.conns:
                if not self._stopped:
                    with contextlib.suppress(GraphrunError):
                        c.call("leave", self.base(), timeout=2)
                c.close()
        self.parts.clear()
        self._ctx.destroy(linger=0)  # closes any socket still open; never blocks
