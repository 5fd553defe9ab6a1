"""The live graph's store operations: the sequencer and each partition's pieces.

=============  ===========================================================================
op             body -> reply
=============  ===========================================================================
live_begin     nodes, edges [count per part], decided ([[version, commit]]: earlier versions'
               ``live_decide``, carried), piece (partition 0's, unnumbered: live_wire's
               ``numbered_piece``); tensors (the new nodes' orig ids, in part order; the
               piece's) -> version, nodes, edges ([[start, count]] runs per part), piece
               (as live_prepare's answer, or refused, error); with ``decided`` also
               decided ([[version, committed]]), head              (sequencer; write_graph)
live_prepare   piece (a :class:`PieceWire`), seq (the sequencer's address), seq_replicas
               (its replicas'), decided ([[version, commit]] of earlier pieces: their
               ``live_commit``, carried); the piece's arrays as tensors -> {"held": true}
               or {"retry_after": s}                                        (write_graph)
live_decide    version, commit -> head, committed; partition 0's own piece is applied
               as decided                                          (sequencer; write_graph)
live_commit    version, commit -> {"applied": bool} (the other partitions)          (write_graph)
live_fate      version -> fate: committed | aborted | pending                    (sequencer)
live_head      -> head, num_nodes, num_edges; tensors (node block owners, edge block
               owners)                                                           (sequencer)
live_lookup    tensors (orig ids,) -> (graph ids,), -1 where unknown at the head (sequencer)
live_nodes     v[, since] -> tensors (the new nodes this partition owns at v, their ntype
               index; with since, those added after it: all when since < the floor)
=============  ===========================================================================

The **sequencer** is partition 0's main server (a primary): it hands out versions and
growth ids (:class:`~graphrun.store.live_seq.Blocks`), keeps the new nodes' original ids,
records each version's decision and the **head** — the highest version such that every
version up to it is decided. A version left undecided for
:data:`~graphrun.store.live.LIVE_DECIDE_TIMEOUT_S` is aborted (its writer died).

Every main server keeps its :class:`~graphrun.store.live.LiveDelta`. ``live_prepare``
checks a piece wholly (:func:`~graphrun.store.live_check.check_piece`) and holds it
pending; past 3/4 of the delta's bound it answers ``retry_after`` instead (the writer
waits: slowed, never dropped); ``live_begin`` holds partition 0's piece so (one request
a batch there; a refused piece is answered, its version aborted by the writer). A read
at version ``V`` (:func:`view`) first settles the pending pieces ``<= V`` by asking the
sequencer their fate (the writer's ``live_commit`` may not have arrived yet: ``V <=
head`` means they are decided). A pipelined writer carries its decisions in its next
requests (``decided``): a partition's in the next ``live_prepare`` there (no
``live_commit`` each), the sequencer's in the next ``live_begin`` (no ``live_decide``
each; synced with its version; a refused begin takes none); ``flush`` sends the rest.
The lowest version held is published in the shared ``deletions`` segment (``[2]``), so
co-located clients read shared memory only while nothing is held at their version.

With ``--live-dir`` every piece, and the sequencer's versions and decisions, are synced
to the server's write-ahead log before they are answered, and replayed at start
(:mod:`graphrun.store.live_log`; the sequencer's state is :mod:`graphrun.store.live_seq`).

With replicas, partition 0's replica keeps a copy of the sequencer: ``live_begin`` and
``live_decide`` are forwarded to it before they are answered, like every write
(:mod:`graphrun.store.replicas`), and so are the primary's aborts (:func:`tick`'s
``abort``). A writer fails over to it as to any replica; a partition asks it the fate
of a piece when the primary is lost (:class:`~graphrun.store.live_seq.SeqLink`), which
promotes it. Only the partition's serving sequencer (a primary, or a promoted replica)
aborts versions left undecided.

Who may call what is :mod:`graphrun.rpc.access`'s rule (``WRITE_GRAPH_OPS``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from graphrun.errors import ArgumentError, StoreError
from graphrun.names import TensorKey
from graphrun.store import live_stale
from graphrun.store.live import (
    LIVE_DECIDE_TIMEOUT_S,
    LIVE_RETRY_AFTER_S,
    MAX_PIECE_ROWS,
    MAX_UNDECIDED,
    LiveDelta,
    Piece,
    growth_ids,
)
from graphrun.store.live_check import Schema, check_piece, schema_of
from graphrun.store.live_log import (
    BegunRecord,
    DecidedRecord,
    LiveLog,
    PieceRecord,
    open_log,
    replay,
)
from graphrun.store.live_log import apply as log_apply
from graphrun.store.live_log import decide as log_decide
from graphrun.store.live_seq import (
    Begun,
    Blocks,
    SeqLink,
    Sequencer,
    base_lookup,
    check_addresses,
    check_begin,
    check_decided,
    check_new_orig,
)
from graphrun.store.live_wire import (
    BeginBody,
    DecideBody,
    FateBody,
    PrepareBody,
    numbered_piece,
    piece_from_wire,
)
from graphrun.store.registry import AfterSync, Registry, Request, Response
from graphrun.store.state import ServerState, StoredTensor

if TYPE_CHECKING:
    from pathlib import Path

    from graphrun.rpc.auth import KeyPair

log = logging.getLogger("graphrun.store")

KEY = "graphrun.live"
LIVE_COUNTER = 2  # the deletions segment's slot: the lowest version held (0: none)
LIVE_ROWS_COUNTER = 3  # its slot of the lowest version that overwrites base rows (0: none)
SETTLE_EVERY_S = 5.0  # a partition's tick asks about stale pieces at most this often
MAX_DECIDED = MAX_UNDECIDED  # earlier pieces' decisions one live_prepare carries


# ---- the state


@dataclass
class LivePart:
    """One main server's live state (``state.extension_data[KEY]``)."""

    delta: LiveDelta
    schema: Schema
    base_orig: Callable[[], np.ndarray]  # the base nodes' original ids (mapping/ files)
    seq_link: SeqLink
    seq: Sequencer | None = None
    next_settle: float = 0.0  # the tick's next look at stale pending pieces
    next_abort: float = 0.0  # the sequencer's next abort of stale versions (a full log)
    log: LiveLog | None = None  # the write-ahead log (``--live-dir``; store/live_log.py)
    # session -> the version it last read at (its reads' and heartbeats' "v"): compaction
    # folds no version above the lowest (store/compact.py)
    pins: dict[str, int] = field(default_factory=dict)

    def close(self) -> None:
        self.delta.close()
        self.seq_link.close()
        if self.log is not None:
            self.log.close()


