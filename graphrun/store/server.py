"""A KV store server process: load (or attach to) a partition and serve requests.

The **main** server of partition K (``ServerConfig.main_address`` is None) removes
stale segments of dead stores, memory-maps ``part-K`` of the partition directory and
copies its structure (``nodes``, ``indptr``, ``indices``, ``eids``, ``etypes``) and
every node/edge feature into shared memory, then serves. Graph features are the
tensors ``node/<ntype>/<name>`` (policy ``node:<ntype>``) and
``edge/<src:rel:dst>/<name>`` (policy ``edge:<src:rel:dst>``). With ``features="disk"``
the node features are not copied: :func:`open_node_features` maps their files read-only
and keeps the rows of the nodes with the most in-edges in a cache of
``disk_cache_bytes`` (:mod:`graphrun.store.disk`); a backup maps the same files and the
main's cache.

A **backup** (``main_address`` set) asks the main for its manifest, maps the same
segments (same machine only), registers its own address with the main — clients
learn it when they join — and serves the same requests. Tensors created later are
mapped on first use (it asks the main).

:func:`run_server` runs until a ``stop`` request or ``should_stop()`` (the CLI wires
SIGTERM/SIGINT to it), then closes cleanly: segments the main created are unlinked.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphrun.errors import ArgumentError, StoreError
from graphrun.names import RoleName, TensorKey
from graphrun.partition.book import PartitionBook
from graphrun.partition.compacted import current_dir
from graphrun.partition.format import Partition, load_id_mapping, load_partition
from graphrun.rpc.access import Access, ClientKeys
from graphrun.rpc.auth import KeyPair
from graphrun.rpc.codec import DEFAULT_LIMITS, Limits, Message, MsgKind
from graphrun.rpc.transport import RpcClient, RpcServer, Waker
from graphrun.store import compact, handlers, live_ops, replicas, sum_moves
from graphrun.store.disk import DiskRows, file_id
from graphrun.store.live_log import base_name, check_live_dir
from graphrun.store.policy import policies_from_book
from graphrun.store.registry import Registry, Request, Response, load_extensions
from graphrun.store.shm import (
    DEFAULT_SHM_DIR,
    SegmentStore,
    check_space,
    clean_stale,
    host_identity,
    start_ms,
)
from graphrun.store.state import (
    GRAPH_JOB,
    PartitionInfo,
    Segment,
    ServerState,
    StoredTensor,
    TensorInfo,
    received,
)
from graphrun.store.writes import (
    Parked,
    Sent,
    Turn,
    answered_later,
    forward,
    raise_fence,
    settle,
    with_write_set,
    write,
)

log = logging.getLogger("graphrun.store")


@dataclass(frozen=True)
class ServerConfig:
    """Everything a store server needs; built at the edge (CLI, launcher, tests)."""

    partition_dir: Path
    part: int
    address: str = "tcp://127.0.0.1:0"
    keys: KeyPair | None = None
    main_address: str | None = None  # set for a backup server
    replica_of: str | None = None  # set for a replica: its primary's address (replicas.py)
    replica_index: int = 1  # which replica of the partition (with replica_of)
    backup_index: int = 0
    advertise_host: str | None = None
    shm_dir: Path = DEFAULT_SHM_DIR
    heartbeat_timeout: float = 30.0
    request_timeout: float = 30.0
    extensions: Sequence[str] = field(default_factory=tuple)
    clients_dir: Path | None = None  # job keys admitted besides the admin key (rpc/access.py)
    profile_file: Path | None = None  # at stop, append a ServeRecord line (placement profile)
    limits: Limits = DEFAULT_LIMITS  # what one request may be (graphrun.rpc.codec)
    features: str = "memory"  # node features in shared memory, or "disk" (store/disk.py)
    disk_cache_bytes: int = 0  # with features "disk": this server's cache of hot rows
    live_dir: Path | None = None  # the live graph's write-ahead log (store/live_log.py)
    sequencer: tuple[str, ...] = ()  # where the sequencer serves now, then its replicas


#: where a server keeps node features (``ServerConfig.features``)
FEATURE_STORAGE = ("memory", "disk")
MAX_DISK_CACHE_BYTES = 1 << 50


def _check_config(cfg: ServerConfig) -> None:
    if cfg.clients_dir is not None:
        if cfg.keys is None:
            raise ArgumentError("clients_dir: job keys need a CURVE store (an admin key)")
        if not Path(cfg.clients_dir).is_dir():
            raise ArgumentError(f"clients_dir: {cfg.clients_dir} is not a directory")
    if not Path(cfg.shm_dir).is_dir():
        raise ArgumentError(f"shm_dir: {cfg.shm_dir} is not a directory")
    if cfg.replica_of and cfg.main_address:
        raise ArgumentError("replica_of: a replica is a main server, not a backup")
    if cfg.live_dir is not None:
        if cfg.main_address:
            raise ArgumentError("live_dir: a backup holds no live state (its main logs)")
        check_live_dir(Path(cfg.live_dir))
    if cfg.replica_of and cfg.replica_index < 1:
        raise ArgumentError("replica_index: a replica needs an index >= 1")
    if cfg.features not in FEATURE_STORAGE:
        raise ArgumentError(f"features: {cfg.features!r} is not one of {list(FEATURE_STORAGE)}")
    cache = cfg.disk_cache_bytes
    if not isinstance(cache, int) or not 0 <= cache <= MAX_DISK_CACHE_BYTES:
        raise ArgumentError(
            f"disk_cache_bytes: expected an integer in [0, {MAX_DISK_CACHE_BYTES}], got {cache!r}"
        )
    for name in ("heartbeat_timeout", "request_timeout"):
        val = getattr(cfg, name)
        if not isinstance(val, int | float) or not val > 0:  # NaN fails too
            raise ArgumentError(f"{name}: expected a number of seconds > 0, got {val!r}")


def hot_rows(p: Partition, ntype: str) -> np.ndarray:
    """The rows of ``ntype``'s features in partition ``p``, most in-edges first."""
    inner = p.num_inner_nodes
    degree = np.diff(p.indptr[: inner + 1])
    if p.book.is_hetero:
        types, per_type = p.local_node_types()
        t = p.book.ntype_id(ntype)
        mine = np.flatnonzero(types[:inner] == t)
        rows = per_type[mine] - p.book.node_ranges(ntype)[p.part]
        degree = degree[mine]
    else:
        rows = np.arange(inner, dtype=np.int64)
    return rows[np.argsort(-degree, kind="stable")]


