"""The state of one store server process: its partition, tensors, sessions.

Tensors live in namespaces: the graph's own data (features, labels, masks loaded
from the partition directory) is in :data:`GRAPH_JOB` (``""``) and visible to every
job; each job's tensors (``init`` by its clients, embeddings, optimizer state) are in
the job's namespace. A lookup tries the job's namespace, then the graph's.

A client joins with a session id and its job; every request refreshes the
session. A session not seen for ``heartbeat_timeout`` seconds is dropped; when a
job has no session left, its non-persistent tensors are freed.

The main server (``index == 0``) creates the shared-memory segments; backups attach
to the same segments and learn tensors made later by asking the main
(``resolver``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import numpy as np

from graphrun.errors import ArgumentError, AuthError, StoreError
from graphrun.names import PolicyName
from graphrun.partition.book import PartitionBook
from graphrun.rpc.codec import wire_dtype
from graphrun.store.disk import DiskRows, open_info
from graphrun.store.growth import GrowthRows
from graphrun.store.policy import PartitionPolicy, lookup_policy
from graphrun.store.shm import SegmentStore, attach
from graphrun.wire import convert

log = logging.getLogger("graphrun.store")

GRAPH_JOB = ""


class TensorInfo(msgspec.Struct, frozen=True):
    """What a client needs to use one tensor of one partition (on the wire as a map of
    these fields, :mod:`graphrun.wire`)."""

    name: str
    job: str
    policy: str
    dtype: str  # a name on the wire allow-list (rpc.codec.wire_dtype)
    row_shape: tuple[int, ...]
    num_rows: int
    part_rows: int
    segment: str  # "" for a tensor served from disk
    persistent: bool = True
    disk: bool = False  # served from the partition's file (graphrun.store.disk)
    file: str = ""  # a disk tensor's file, which co-located clients map read-only
    file_id: tuple[int, int, int] = (0, 0, 0)  # ... its graphrun.store.disk.file_id
    cache: tuple[str, str] = ("", "")  # a disk tensor's cache and slot index segments
    cache_rows: int = 0  # ... and the rows its cache holds

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)

    @property
    def row_bytes(self) -> int:
        return np.dtype(self.dtype).itemsize * int(np.prod(self.row_shape, dtype=np.int64))

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_rows, *self.row_shape)


class Segment(msgspec.Struct, frozen=True):
    """One array of a partition's structure in shared memory."""

    segment: str
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)

    def attach(self, shm_dir: Path) -> np.ndarray:
        """The array, mapped read-only."""
        return attach(shm_dir, self.segment, self.dtype, self.shape, False)


def _check_dtype(name: str) -> None:
    """ValueError unless ``name`` is the canonical name of an allowed wire dtype."""
    if wire_dtype(name).name != name:
        raise ValueError(f"dtype {name!r} is not {wire_dtype(name).name!r}")


class PartitionInfo(msgspec.Struct, frozen=True):
    """A server's answer to ``join`` (and ``info``): what a client needs to use it."""

    part: int
    index: int  # 0: the partition's main server; k > 0: its backup k
    backups: tuple[str, ...]  # the addresses of the main server's backups
    host: dict[str, str]  # see graphrun.store.shm.host_identity
    shm_dir: Path
    book: dict[str, Any]  # the partition book's config
    heartbeat_timeout: float
    tensors: tuple[TensorInfo, ...]  # those visible to the asking job
    structure: dict[str, Segment]  # the partition's CSC arrays
    deletions: Segment | None = None  # the main server's deletion and revocation counters
    replica: int = 0  # 0: the partition's primary; r > 0: its replica r (another machine)
    replicas: tuple[str, ...] = ()  # the primary's replicas (store/replicas.py)


W = TypeVar("W", TensorInfo, Segment, PartitionInfo)


def received(type_: type[W], data: Any) -> W:
    """A description a peer sent, checked against its declaration; ArgumentError naming
    the type and field otherwise (nothing is used before it is checked)."""
    return convert(type_, data, f"{type_.__name__} from a peer", ArgumentError)


@dataclass
class StoredTensor:
    info: TensorInfo
    array: np.ndarray  # this partition's rows, in shared memory (or mapped read-only from disk)
    disk: DiskRows | None = None  # served from disk through a bounded cache
    init: tuple[str, dict[str, Any]] = ("zeros", {})  # a job tensor's initialiser and args
    grown: GrowthRows | None = None  # a job's node tensor's rows of new nodes (live_rows.py)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (local, checked) in the given order."""
        if self.disk is not None:
            return self.disk.take(rows)
        return np.take(self.array, rows, axis=0)