def attach(
    state: ServerState,
    base_orig: Callable[[], np.ndarray],
    keys: KeyPair | None,
    timeout: float,
    live_dir: Path | None = None,
    restore: Callable[[LiveDelta], None] | None = None,
) -> LivePart:
    """Give a main server its live state (partition 0's primary and its replicas: the
    sequencer too); ``base_orig()`` reads the base nodes' original ids when first
    needed. With ``live_dir`` the state is replayed from the server's log there, which
    then takes every write (:mod:`graphrun.store.live_log`); ``restore`` first installs
    what a compaction folded (:func:`graphrun.store.compact.restore`)."""
    delta = LiveDelta(background=True, deferred=state.replica != 0 and not state.promoted)
    live = LivePart(delta, schema_of(state), base_orig, SeqLink(keys, timeout))
    if restore is not None:
        restore(live.delta)
    if state.part == 0 and state.is_main:
        n = state.book.num_parts
        live.seq = Sequencer(Blocks(state.book.num_nodes, n), Blocks(state.book.num_edges, n))
    if live_dir is not None:
        live.delta.warm()  # the compiled merge loads while the log opens and replays
        live.log = open_log(live_dir, state.part, state.replica)
        try:
            live.seq_link.point(*replay(live.log, live.delta, live.schema, live.seq))
            live.delta.warm(wait=True)  # loaded while the log replayed; serving after
        except BaseException:
            live.close()
            raise
    state.extension_data[KEY] = live
    publish(state, live)
    return live


def close(state: ServerState) -> None:
    live = state.extension_data.pop(KEY, None)
    if isinstance(live, LivePart):
        live.close()


def live_of(state: ServerState, op: str = "live") -> LivePart:
    live = state.extension_data.get(KEY)
    if not isinstance(live, LivePart):
        raise StoreError(f"{op}: this server holds no live graph (a backup, or not a main)")
    return live


def sequencer_of(state: ServerState, op: str) -> Sequencer:
    seq = live_of(state, op).seq
    if seq is None:
        raise StoreError(f"{op}: the sequencer is partition 0's primary, not partition "
                         f"{state.part}")  # fmt: skip
    return seq


