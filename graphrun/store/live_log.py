"""The live graph's durability (issue 42): each main server's write-ahead log, and its
replay at start.

A server started with ``--live-dir DIR`` logs to ``DIR/part-K.wal`` (a replica:
``DIR/part-K-replica-R.wal``; :mod:`graphrun.store.wal`'s format), locked by
``flock`` on ``<log>.lock`` so two servers never share one. What is logged, and when:

=========  ===========================================================  ===========
record     written                                                      synced
=========  ===========================================================  ===========
piece      ``live_prepare``: the checked piece and the sequencer's       before the
           address, after it is held                                    answer
applied    ``live_commit`` (or a settle): a held piece committed or      no
           aborted at this partition
begun      the sequencer's ``live_begin``: the version, the counts of    before the
           new ids per partition and the new nodes' original ids        answer
decided    the sequencer's ``live_decide`` (and the tick's aborts)       before the
                                                                        answer
=========  ===========================================================  ===========

An ``applied`` record is not synced: after a crash a piece whose ``applied`` record was
lost is pending again and is settled by asking the sequencer its fate (as a piece whose
``live_commit`` never came), and the sequencer's decisions are synced. The sequencer's
ids are replayed by running its allocations again in log order (they are
deterministic), so the ``begun`` record carries counts, not runs.

Replay (:func:`replay`) runs before the server serves: pieces are checked again
(:func:`~graphrun.store.live_check.check_piece`) and held, ``applied`` records commit or
abort them, and the sequencer's versions, ids, original ids, decisions and head are
rebuilt; versions begun and still undecided are aborted by the tick after
:data:`~graphrun.store.live.LIVE_DECIDE_TIMEOUT_S` as before. A torn tail (a record cut
by the crash, never acknowledged) ends the log: :class:`~graphrun.store.wal.WriteAheadLog`
finds the end, and what follows is written over.

A log that cannot be written (an I/O error, not a full log) stops the server's live
writes until it is restarted: the server cannot tell what reached the disk (fail-stop).
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from graphrun.errors import ArgumentError, StoreError
from graphrun.store.live import LiveDelta, Piece
from graphrun.store.live_check import Schema, check_piece
from graphrun.store.live_seq import Blocks, Sequencer
from graphrun.store.wal import RECORD, WAL_MAX_BYTES, WriteAheadLog

log = logging.getLogger("graphrun.store")


class PieceRecord(msgspec.Struct, frozen=True, tag="piece"):
    piece: Piece
    seq: str = ""  # the sequencer's address, to ask the fate of a piece pending at replay
    seq_replicas: list[str] = msgspec.field(default_factory=list)  # then its replicas'


class AppliedRecord(msgspec.Struct, frozen=True, tag="applied"):
    version: int
    commit: bool


class BegunRecord(msgspec.Struct, frozen=True, tag="begun"):
    version: int
    nodes: list[int]
    edges: list[int]
    orig: bytes  # int64 original ids of the new nodes, in partition order


class DecidedRecord(msgspec.Struct, frozen=True, tag="decided"):
    version: int
    commit: bool


class SequencerRecord(msgspec.Struct, frozen=True, tag="sequencer"):
    """The sequencer's whole state, taken when a compaction is swapped in and written by
    the compaction's thread before it truncates the log below the folded version. Replay
    starts the sequencer from the last one and applies the records it does not hold
    (where they are in the file does not matter: the versions say it)."""

    version: int  # the next version: a truncation below the folded version keeps it
    head: int
    blocks: tuple[list[int], list[int]]  # owner per node block, per edge block
    open: tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]]]
    begun: list[int]
    decided: dict[int, bool]
    aborted: list[int]
    orig: bytes  # int64 [2, n]: original id, graph id (committed new nodes)
    orig_pending: dict[int, bytes]


LogRecord = PieceRecord | AppliedRecord | BegunRecord | DecidedRecord | SequencerRecord
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(LogRecord)


@dataclass
class LiveLog:
    """One server's log and the lock that keeps it its own."""

    wal: WriteAheadLog
    lock_fd: int
    failed: str = ""  # why the log stopped taking writes (fail-stop)

    @property
    def path(self) -> Path:
        return self.wal.path

    def write(self, record: LogRecord, *, sync: bool = True) -> None:
        """Append ``record`` (synced: durable when this returns). StoreError if the log is
        full (nothing written) or failed."""
        if self.failed:
            raise StoreError(self.failed)
        version = record.piece.version if isinstance(record, PieceRecord) else record.version
        try:
            self.wal.append(version, _ENCODER.encode(record), sync=sync)
        except OSError as exc:
            self._fail(exc)

    def sync(self) -> None:
        """Write and ``fdatasync`` every record appended unsynced (a group commit)."""
        if self.failed:
            raise StoreError(self.failed)
        try:
            self.wal.sync()
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.failed = (
            f"live: the write-ahead log {self.path} could not be written ({exc}); "
            "live writes stop until the server is restarted"
        )
        log.error("%s", self.failed)
        raise StoreError(self.failed) from exc

    def room(self, *records: LogRecord) -> None:
        """StoreError (before any state changes) if ``records`` would not fit."""
        if self.failed:
            raise StoreError(self.failed)
        need = sum(RECORD.size + len(_ENCODER.encode(r)) for r in records)
        if self.wal.size + need > self.wal.max_bytes:
            raise StoreError(
                f"live: the write-ahead log {self.path} is full ({self.wal.size} of "
                f"{self.wal.max_bytes} bytes): compaction must run first"
            )

    def close(self) -> None:
        try:
            if self.failed:  # what did not reach the disk was never acknowledged
                self.wal.discard()
            self.wal.close()
        finally:
            os.close(self.lock_fd)