def open_node_features(p: Partition, cache_bytes: int) -> dict[tuple[str, str], DiskRows]:
    """Every node feature of ``p`` served from its file, ``cache_bytes`` split over them by
    size (``load_partition`` checked each file's header and length already)."""
    feats = [(t, n, a) for t, named in p.node_feats.items() for n, a in named.items()]
    total = sum(int(a.nbytes) for _, _, a in feats)
    out = {}
    hot: dict[str, np.ndarray] = {}
    for t, n, arr in feats:
        if t not in hot:
            hot[t] = hot_rows(p, t)
        share = cache_bytes * int(arr.nbytes) // total if total else 0
        d = current_dir(p.base_root or p.path, p.part, p.config["parts"][p.part]["dir"])
        path = d / "node" / t / f"{n}.npy"
        out[(t, n)] = DiskRows.build(path, arr, hot[t], share)
    return out


def own_base(cfg: ServerConfig) -> Path | None:
    """A replica's own compacted directories (with a log): made if missing."""
    if not cfg.replica_of or cfg.live_dir is None:
        return None
    own = Path(cfg.live_dir) / base_name(cfg.part, cfg.replica_index)
    own.mkdir(mode=0o700, exist_ok=True)
    return own


def load_main_state(cfg: ServerConfig) -> ServerState:
    """Load partition ``cfg.part`` into fresh shared-memory segments."""
    clean_stale(cfg.shm_dir)
    p = load_partition(cfg.partition_dir, cfg.part, own_base(cfg))
    disk = open_node_features(p, cfg.disk_cache_bytes) if cfg.features == "disk" else {}
    whole = [p.nodes, p.indptr, p.indices, p.eids, p.etypes]
    whole += [
        a for t, named in p.node_feats.items() for n, a in named.items() if (t, n) not in disk
    ]
    whole += [a for named in p.edge_feats.values() for a in named.values()]
    whole += [a for rows in disk.values() for a in (rows.cache, rows.slot)]  # shared: disk.py
    check_space(cfg.shm_dir, sum(int(a.nbytes) for a in whole if a is not None))
    segments = SegmentStore(cfg.shm_dir)
    state = ServerState(
        part=cfg.part,
        index=0,
        book=p.book,
        policies=policies_from_book(p.book),
        shm_dir=cfg.shm_dir,
        host=host_identity(cfg.shm_dir),
        heartbeat_timeout=cfg.heartbeat_timeout,
        segments=segments,
        config=p.config,
        base_root=p.base_root,
        disk={str(TensorKey.node(t, n)): rows for (t, n), rows in disk.items()},
    )
    try:
        # [2], [3]: live_ops.LIVE_COUNTER, LIVE_ROWS_COUNTER
        seg, state.deletions = segments.create("int64", (4,))
        state.deletions[:] = 0
        state.deletions_segment = Segment(seg, "int64", (4,))
        arrays = {"nodes": p.nodes, "indptr": p.indptr, "indices": p.indices, "eids": p.eids}
        if p.etypes is not None:
            arrays["etypes"] = p.etypes
        for name, arr in arrays.items():
            seg, shared = segments.copy_in(arr)
            state.structure[name] = shared
            state.structure_segments[name] = Segment(seg, str(arr.dtype), tuple(arr.shape))
        feats = [TensorKey.node(t, n) for t, named in p.node_feats.items() for n in named]
        feats += [TensorKey.edge(k, n) for k, named in p.edge_feats.items() for n in named]
        for key in feats:
            arr = (p.node_feats if key.kind == "node" else p.edge_feats)[key.type][key.name]
            rows = state.disk.get(str(key))
            seg, shared = ("", arr) if rows is not None else segments.copy_in(arr)
            cached = rows.share(segments) if rows is not None else ("", "")
            pol = state.policies[key.policy]
            info = TensorInfo(
                str(key),
                GRAPH_JOB,
                str(key.policy),
                str(arr.dtype),
                tuple(arr.shape[1:]),
                pol.num_rows,
                pol.part_rows(cfg.part),
                seg,
                disk=rows is not None,
                file=str(rows.path.resolve()) if rows is not None else "",
                file_id=file_id(rows.path) if rows is not None else (0, 0, 0),
                cache=cached,
                cache_rows=len(rows.cache) if rows is not None else 0,
            )
            state.tensors[(GRAPH_JOB, info.name)] = StoredTensor(info, shared, rows)
    except BaseException:
        state.close()
        raise
    return state