def sync(state: ServerState) -> None:
    """Sync the server's write-ahead log: the end of a turn of its loop, after which the
    writes of the turn are answered (a group commit; :class:`graphrun.store.writes.Turn`)."""
    live = state.extension_data.get(KEY)
    if isinstance(live, LivePart) and live.log is not None:
        live.log.sync()


def promote(state: ServerState, why: str) -> None:
    """Promote a replica (it serves its partition now: store/replicas.py); its delta,
    indexed only when read while it took forwarded writes alone, indexes every commit."""
    state.promoted = True
    log.warning("%s", why)
    live = state.extension_data.get(KEY)
    if isinstance(live, LivePart):
        live.delta.index_eagerly()


def stats_fields(state: ServerState) -> dict[str, object]:
    """What ``stats`` reports of the live graph: pieces held, the sequencer's head, and
    (``live``) versions held, the index entries its delta has written (``index_work``:
    fresh runs and merges; benchmarks/live_ingest_cpu.py gives it a batch) and the log's
    records, syncs (groups) and bytes."""
    live = state.extension_data.get(KEY)
    if not isinstance(live, LivePart):
        return {}
    pending, committed = len(live.delta.pending), len(live.delta.committed)
    out: dict[str, object] = {"live_pending": pending, "live_committed": committed}
    if live.seq is not None:
        out |= {"live_head": live.seq.head, "live_undecided": len(live.seq.begun)}
    wal = live.log.wal if live.log is not None else None
    inner = {"pending": pending, "committed": committed, "index_work": live.delta.work}
    if wal is not None:  # and the bytes of its records (benchmarks/live_ingest_cpu.py)
        inner |= {"log_records": wal.count, "log_syncs": wal.syncs, "log_bytes": wal.size}
    return {**out, "live": inner}


def publish(state: ServerState, live: LivePart) -> None:
    """The lowest version held, for co-located readers (``deletions[LIVE_COUNTER]``), and
    the lowest that overwrites base rows (``[LIVE_ROWS_COUNTER]``: below it, a pull of
    base rows reads shared memory even while new edges or nodes are held)."""
    if state.deletions is not None and len(state.deletions) > LIVE_COUNTER:
        # compacted (-stamp): the segments a client mapped may be an old base (live_stale)
        stamp, folded = live_stale.counter(state), live.delta.floor > 0
        state.deletions[LIVE_COUNTER] = stamp if folded else live.delta.lowest()
    if state.deletions is not None and len(state.deletions) > LIVE_ROWS_COUNTER:
        state.deletions[LIVE_ROWS_COUNTER] = live.delta.lowest_update()


# ---- the sequencer's ops


def live_begin(state: ServerState, req: Request) -> Response:
    seq = sequencer_of(state, req.op)
    live = live_of(state)
    body = req.args(BeginBody)
    check_decided(seq, body.decided, req.op)
    w = req.body.get("w")
    again = seq.answers.get((req.session, w)) if isinstance(w, int) else None
    if again is not None:  # sent again after a failover: the same ids (its decisions stand)
        return _answer(state, seq, body, again, _own_piece(state, live, req, body, again))
    orig = req.tensors[0] if req.tensors else np.empty(0, np.int64)
    deciding = [DecidedRecord(v, c) for v, c in body.decided if v in seq.begun]
    deciding_n = len({r.version for r in deciding})
    check_begin(seq, state.book.num_parts, body.nodes, body.edges, orig, deciding_n, req.op)
    check_new_orig(seq, live.base_orig, orig, req.op)
    record = BegunRecord(seq.next_version, body.nodes, body.edges, orig.tobytes())
    if live.log is not None:
        live.log.room(record, *deciding)  # a full log refuses before anything is handed out
    begun = seq.begin(body.nodes, body.edges, orig, time.monotonic())
    if isinstance(w, int) and req.session:
        seq.answers[(req.session, w)] = begun
    if live.log is not None:  # durable before the writer hears of the version
        for r in deciding:
            live.log.write(r, sync=False)
        live.log.write(record, sync=False)
    return _answer(state, seq, body, begun, _own_piece(state, live, req, body, begun))