def log_name(part: int, replica: int) -> str:
    return f"part-{part}.wal" if not replica else f"part-{part}-replica-{replica}.wal"


def base_name(part: int, replica: int) -> str:
    """A replica's own compacted directories, beside its log (a primary's are in the
    partition directory): it compacts, and truncates its log, as its primary does."""
    return f"part-{part}-replica-{replica}.base"


def check_live_dir(path: Path, what: str = "live_dir") -> None:
    """ArgumentError unless ``path`` is a directory this process can write."""
    if not path.is_dir():
        raise ArgumentError(f"{what}: {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ArgumentError(f"{what}: {path} is not writable")


def open_log(live_dir: Path, part: int, replica: int) -> LiveLog:
    """Lock and open (or make) this server's log; StoreError if another server holds it."""
    path = Path(live_dir) / log_name(part, replica)
    lock = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise StoreError(f"{lock}: cannot open the log's lock ({exc.strerror or exc})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StoreError(f"{path}: another server is using this log (locked)") from None
    try:
        return LiveLog(WriteAheadLog(path, max_bytes=WAL_MAX_BYTES), fd)
    except BaseException:
        os.close(fd)
        raise


def decide(live_log: LiveLog | None, seq: Sequencer, version: int, commit: bool) -> bool:
    """The sequencer's decision, synced to the log before it is taken: a decision a
    partition may act on survives the sequencer's restart."""
    if version in seq.begun and live_log is not None:
        live_log.write(DecidedRecord(version, commit))
    return seq.decide(version, commit)


def apply(live_log: LiveLog | None, delta: LiveDelta, version: int, commit: bool) -> bool:
    """Commit or abort a held piece; logged unsynced (a lost record is the sequencer's
    decision, asked again after a restart)."""
    done = delta.commit(version) if commit else delta.abort(version)
    if done and live_log is not None:
        try:
            live_log.write(AppliedRecord(version, commit), sync=False)
        except StoreError as exc:
            log.warning("%s (version %d %s stands)", exc, version,
                        "committed" if commit else "aborted")  # fmt: skip
    return done


def _pairs(m: dict[int, int]) -> bytes:
    return np.array([list(m), list(m.values())], np.int64).reshape(2, -1).tobytes()


def _unpairs(data: bytes) -> dict[int, int]:
    a = np.frombuffer(data, np.int64).reshape(2, -1)
    return dict(zip(a[0].tolist(), a[1].tolist(), strict=True))


def frozen(seq: Sequencer) -> Sequencer:
    """A copy of the sequencer's state (taken in the loop: cheap copies, no encoding)."""
    out = Sequencer(Blocks(seq.nodes.base, seq.nodes.num_parts),
                    Blocks(seq.edges.base, seq.edges.num_parts))  # fmt: skip
    for mine, theirs in ((out.nodes, seq.nodes), (out.edges, seq.edges)):
        mine.owners, mine.open = list(theirs.owners), dict(theirs.open)
    out.next_version, out.head, out.begun = seq.next_version, seq.head, dict(seq.begun)
    out.decided, out.aborted, out.orig = dict(seq.decided), set(seq.aborted), dict(seq.orig)
    out.orig_pending = {v: dict(m) for v, m in seq.orig_pending.items()}
    return out


def snapshot(live_log: LiveLog, seq: Sequencer) -> None:
    """Log the sequencer's state (a :func:`frozen` copy; compaction truncates its records
    below it next)."""
    n, e = seq.nodes, seq.edges
    live_log.write(SequencerRecord(
        seq.next_version, seq.head, (list(n.owners), list(e.owners)), (dict(n.open), dict(e.open)),
        sorted(seq.begun), dict(seq.decided), sorted(seq.aborted), _pairs(seq.orig),
        {v: _pairs(m) for v, m in seq.orig_pending.items()},
    ))  # fmt: skip


def _restore(seq: Sequencer, rec: SequencerRecord, now: float) -> None:
    seq.next_version, seq.head = rec.version, rec.head
    for blocks, owners, opened in zip((seq.nodes, seq.edges), rec.blocks, rec.open, strict=True):
        blocks.owners, blocks.open = list(owners), {p: (b, u) for p, (b, u) in opened.items()}
    seq.begun = dict.fromkeys(rec.begun, now)
    seq.decided, seq.aborted = dict(rec.decided), set(rec.aborted)
    seq.orig = _unpairs(rec.orig)
    seq.orig_pending = {v: _unpairs(b) for v, b in rec.orig_pending.items()}


def replay(
    live_log: LiveLog, delta: LiveDelta, schema: Schema, seq: Sequencer | None
) -> tuple[str, list[str]]:
    """Rebuild ``delta`` (and the sequencer's state, on partition 0's primary and its
    replica) from the log; returns the sequencer's address and its replicas' the last
    piece named. StoreError naming the log and the record on anything that does not
    replay (the server does not start). Pieces at or below the delta's floor are in the
    compacted base (store/compact.py) already; the sequencer starts from its last
    snapshot, if any."""
    now = time.monotonic()
    count, seq_address = 0, ""
    seq_replicas: list[str] = []
    records: list[tuple[int, int, BegunRecord | DecidedRecord]] = []
    snap: SequencerRecord | None = None
    for rec in live_log.wal.records():
        try:
            item = _DECODER.decode(rec.data)
            if isinstance(item, PieceRecord) and item.piece.version > delta.floor:
                delta.hold(check_piece(item.piece, schema, delta), now)
                if item.seq:
                    seq_address, seq_replicas = item.seq, item.seq_replicas
            elif isinstance(item, AppliedRecord) and item.version > delta.floor:
                _ = delta.commit(item.version) if item.commit else delta.abort(item.version)
            elif isinstance(item, SequencerRecord):
                if seq is None:
                    raise StoreError("a sequencer's record in the log of a server that is not one")
                snap = item
            elif isinstance(item, BegunRecord | DecidedRecord):
                records.append((rec.offset, rec.version, item))
        except (msgspec.DecodeError, ArgumentError, StoreError) as exc:
            raise StoreError(f"{live_log.path}: the record at offset {rec.offset} (version "
                             f"{rec.version}) does not replay: {exc}") from exc  # fmt: skip
        count += 1
    if snap is not None and seq is not None:
        _restore(seq, snap, now)
        undecided = set(snap.begun)  # a decision of these came after the snapshot
        records = [r for r in records if r[2].version >= snap.version or
                   (isinstance(r[2], DecidedRecord) and r[2].version in undecided)]  # fmt: skip
    for offset, version, item in records:
        try:
            _sequence(seq, item, now)
        except StoreError as exc:
            raise StoreError(f"{live_log.path}: the record at offset {offset} (version "
                             f"{version}) does not replay: {exc}") from exc  # fmt: skip
    if count:
        head = f", head {seq.head}, next version {seq.next_version}" if seq is not None else ""
        log.info("live: replayed %d records of %s: %d pieces committed, %d pending%s",
                 count, live_log.path, len(delta.committed), len(delta.pending),
                 head)  # fmt: skip
    return seq_address, seq_replicas


def _sequence(seq: Sequencer | None, item: BegunRecord | DecidedRecord, now: float) -> None:
    if seq is None:
        raise StoreError("a sequencer's record in the log of a server that is not one")
    if isinstance(item, DecidedRecord):
        seq.decide(item.version, item.commit)
        return
    if item.version != seq.next_version:
        raise StoreError(f"version {item.version} begun; {seq.next_version} was next")
    seq.begin(item.nodes, item.edges, np.frombuffer(item.orig, dtype=np.int64), now)