def attach_backup_state(cfg: ServerConfig, main: RpcClient) -> ServerState:
    """Map the main server's segments (a backup on the same machine)."""
    info = received(PartitionInfo, main.call("info", {"job": GRAPH_JOB}).body)
    if info.host != host_identity(cfg.shm_dir):
        raise StoreError(f"backup of {cfg.main_address}: the main server runs on another machine")
    book = PartitionBook.from_config(info.book, source=f"main server {cfg.main_address}")
    state = ServerState(
        part=info.part,
        index=cfg.backup_index,
        book=book,
        policies=policies_from_book(book),
        shm_dir=cfg.shm_dir,
        host=host_identity(cfg.shm_dir),
        heartbeat_timeout=cfg.heartbeat_timeout,
    )
    man = main.call("manifest").body
    for t in man["tensors"]:  # disk tensors: the main's shared cache and the files
        state.attach_tensor(received(TensorInfo, t))
    for name, wire in man["structure"].items():
        seg = received(Segment, wire)
        state.structure[name] = seg.attach(cfg.shm_dir)
        state.structure_segments[name] = seg

    def resolve(job: str, name: str) -> TensorInfo | None:
        try:
            return received(TensorInfo, main.call("meta", {"job": job, "name": name}).body["info"])
        except StoreError:
            return None

    state.resolver = resolve
    return state


def build_registry(extensions: Iterable[str] = ()) -> Registry:
    """The core store operations plus the given extensions."""
    registry = Registry()
    handlers.register(registry)
    replicas.register_ops(registry)
    live_ops.register(registry)
    compact.register(registry)
    sum_moves.register(registry)
    load_extensions(registry, extensions)
    return registry