def _own_piece(
    state: ServerState, live: LivePart, req: Request, body: BeginBody, begun: Begun
) -> _Held | None:
    """Partition 0's piece, carried by ``live_begin``, numbered with the ids ``begun``
    gave and held as ``live_prepare`` holds one (None: the begin carries none). A
    refused piece is answered (``refused``, ``error``: the version stands, its writer
    aborts it), not raised: the ids are handed out."""
    wire = body.piece
    if wire is None:
        return None
    try:
        return _hold(state, live, req, begun[0], lambda: numbered_piece(req, wire, *begun))
    except (ArgumentError, StoreError) as exc:
        return _Held({"refused": str(exc), "error": type(exc).__name__})


def _answer(
    state: ServerState, seq: Sequencer, b: BeginBody, begun: Begun, own: _Held | None
) -> Response:
    """``live_begin``'s answer (``begun``'s version and ids) with its carried decisions
    taken (after the sync) and what became of partition 0's piece (``own``: ``piece``)."""
    version, nodes, edges = begun
    out: dict[str, object] = {"version": version, "nodes": nodes, "edges": edges}
    if own is not None:
        out["piece"] = own.out

    def taken() -> Response:
        outcome = [[v, _take(state, seq, v, commit)] for v, commit in b.decided]
        return Response({**out, "decided": outcome, "head": seq.head} if b.decided else out)

    if live_of(state).log is None:
        return taken()
    return Response(after_sync=AfterSync(taken, own.drop) if own else AfterSync(taken))


def _take(state: ServerState, seq: Sequencer, version: int, commit: bool) -> bool:
    """Whether ``version`` committed: decided (the first decision stands), its piece here too."""
    live = live_of(state)
    committed = seq.decide(version, commit)
    if log_apply(live.log, live.delta, version, committed):
        publish(state, live)
    return committed


def live_decide(state: ServerState, req: Request) -> Response:
    seq = sequencer_of(state, req.op)
    body = req.args(DecideBody)
    if not 0 < body.version < seq.next_version:
        raise ArgumentError(f"{req.op}: version {body.version} was never begun")
    live_log = live_of(state).log

    def decided() -> Response:
        committed = _take(state, seq, body.version, body.commit)
        if body.commit and not committed:
            raise StoreError(f"{req.op}: version {body.version} was aborted (undecided "
                             f"for {LIVE_DECIDE_TIMEOUT_S} s, or by its writer)")  # fmt: skip
        return Response({"head": seq.head, "committed": committed})

    if live_log is None:
        return decided()
    if body.version in seq.begun:  # taken once on the disk: the head moves after the sync
        live_log.write(DecidedRecord(body.version, body.commit), sync=False)
    return Response(after_sync=AfterSync(decided))


def live_fate(state: ServerState, req: Request) -> Response:
    seq = sequencer_of(state, req.op)
    if state.replica and not state.promoted and req.admin:  # a partition lost the primary
        # (the store's own key: a job's key may ask, not promote)
        promote(state, "replica of partition 0 asked a version's fate: promoted (sequencer)")
    return Response({"fate": seq.fate(req.args(FateBody).version)})


def live_head(state: ServerState, req: Request) -> Response:
    seq = sequencer_of(state, req.op)
    book = state.book
    body = {"head": seq.head, "num_nodes": book.num_nodes, "num_edges": book.num_edges}
    return Response(body, (seq.nodes.owner_array(), seq.edges.owner_array()))


def live_lookup(state: ServerState, req: Request) -> Response:
    seq = sequencer_of(state, req.op)
    orig = req.tensor(0, "orig ids")
    if orig.ndim != 1 or orig.dtype != np.int64 or len(orig) > MAX_PIECE_ROWS:
        raise ArgumentError(f"{req.op}: orig ids must be 1-d int64, at most {MAX_PIECE_ROWS}")
    found, ids = base_lookup(seq, live_of(state).base_orig, orig)
    rest = np.flatnonzero(~found & bool(seq.orig))  # new nodes: not base nodes' ids
    ids[rest] = [seq.orig.get(o, -1) for o in orig[rest].tolist()]
    return Response({}, (ids,))


# ---- every partition's ops


def live_nodes(state: ServerState, req: Request) -> Response:
    delta, v = view(state, req)
    since = req.body.get("since", -1)
    if not isinstance(since, int) or isinstance(since, bool) or since < -1:
        raise ArgumentError(f"{req.op}: field 'since' must be a version >= -1")
    if delta is None:
        return Response({}, (np.empty(0, np.int64), np.empty(0, np.int32)))
    ids, types = delta.nodes_upto(v, since if since >= delta.floor else -1)  # folded: at 0
    return Response({}, (ids, types.astype(np.int32)))


