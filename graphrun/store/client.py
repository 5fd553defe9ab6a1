"""The KV client: pull/push rows by global id across every partition's servers.

A client is given the main server address of each partition (any order) and a job
name. It joins every main server and the backups they announce (one session id
for all), fetches the partition book from them, and keeps the session alive with a
heartbeat thread (its own sockets). Any number of clients of any number of jobs
may join and leave a running store at any time.

``pull(name, ids)``: ids are checked and mapped to owners with the tensor's
partition policy (``searchsorted`` over contiguous ranges); the requests to remote
owners are sent first (load-balanced over main and backups), the co-located
partition — when this process can map the server's shared memory — is gathered
directly from it while they are in flight, and every answer is written back in
the caller's order. When all ids have one owner the answer is returned without any
reordering copy (a remote answer is the received frame itself, read-only).
Co-location is only an optimisation: ``use_shm=False`` forces the network path,
which returns the same bytes.

``push`` goes to each owner's main server (so that reducers of one partition are
applied by one process, in order). A client is not thread-safe: use one per thread
or process.

``traffic`` counts the bytes this client got from each partition, by operation: the
tensors of every reply (``(part, op)``) and the rows gathered from shared memory
(``(part, "pull:shm")``). The trainers' per-batch profile records are its deltas.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import threading
import uuid
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from graphrun.errors import ArgumentError, GraphrunError, RpcError, RpcTimeout
from graphrun.partition.book import PartitionBook
from graphrun.rpc.auth import KeyPair
from graphrun.rpc.codec import DEFAULT_LIMITS, Message
from graphrun.rpc.transport import RpcClient
from graphrun.store.policy import PartitionPolicy, lookup_policy, policies_from_book
from graphrun.store.server import host_identity
from graphrun.store.shm import attach
from graphrun.store.state import TensorInfo

log = logging.getLogger("graphrun.store")


DEFAULT_CURVE_CHUNK = 8 << 20


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


# Requests are split so no frame exceeds this: servers refuse bigger frames (Limits).
REQUEST_FRAME_BYTES = DEFAULT_LIMITS.max_request_frame_bytes // 2


def _push_pieces(rows: np.ndarray, values: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """One push as pieces whose frames fit ``REQUEST_FRAME_BYTES``. Every row's updates
    stay in one piece (sorted by row, cut between rows), so a reducer that combines the
    duplicates of a row (sparse optimizers) or lets the last one win (assign) does
    exactly what it does on the whole push."""
    nbytes = max(values.nbytes, rows.nbytes)
    if nbytes <= REQUEST_FRAME_BYTES or len(rows) < 2:
        return [(rows, values)]
    order = np.argsort(rows, kind="stable")
    rows, values = rows[order], values[order]
    per = max(1, len(rows) * REQUEST_FRAME_BYTES // nbytes)
    out, a = [], 0
    while a < len(rows):
        b = min(a + per, len(rows))
        while b < len(rows) and rows[b] == rows[b - 1]:
            b += 1  # never cut a row's duplicates apart
        out.append((rows[a:b], values[a:b]))
        a = b
    return out


BACKUP_JOIN_S = 3.0  # a backup that does not answer a join in this long is skipped


@dataclass
class _Part:
    main: RpcClient
    conns: list[RpcClient]  # main first, then backups
    info: dict[str, Any]
    rr: itertools.count = field(default_factory=itertools.count)
    local: bool = False


@dataclass(frozen=True)
class Pending:
    """A request in flight (see :meth:`KVClient.request`); kept whole for a failover."""

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


class KVClient:
    """A client of a running store (see the module docstring)."""

    def __init__(self, cfg: ClientConfig) -> None:
        if not cfg.servers:
            raise ArgumentError("servers: at least one store server address is needed")
        if not cfg.job:
            raise ArgumentError("job: must be a non-empty name")
        self.cfg = cfg
        self.job = cfg.job
        self.session = f"{cfg.name or 'client'}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._parts: dict[int, _Part] = {}
        self._infos: dict[str, TensorInfo] = {}
        self._local_seg: dict[tuple[str, int], TensorInfo] = {}
        self._local_arrays: dict[tuple[str, int], np.ndarray] = {}
        self._stopped = False
        self._ctx = zmq.Context()  # one zmq I/O thread for all of this client's connections
        self._heartbeat: _Heartbeat | None = None
        self._closed = False
        self.traffic: Counter[tuple[int, str]] = Counter()
        try:
            self._connect()
        except BaseException:
            self.close()
            raise
        # A process that exits without close() would hold its session (and its job's
        # tensors) on every server until the heartbeat timeout; leave at exit instead.
        ref = weakref.ref(self)

        def _at_exit() -> None:
            c = ref()
            if c is not None:
                c.close()

        self._at_exit = _at_exit
        atexit.register(self._at_exit)

    # ---- connection -----------------------------------------------------------------

    def _open(self, address: str) -> RpcClient:
        return RpcClient(address, keys=self.cfg.keys, timeout=self.cfg.timeout, context=self._ctx)

    def _base(self) -> dict[str, Any]:
        return {"s": self.session, "job": self.job}

    def _connect(self) -> None:
        join = {**self._base(), "client": self.cfg.name}
        me = None
        for address in self.cfg.servers:
            conn = self._open(address)
            try:
                info = conn.call("join", join).body
            except BaseException:
                conn.close()
                raise
            part = int(info["part"])
            if int(info["index"]) != 0:
                conn.close()
                raise ArgumentError(
                    f"servers: {address} is backup {info['index']} of partition {part}; "
                    "give the main server's address (backups are found through it)"
                )
            if part in self._parts:
                conn.close()
                raise ArgumentError(f"servers: two addresses serve partition {part}")
            entry = _Part(conn, [conn], dict(info))
            self._parts[part] = entry
            for b in info["backups"]:
                bc = self._open(b)
                try:  # a backup that does not answer is skipped, never fatal
                    bc.call("join", join, timeout=min(self.cfg.timeout, BACKUP_JOIN_S))
                except RpcError as exc:
                    log.warning("backup %s of partition %d skipped: %s", b, part, exc)
                    bc.close()
                    continue
                entry.conns.append(bc)
            if self.cfg.use_shm is not False:
                me = me or host_identity(Path(info["shm_dir"]))
                entry.local = info["host"] == me
            for t in info["tensors"]:
                ti = TensorInfo.from_wire(t)
                self._infos.setdefault(ti.name, ti)
                if entry.local:
                    self._local_seg[(ti.name, part)] = ti
        first = next(iter(self._parts.values())).info
        self.book = PartitionBook.from_config(first["book"], source="store server")
        self.policies = policies_from_book(self.book)
        if sorted(self._parts) != list(range(self.book.num_parts)):
            raise ArgumentError(
                f"servers: got partitions {sorted(self._parts)}, the graph has "
                f"{self.book.num_parts}"
            )
        if self.cfg.heartbeat_interval > 0:
            addresses = [c.address for p in self._parts.values() for c in p.conns]
            self._heartbeat = _Heartbeat(addresses, self._base(), self.cfg)
            self._heartbeat.start()

    @property
    def num_parts(self) -> int:
        return self.book.num_parts

    @property
    def local_parts(self) -> list[int]:
        """Partitions whose shared memory this client reads directly."""
        return sorted(p for p, e in self._parts.items() if e.local)

    def servers_of(self, part: int) -> list[str]:
        return [c.address for c in self._part(part).conns]

    def _part(self, part: int) -> _Part:
        try:
            return self._parts[int(part)]
        except (KeyError, ValueError, TypeError):
            raise ArgumentError(f"part: {part!r} is not a partition of this store") from None

    def _pick(self, part: int) -> RpcClient:
        e = self._part(part)
        if not self.cfg.load_balance or len(e.conns) == 1:
            return e.main
        return e.conns[next(e.rr) % len(e.conns)]

    # ---- generic requests (for extensions such as sampling) --------------------------

    def request(
        self,
        part: int,
        op: str,
        body: Mapping[str, Any] | None = None,
        tensors: Sequence[np.ndarray] = (),
        main_only: bool = False,
    ) -> Pending:
        """Send ``op`` to a server of ``part`` (load-balanced unless ``main_only``)."""
        conn = self._part(part).main if main_only else self._pick(part)
        full = {**(body or {}), **self._base()}
        return Pending(conn, conn.send(op, full, tensors), part, op, full, tensors)

    def wait(self, pending: Pending, timeout: float | None = None) -> Message:
        """The reply; a backup that is gone (timeout, lost connection) is dropped from the
        rotation and the request is sent again to the partition's main server."""
        try:
            msg = pending.conn.wait(pending.request_id, timeout)
        except RpcError as exc:
            e = self._parts.get(pending.part)
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

    # ---- tensors --------------------------------------------------------------------

    def meta(self, name: str) -> TensorInfo:
        """Name, policy, dtype and global shape of a tensor visible to this job."""
        ti = self._infos.get(name)
        if ti is None:
            parts = self.local_parts or [0]
            for p in parts:
                got = TensorInfo.from_wire(self.call(p, "meta", {"name": name}).body["info"])
                self._infos[name] = got
                if self._parts[p].local:
                    self._local_seg[(name, p)] = got
            ti = self._infos[name]
        return ti

    def _forget(self, name: str) -> None:
        self._infos.pop(name, None)
        for p in self._parts:
            self._local_seg.pop((name, p), None)
            self._local_arrays.pop((name, p), None)

    def _stale(self, name: str) -> bool:
        """Whether a mapped segment of ``name`` was unlinked (the tensor was deleted, maybe
        re-created, by another client): one ``stat`` per co-located partition."""
        for (n, p), seg in self._local_seg.items():
            if n == name and (n, p) in self._local_arrays:
                path = Path(self._parts[p].info["shm_dir"]) / seg.segment
                if not path.exists():
                    return True
        return False

    def policy(self, name: str) -> PartitionPolicy:
        return lookup_policy(self.policies, self.meta(name).policy)

    def list_tensors(self) -> list[TensorInfo]:
        got = self.call(0, "list").body["tensors"]
        return [TensorInfo.from_wire(t) for t in got]

    def init_tensor(
        self,
        name: str,
        policy: str,
        row_shape: Sequence[int] = (),
        dtype: str = "float32",
        *,
        init: str = "zeros",
        init_args: Mapping[str, Any] | None = None,
        persistent: bool = False,
        exist_ok: bool = False,
    ) -> TensorInfo:
        """Create a tensor on every partition (rows split by ``policy``)."""
        lookup_policy(self.policies, policy)
        body = {
            "name": name,
            "policy": policy,
            "dtype": str(np.dtype(dtype)),
            "row_shape": [int(x) for x in row_shape],
            "init": init,
            "init_args": dict(init_args or {}),
            "persistent": persistent,
            "exist_ok": exist_ok,
        }
        pend = {p: self.request(p, "init", body, main_only=True) for p in self._parts}
        infos = {p: TensorInfo.from_wire(self.wait(r).body["info"]) for p, r in pend.items()}
        for p, ti in infos.items():
            for backup in self._parts[p].conns[1:]:
                backup.call("attach", {**self._base(), "name": ti.name})
            if self._parts[p].local:
                self._local_seg[(name, p)] = ti
                self._local_arrays.pop((name, p), None)
        self._infos[name] = infos[0]
        return infos[0]

    def delete_tensor(self, name: str) -> None:
        for e in self._parts.values():
            e.main.call("delete", {**self._base(), "name": name})
        self._forget(name)

    def _local_array(self, ti: TensorInfo, part: int) -> np.ndarray | None:
        key = (ti.name, part)
        arr = self._local_arrays.get(key)
        if arr is None:
            seg = self._local_seg.get(key)
            if seg is None:
                return None
            shm_dir = Path(self._parts[part].info["shm_dir"])
            try:
                arr = attach(
                    shm_dir, seg.segment, seg.dtype, (seg.part_rows, *seg.row_shape), False
                )
            except GraphrunError as exc:  # not visible from here after all: use the network
                log.info("shared memory of partition %d not usable (%s)", part, exc)
                self._parts[part].local = False
                return None
            self._local_arrays[key] = arr
        return arr

    def _groups(
        self, pol: PartitionPolicy, ids: np.ndarray
    ) -> list[tuple[int, np.ndarray | None, np.ndarray]]:
        """(part, positions in ids or None for all, local rows) per owner partition."""
        parts = pol.to_part(ids)
        if pol.num_parts == 1 or (len(ids) and parts.min() == parts.max()):
            p = int(parts[0]) if len(ids) else 0
            return [(p, None, pol.to_local(ids, p))]
        order = np.argsort(parts, kind="stable")
        bounds = np.searchsorted(parts[order], np.arange(pol.num_parts + 1))
        out: list[tuple[int, np.ndarray | None, np.ndarray]] = []
        for p in range(pol.num_parts):
            pos = order[bounds[p] : bounds[p + 1]]
            if len(pos):
                out.append((p, pos, pol.to_local(ids[pos], p)))
        return out

    def _chunks(self, ti: TensorInfo, pos: np.ndarray | None, rows: np.ndarray) -> list[Any]:
        """Split one owner's rows into pieces of about ``pull_chunk_bytes`` of answer:
        (destination in the output, rows) pairs; the destination is a slice when the
        group covers the whole output, else positions."""
        row_bytes = ti.row_bytes
        limit = self.cfg.pull_chunk_bytes
        if limit is None:
            limit = DEFAULT_CURVE_CHUNK if self.cfg.keys is not None else 0
        n = len(rows)
        k = 1 if limit <= 0 else max(1, min(n * row_bytes // limit, self.cfg.max_chunks))
        k = max(k, -(-n * rows.itemsize // REQUEST_FRAME_BYTES))  # the ids frame fits too
        bounds = [n * i // k for i in range(k + 1)]
        out = []
        for a, b in itertools.pairwise(bounds):
            dest = slice(a, b) if pos is None else pos[a:b]
            out.append((dest, rows[a:b]))
        return out

    def pull(self, name: str, ids: Any) -> np.ndarray:
        """Rows ``ids`` (global ids of the tensor's id space) in the given order."""
        if self._stale(name):
            self._forget(name)
        ti = self.meta(name)
        pol = lookup_policy(self.policies, ti.policy)
        ids = pol.check_ids(ids)
        groups = self._groups(pol, ids)
        remote, local = [], []
        for p, pos, rows in groups:  # remote requests first (large ones in pipelined chunks)
            arr = self._local_array(ti, p) if self._parts[p].local else None
            if arr is None:
                for dest, part_rows in self._chunks(ti, pos, rows):
                    pend = self.request(p, "pull", {"name": name}, (part_rows,))
                    remote.append((dest, pend))
            else:
                local.append((pos, arr, rows))
                self.traffic[p, "pull:shm"] += len(rows) * ti.row_bytes
        if len(remote) == 1 and not local and isinstance(remote[0][0], slice):
            return self.wait(remote[0][1]).tensors[0]  # the received frame, no copy
        if len(local) == 1 and not remote and local[0][0] is None:
            return np.take(local[0][1], local[0][2], axis=0)  # one gather, nothing else
        out = np.empty((len(ids), *ti.row_shape), dtype=ti.dtype)
        for pos, arr, rows in local:  # the co-located partition, while the rest is in flight
            # ids are checked already; mode="clip" keeps np.take from buffering its output
            out[pos] = np.take(arr, rows, axis=0, mode="clip")
        for dest, pend in remote:
            out[dest] = self.wait(pend).tensors[0]
        return out

    def push(
        self,
        name: str,
        ids: Any,
        values: np.ndarray,
        reducer: str = "assign",
        params: Mapping[str, Any] | None = None,
        states: Sequence[str] = (),
    ) -> None:
        """Apply ``reducer`` to rows ``ids`` with ``values`` on their owners' servers."""
        ti = self.meta(name)
        pol = lookup_policy(self.policies, ti.policy)
        ids = pol.check_ids(ids)
        values = np.asarray(values)
        if values.ndim == 0 or len(values) != len(ids):
            raise ArgumentError(
                f"values: {values.shape[:1] or 'a scalar'} rows for {len(ids)} ids of {name!r}"
            )
        body = {"name": name, "reducer": reducer, "params": dict(params or {})}
        body["states"] = list(states)
        pend = []
        for p, pos, rows in self._groups(pol, ids):
            vals = values if pos is None else values[pos]
            for piece in _push_pieces(rows, vals):
                pend.append(self.request(p, "push", body, piece, main_only=True))
        errors = []
        for request in pend:
            try:
                self.wait(request)
            except GraphrunError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    # ---- structure and administration ------------------------------------------------

    def local_structure(self, part: int) -> dict[str, np.ndarray] | None:
        """The CSC arrays of a co-located partition, mapped read-only (None if remote)."""
        e = self._part(part)
        if not e.local:
            return None
        shm_dir = Path(e.info["shm_dir"])
        return {
            k: attach(shm_dir, s["segment"], s["dtype"], tuple(s["shape"]), False)
            for k, s in e.info["structure"].items()
        }

    def stats(self, part: int, index: int = 0) -> dict[str, Any]:
        conn = self._part(part).conns[index]
        return dict(conn.call("stats", self._base()).body)

    def stop_servers(self) -> None:
        """Ask every main server to shut down (backups stop with their command)."""
        for p in self._parts.values():
            for c in p.conns[::-1]:
                with contextlib.suppress(RpcError):
                    c.call("stop", self._base(), timeout=5)
        self._stopped = True

    def close(self) -> None:
        """Leave every server (frees this job's tensors if it was the last client)."""
        if self._closed:
            return
        self._closed = True
        if hasattr(self, "_at_exit"):
            atexit.unregister(self._at_exit)
        if self._heartbeat is not None:
            self._heartbeat.stopped.set()
            self._heartbeat.join(5)
            self._heartbeat = None
        for e in self._parts.values():
            for c in e.conns:
                if not self._stopped:
                    with contextlib.suppress(GraphrunError):
                        c.call("leave", self._base(), timeout=2)
                c.close()
        self._parts.clear()
        self._local_arrays.clear()
        self._ctx.destroy(linger=0)  # closes any socket still open; never blocks

    def __enter__(self) -> KVClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