def make_handler(
    state: ServerState,
    registry: Registry,
    access: Access | None = None,
    user: Callable[[], str | None] = lambda: None,
    turn: Turn | None = None,
) -> Callable[[bytes, Message], Message | None]:
    """The RPC handler: registry dispatch with session and access checks (``user()``: the
    public key of the request's sender, see :mod:`graphrun.rpc.access`). A write that
    waits for the log is parked in ``turn`` (answered at the turn's end, after the sync
    and its replicas' answers: None here; :mod:`graphrun.store.writes`), or without one
    synced and answered at once."""
    access = access or Access(None)

    def handle(peer: bytes, msg: Message) -> Message | None:
        entry = registry.get(msg.op)
        session = msg.body.get("s", "")
        job = msg.body.get("job", "")
        if not isinstance(session, str) or not isinstance(job, str):
            raise ArgumentError(f"{msg.op}: fields 's' and 'job' must be strings")
        key = user()
        job, admin = access.check(key, msg.op, job)  # the key first: not admitted, revoked
        state.check_owner(session, key)  # a session id is its creator key's only
        if entry.needs_session:
            job, admin = access.check(key, msg.op, state.touch(session, time.monotonic()).job)
        elif session in state.sessions:
            state.touch(session, time.monotonic())
        req = Request(
            msg.op, msg.body, msg.tensors, job=job, session=session, admin=admin, user=key
        )
        if msg.op not in ("stats", "stop", "leave", "heartbeat"):
            replicas.check_serving(state, msg.op)
        synced = False  # its record synced already (a forwarded write's, outside a turn)
        sent: Sent = []  # its forwards the turn's end collects
        unsynced = False  # parked only for its replicas' answers (no record to sync)
        if msg.op in replicas.WRITE_OPS and turn is not None:
            resp, sent = forward(state, req, entry.handler)
            if sent and resp.after_sync is None and msg.op in replicas.ANSWERED_LATER:
                resp, unsynced = answered_later(resp), True
            elif resp.after_sync is None or not sent:  # nothing for the turn's end to wait for
                raise_fence(settle(state, sent))
                resp, sent = with_write_set(state, resp), []
        elif msg.op in replicas.WRITE_OPS:
            resp, synced = write(state, req, entry.handler)
        else:
            resp = entry.handler(state, req)
        state.served[msg.op] = state.served.get(msg.op, 0) + 1
        if resp.after_sync is not None:
            if turn is not None:
                body = dict(resp.body)
                turn.parked.append(Parked(peer, msg, resp.after_sync, body, sent, not unsynced))
                return None
            if not synced:
                live_ops.sync(state)
            done = resp.after_sync.done()
            resp = Response({**done.body, **resp.body}, done.tensors)
        nbytes = sum(t.nbytes for t in resp.tensors)
        state.reply_bytes[msg.op] = state.reply_bytes.get(msg.op, 0) + nbytes
        return Message(MsgKind.REPLY, msg.op, msg.request_id, resp.body, resp.tensors)

    return handle


def _abort(state: ServerState, version: int) -> None:
    """The sequencer's abort of a version left undecided: a write like the writer's
    ``live_decide``, so partition 0's replica holds it before anyone hears of it."""
    req = Request("live_decide", {"version": version, "commit": False}, admin=True)
    after = write(state, req, live_ops.live_decide)[0].after_sync
    if after is not None:  # taken once on the disk (outside a turn: synced here)
        try:
            live_ops.sync(state)
        except StoreError:
            after.failed()
            raise
        after.done()


def _tick(state: ServerState, access: Access, then: Callable[[], None] | None) -> None:
    state.expire(time.monotonic())
    live_ops.tick(state, time.monotonic(), lambda v: _abort(state, v))
    compact.tick(state, time.monotonic())
    revoked = access.take_revoked()
    if revoked:
        state.drop_sessions_of(revoked, "its job key was revoked")
        if state.deletions is not None:  # co-located clients ask whether it was theirs
            state.deletions[1] += 1
    for address in state.drop_dead_backups():
        log.warning("backup %s of partition %d died; unregistered", address, state.part)
    if then is not None:
        then()


def _advertised(bound: str, host: str | None) -> str:
    if not bound.startswith("tcp://"):
        return bound
    hostport = bound[len("tcp://") :]
    h, _, port = hostport.rpartition(":")
    if host is None:
        host = socket.gethostbyname(socket.gethostname()) if h in ("0.0.0.0", "*") else h
    return f"tcp://{host}:{port}"