def live_prepare(state: ServerState, req: Request) -> Response:
    live = live_of(state, req.op)
    body = req.args(PrepareBody)
    if len(body.decided) > MAX_DECIDED:
        raise ArgumentError(f"{req.op}: field 'decided' carries more than {MAX_DECIDED} "
                            "decisions")  # fmt: skip
    if body.seq:
        check_addresses(body.seq, body.seq_replicas, req.op)
        live.seq_link.point(body.seq, body.seq_replicas)
    for v, commit in body.decided:  # earlier pieces' live_commit: applied whatever its fate
        log_apply(live.log, live.delta, v, commit)
    if body.decided:
        publish(state, live)
    return _respond(live, _hold(state, live, req, body.piece.version,
                                lambda: piece_from_wire(req, body.piece)))  # fmt: skip


@dataclass(frozen=True)
class _Held:
    """:func:`_hold`'s answer (held, retry_after); ``drop`` undoes it if the sync fails."""

    out: dict[str, object]
    drop: Callable[[], None] = lambda: None


def _respond(live: LivePart, h: _Held) -> Response:
    """The answer, once the turn's sync made the piece durable (with a log)."""
    if live.log is None:
        return Response(h.out)
    return Response(after_sync=AfterSync(lambda: Response(h.out), h.drop))


def _hold(
    state: ServerState, live: LivePart, req: Request, version: int, make: Callable[[], Piece]
) -> _Held:
    """Check and hold the piece ``make()`` builds at ``version`` (``live_prepare``'s, or
    partition 0's in ``live_begin``), logged; a piece sent again is held already; past
    3/4 of the delta's bound: ``retry_after``. Raises the piece's refusal."""
    held: dict[str, object] = {"held": True}
    if version in live.delta.pending or version in live.delta.committed:
        # sent again (after a retry_after elsewhere): answered once it is on the disk
        return _Held(held)
    if version <= live.delta.floor:  # decided before the compaction: aborted
        raise StoreError(f"{req.op}: version {version} is at or below the compacted "
                         f"version {live.delta.floor} of partition {state.part}")  # fmt: skip
    if live.delta.slowed():
        return _Held({"retry_after": LIVE_RETRY_AFTER_S})
    piece = make()
    batch = check_piece(piece, live.schema, live.delta, trusted=req.forwarded)
    live.delta.hold(batch, time.monotonic())

    def drop() -> None:
        live.delta.abort(version)
        publish(state, live)

    if live.log is not None:
        try:
            link = live.seq_link
            live.log.write(PieceRecord(piece, link.address, link.replicas), sync=False)
        except StoreError:
            drop()
            raise
    publish(state, live)
    return _Held(held, drop)


def live_commit(state: ServerState, req: Request) -> Response:
    live = live_of(state, req.op)
    body = req.args(DecideBody)
    applied = log_apply(live.log, live.delta, body.version, body.commit)
    publish(state, live)
    return Response({"applied": applied})


def _ask_fate(state: ServerState, live: LivePart, version: int) -> str:
    if live.seq is not None:
        return live.seq.fate(version)
    return live.seq_link.fate(version)


def settle(state: ServerState, live: LivePart, versions: list[int]) -> None:
    """Commit or abort the pending ``versions`` as the sequencer decided them."""
    for v in versions:
        fate = _ask_fate(state, live, v)
        if fate in ("committed", "aborted"):
            log_apply(live.log, live.delta, v, fate == "committed")
        else:
            raise StoreError(f"live: version {v} is not decided yet; read at a lower version")
    publish(state, live)


def view(state: ServerState, req: Request) -> tuple[LiveDelta | None, int]:
    """The delta a read sees and its version (``"v"`` in the body; absent: 0, the base
    graph — a client that does not follow the live graph knows no new id, as on a
    backup), pending pieces at or below it settled first; None when nothing is visible."""
    live = state.extension_data.get(KEY)
    if not isinstance(live, LivePart):
        return None, 0
    v = req.body.get("v", 0)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ArgumentError(f"{req.op}: field 'v' must be a version >= 0")
    if "v" in req.body:
        if v < live.delta.floor:
            raise StoreError(f"{req.op}: version {v} was compacted into partition "
                             f"{state.part}'s base at {live.delta.floor}; follow a newer "
                             "version")  # fmt: skip
        note_pin(state, req.session, v)
    undecided = live.delta.undecided(v)
    if undecided:
        settle(state, live, undecided)
    lowest = min(live.delta.committed, default=0)
    seen = (lowest and lowest <= v) or live.delta.floor > 0
    return (live.delta if seen else None), v