@dataclass
class Session:
    id: str
    job: str
    last_seen: float
    client: str = ""
    owner: str | None = None  # the public key that joined it (None without CURVE)


@dataclass
class ServerState:
    """Everything a handler may read or change (see :mod:`graphrun.store.registry`)."""

    part: int
    index: int
    book: PartitionBook
    policies: dict[PolicyName, PartitionPolicy]
    shm_dir: Path
    host: dict[str, str]
    heartbeat_timeout: float
    segments: SegmentStore | None = None  # main only: the segments it owns
    tensors: dict[tuple[str, str], StoredTensor] = field(default_factory=dict)
    structure: dict[str, np.ndarray] = field(default_factory=dict)
    structure_segments: dict[str, Segment] = field(default_factory=dict)
    # main only: int64[2] in shared memory, [0] +1 after every tensor deletion, so that
    # co-located clients notice an unlinked segment without a stat per pull; [1] +1
    # after every revocation of job keys, so that they ask whether theirs was revoked
    # (graphrun.store.session) without a request per pull
    deletions: np.ndarray | None = None
    deletions_segment: Segment | None = None
    sessions: dict[str, Session] = field(default_factory=dict)
    backups: list[str] = field(default_factory=list)
    backup_owners: dict[str, tuple[int, int]] = field(default_factory=dict)  # pid, start ms
    resolver: Callable[[str, str], TensorInfo | None] | None = None
    replica: int = 0  # 0: the primary; r > 0: replica r of the partition (store/replicas.py)
    replication: Any = None  # a primary's store.replicas.Replication (its replicas' links)
    applied: dict[str, int] = field(default_factory=dict)  # session -> last write id applied
    promoted: bool = False  # a replica that took a client's write: the partition's server now
    fenced: bool = False  # a primary whose replica was promoted: refuses every request
    dropped: str = ""  # a replica its primary dropped from the write set: why (refuses all)
    # a replica's view of its primary's record of drops (its --live-dir's, where the
    # primary's is the same directory: store.replicas.read_record), and what was read
    drop_record: Path | None = None
    drop_record_seen: tuple[int, int, int] | None = None  # (inode, size, mtime ns)
    extension_data: dict[str, Any] = field(default_factory=dict)
    disk: dict[str, DiskRows] = field(default_factory=dict)  # features served from disk
    config: dict[str, Any] = field(default_factory=dict)
    base_root: Path | None = None  # where the compacted directory it loaded is (None: none)
    stop_requested: bool = False
    served: dict[str, int] = field(default_factory=dict)
    reply_bytes: dict[str, int] = field(default_factory=dict)  # tensor bytes sent, by op

    @property
    def is_main(self) -> bool:
        return self.index == 0

    # ---- tensors --------------------------------------------------------------------

    def find(self, job: str, name: str) -> StoredTensor:
        """The tensor ``name`` visible to ``job`` (its own namespace, then the graph's)."""
        for ns in (job, GRAPH_JOB):
            t = self.tensors.get((ns, name))
            if t is not None:
                return t
        if self.resolver is not None:  # a backup: the main may know it
            info = self.resolver(job, name)
            if info is not None:
                return self.attach_tensor(info)
        raise StoreError(f"tensor {name!r} does not exist (job {job!r}, partition {self.part})")

    def visible(self, job: str) -> list[TensorInfo]:
        seen = {}
        for (ns, name), t in self.tensors.items():
            if ns in (GRAPH_JOB, job) and (ns == job or name not in seen):
                seen[name] = t.info
        return [seen[k] for k in sorted(seen)]

    def create_tensor(
        self,
        job: str,
        name: str,
        policy: str,
        dtype: str,
        row_shape: tuple[int, ...],
        persistent: bool,
    ) -> StoredTensor:
        if self.segments is None:
            raise StoreError("only the main server creates tensors")
        if (job, name) in self.tensors:
            raise StoreError(f"tensor {name!r} already exists in job {job!r}")
        pol = lookup_policy(self.policies, policy)
        try:
            dt = wire_dtype(dtype)  # before anything is created
        except ValueError as exc:
            raise ArgumentError(f"init: field 'dtype': {exc}") from None
        rows = pol.part_rows(self.part)
        segment, arr = self.segments.create(dt, (rows, *row_shape))
        info = TensorInfo(
            name, job, policy, dt.name, row_shape, pol.num_rows, rows, segment, persistent
        )
        stored = StoredTensor(info, arr)
        self.tensors[(job, name)] = stored
        return stored

    def attach_tensor(self, info: TensorInfo) -> StoredTensor:
        """Map a segment the main created, or a disk tensor's file and the main's cache of
        it (backups; :func:`graphrun.store.disk.open_shared`)."""
        if info.disk:
            rows = self.disk.get(info.name)
            if rows is None:
                rows = self.disk[info.name] = open_info(info, self.shm_dir)
            stored = StoredTensor(info, rows.mapping, rows)
            self.tensors[(info.job, info.name)] = stored
            return stored
        arr = attach(
            self.shm_dir, info.segment, info.dtype, (info.part_rows, *info.row_shape), True
        )
        stored = StoredTensor(info, arr)
        self.tensors[(info.job, info.name)] = stored
        return stored

    def register_backup(self, address: str, pid: int = 0, start_ms: int = 0) -> None:
        if address not in self.backups:
            self.backups.append(address)
        if pid > 0:
            self.backup_owners[address] = (pid, start_ms)

    def unregister_backup(self, address: str) -> None:
        if address in self.backups:
            self.backups.remove(address)
        self.backup_owners.pop(address, None)

    def drop_dead_backups(self) -> list[str]:
        """Unregister the backups whose process is gone (same machine: pid and start time),
        so new clients are no longer sent to them; returns their addresses."""
        from graphrun.store.shm import process_alive

        dead = [
            a for a, (pid, start) in self.backup_owners.items() if not process_alive(pid, start)
        ]
        for address in dead:
            self.unregister_backup(address)
        return dead

    def delete_tensor(self, job: str, name: str) -> bool:
        stored = self.tensors.pop((job, name), None)
        if stored is None:
            return False
        if self.segments is not None:
            self.segments.unlink(stored.info.segment)
        if self.deletions is not None:
            self.deletions[0] += 1  # after the unlink: see graphrun.store.catalog
        return True

    # ---- sessions -------------------------------------------------------------------

    def join(
        self, session: str, job: str, client: str, now: float, owner: str | None = None
    ) -> None:
        self.sessions[session] = Session(session, job, now, client, owner)

    def check_owner(self, session: str, user: str | None) -> None:
        """AuthError unless ``session`` is unknown or was joined with the key ``user``: a
        session id is bound to the key that made it (another key cannot take it over)."""
        s = self.sessions.get(session)
        if s is not None and s.owner != user:
            raise AuthError(f"session {session!r} belongs to another key")

    def drop_sessions_of(self, owners: set[str], why: str) -> list[Session]:
        """End the sessions joined with any of the keys ``owners``; free their jobs."""
        gone = [s for s in self.sessions.values() if s.owner in owners]
        for s in gone:
            log.warning("partition %d: dropping session %s of job %r (%s)",
                        self.part, s.id, s.job, why)  # fmt: skip
            del self.sessions[s.id]
        for job in {s.job for s in gone}:
            self._maybe_free_job(job)
        return gone

    def touch(self, session: str, now: float) -> Session:
        s = self.sessions.get(session)
        if s is None:
            raise StoreError(
                f"session {session!r} is unknown on partition {self.part} "
                "(never joined, left, or dropped after missing heartbeats)"
            )
        s.last_seen = now
        return s

    def leave(self, session: str) -> None:
        s = self.sessions.pop(session, None)
        self.applied.pop(session, None)
        if s is not None:
            self._maybe_free_job(s.job)

    def expire(self, now: float) -> list[Session]:
        """Drop sessions silent for longer than the heartbeat timeout; free their jobs."""
        dead = [s for s in self.sessions.values() if now - s.last_seen > self.heartbeat_timeout]
        for s in dead:
            log.warning(
                "partition %d: dropping session %s of job %r (no heartbeat for %.1f s)",
                self.part,
                s.id,
                s.job,
                now - s.last_seen,
            )
            del self.sessions[s.id]
            self.applied.pop(s.id, None)
        for job in {s.job for s in dead}:
            self._maybe_free_job(job)
        return dead

    def _maybe_free_job(self, job: str) -> None:
        if any(s.job == job for s in self.sessions.values()):
            return
        gone = [k for k, t in self.tensors.items() if k[0] == job and not t.info.persistent]
        for _, name in gone:
            self.delete_tensor(job, name)
        if gone:
            log.info(
                "partition %d: job %r has no clients; freed %d tensors", self.part, job, len(gone)
            )

    def close(self) -> None:
        self.tensors.clear()
        self.structure.clear()
        self.disk.clear()
        if self.segments is not None:
            self.segments.close()