def run_server(
    cfg: ServerConfig,
    should_stop: Callable[[], bool] = lambda: False,
    on_ready: Callable[[str], None] | None = None,
    registry: Registry | None = None,
    on_tick: Callable[[], None] | None = None,
    waker: Waker | None = None,
) -> None:
    """Load or attach, serve until stopped, clean up. ``on_ready(address)`` once serving;
    ``on_tick()`` about every 200 ms while serving; ``waker.wake()`` (after ``should_stop``
    turned true) stops it without waiting for the tick."""
    _check_config(cfg)
    if cfg.replica_of and cfg.live_dir is not None:  # before anything is loaded
        record = replicas.dropped_path(cfg.live_dir, cfg.part)
        replicas.check_not_recorded(record, cfg.part, cfg.replica_index)
    registry = registry or build_registry(cfg.extensions)
    main: RpcClient | None = None
    if cfg.main_address:
        if cfg.backup_index < 1:
            raise ArgumentError("backup_index: a backup server needs an index >= 1")
        main = RpcClient(cfg.main_address, keys=cfg.keys, timeout=cfg.request_timeout)
        state = attach_backup_state(cfg, main)
    else:
        state = load_main_state(cfg)
    primary: RpcClient | None = None
    if cfg.replica_of:
        state.replica = cfg.replica_index
        if cfg.live_dir is not None:  # its primary's record, where they share the directory
            state.drop_record = replicas.dropped_path(cfg.live_dir, cfg.part)
        primary = RpcClient(cfg.replica_of, keys=cfg.keys, timeout=cfg.request_timeout)
    elif main is None:
        state.replication = replicas.Replication.of(
            cfg.keys, cfg.request_timeout, cfg.part, cfg.live_dir
        )
    server: RpcServer | None = None
    address = ""
    try:
        if main is None:  # replayed from its log before anything is served
            orig = lambda: load_id_mapping(cfg.partition_dir).orig_nids  # noqa: E731
            root = cfg.partition_dir
            live = live_ops.attach(
                state,
                orig,
                cfg.keys,
                cfg.request_timeout,
                cfg.live_dir,
                restore=lambda delta: compact.restore(state, delta),
            )
            if live.seq is not None:  # a new log on a compacted directory
                compact.seed_sequencer(state, live.seq, root)
            elif cfg.sequencer:  # not where the log last heard of it (a restarted job)
                live.seq_link.point(cfg.sequencer[0], list(cfg.sequencer[1:]))
            # with a log, a compaction writes the server's compacted directory (a
            # primary's into the partition directory, a replica's beside its log) and
            # truncates the log; without one it folds in memory
            own = own_base(cfg) if cfg.replica_of else root
            compact.attach(state, own if cfg.live_dir is not None else None)
        name = str(RoleName.store(state.part, state.index, replica=state.replica))
        clients = ClientKeys(cfg.clients_dir) if cfg.clients_dir is not None else None
        access = Access(cfg.keys.public if cfg.keys else None, clients)
        box: list[RpcServer] = []
        turn = Turn(state)
        handler = make_handler(state, registry, access, lambda: box[0].current_user, turn)
        admit = clients.__contains__ if clients is not None else None
        server = RpcServer(
            cfg.address, handler, keys=cfg.keys, limits=cfg.limits, name=name, admit=admit,
            waker=waker,
        )  # fmt: skip
        box.append(server)
        address = _advertised(server.address, cfg.advertise_host)
        if main is not None:
            me = {"address": address, "pid": os.getpid(), "start": start_ms()}
            main.call("register_backup", me)
        if primary is not None:
            replicas.register_with_primary(primary, address, cfg.request_timeout, cfg.replica_index)
        log.info("%s serving %s on %s", name, cfg.partition_dir, address)
        if on_ready is not None:
            on_ready(address)
        cpu_ready = time.process_time()
        server.serve_forever(
            lambda: state.stop_requested or should_stop(),
            on_tick=lambda: _tick(state, access, on_tick),
            after_turn=lambda: turn.end(server.reply),
            wake_on=turn.wake_on,
        )
        turn.finish(server.reply)  # the writes still waiting for their replicas
        cpu_s = time.process_time() - cpu_ready  # serving, not loading
        served = {"requests": state.served, "reply_bytes": state.reply_bytes,
                  "cpu_s": round(cpu_s, 3)}  # fmt: skip
        log.info("%s stopping; served %s", name, json.dumps(served, sort_keys=True))
        if cfg.profile_file is not None:  # imported here: pydantic stays off start-up
            from graphrun.placement.profile import ServeRecord

            sent = sum(state.reply_bytes.values())
            rec = ServeRecord(part=cfg.part, cpu_s=cpu_s, reply_bytes=sent)
            with open(cfg.profile_file, "a") as f:
                f.write(rec.to_json() + "\n")
    finally:
        if primary is not None:
            try:
                if address:
                    body = {"address": address, "remove": True}
                    primary.call("register_replica", body, timeout=2)
            except Exception as exc:  # the primary may be gone already
                log.info("could not unregister from the primary: %s", exc)
            primary.close()
        if state.replication is not None:
            state.replication.close()
        compact.close(state)
        live_ops.close(state)
        if main is not None:
            try:
                if address:
                    main.call("register_backup", {"address": address, "remove": True}, timeout=2)
            except Exception as exc:  # the main may be gone already
                log.info("could not unregister from the main server: %s", exc)
            main.close()
        if server is not None:
            server.close()
        state.close()