def note_pin(state: ServerState, session: str, v: object) -> None:
    """A session reads at ``v`` (a read's or a heartbeat's): compaction stays at or
    below it."""
    live = state.extension_data.get(KEY)
    if session in state.sessions and isinstance(live, LivePart) and isinstance(v, int) and v >= 0:
        live.pins[session] = v  # joined sessions only: as many as the server keeps


def tick(state: ServerState, now: float, abort: Callable[[int], object] | None = None) -> None:
    """The serving sequencer (not a replica that was not promoted) aborts versions
    undecided for too long, through ``abort(version)`` (the server's: a forwarded
    ``live_decide``); a partition settles pieces pending for too long (their writer's
    ``live_commit`` never came)."""
    live = state.extension_data.get(KEY)
    if not isinstance(live, LivePart):
        return
    seq = live.seq
    serving = not state.fenced and (not state.replica or state.promoted)
    if seq is not None and serving and now >= live.next_abort:
        for v, t in list(seq.begun.items()):
            if now - t <= LIVE_DECIDE_TIMEOUT_S:
                continue
            try:
                if abort is not None:
                    abort(v)
                else:
                    log_decide(live.log, seq, v, False)
            except StoreError as exc:  # the log refused it: still undecided, tried again later
                live.next_abort = now + SETTLE_EVERY_S
                log.warning("live: version %d undecided for %.0f s, not aborted: %s",
                            v, now - t, exc)  # fmt: skip
                break
            log.warning("live: version %d undecided for %.0f s: aborted", v, now - t)
    stale = live.delta.stale(now, LIVE_DECIDE_TIMEOUT_S)
    if stale and now >= live.next_settle:
        live.next_settle = now + SETTLE_EVERY_S
        try:
            settle(state, live, stale)
        except StoreError as exc:  # the sequencer is away or undecided: next tick
            log.info("live: pending pieces %s not settled yet: %s", stale, exc)


def register(registry: Registry) -> None:
    """Add the live graph's ops (the store's own; see the module docstring)."""
    for op, handler in (
        ("live_begin", live_begin),
        ("live_prepare", live_prepare),
        ("live_decide", live_decide),
        ("live_commit", live_commit),
        ("live_fate", live_fate),
        ("live_head", live_head),
        ("live_lookup", live_lookup),
        ("live_nodes", live_nodes),
    ):
        registry.add(op, handler, needs_session=False)


# ---- reads at a version


def pull_at(state: ServerState, req: Request, stored: StoredTensor) -> np.ndarray | None:
    """The rows of a graph tensor's ``pull`` at the request's version when a delta is
    visible there (None: read the base as always). Local rows ``>= part_rows`` are
    growth ids (:func:`~graphrun.store.live.growth_row`); a row updated at or below the
    version reads its latest update."""
    delta, v = view(state, req)
    if delta is None:
        return None
    key = TensorKey.parse(stored.info.name)
    spec = live_of(state).schema.features.get(stored.info.name)
    if key is None or spec is None:
        return None
    rows = req.tensor(0, "rows")
    if rows.ndim != 1 or rows.dtype != np.int64:
        raise ArgumentError(f"{req.op}: rows must be 1-d int64, got {rows.dtype} {rows.shape}")
    n = stored.info.part_rows
    grow = rows >= n
    first = state.book.num_nodes if key.kind == "node" else state.book.num_edges
    if rows.size and int(rows.min()) < 0:
        raise ArgumentError(f"{req.op} {stored.info.name!r}: a local row is negative")
    out = np.empty((len(rows), *stored.info.row_shape), dtype=stored.array.dtype)
    out[~grow] = stored.take(rows[~grow])  # through the disk cache when served from disk
    ids = np.where(grow, growth_ids(rows, first, n), rows + spec.lo)
    found = delta.rows(stored.info.name, ids, v, out)
    missing = grow & ~found
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise ArgumentError(f"{req.op} {stored.info.name!r}: id {int(ids[i])} is not a "
                            f"{key.kind} of this partition at version {v}")  # fmt: skip
    return out
