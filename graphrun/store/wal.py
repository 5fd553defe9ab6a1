"""The write-ahead log of one partition's live writes (issue 42): what a server has
acknowledged survives ``kill -9`` because it is on disk before the acknowledgement.

The file is written in place, never grown by a sync: it is extended ahead of the records
by extents of real zeros, written and synced once (1 MiB first, then its own size, at
most :data:`WAL_EXTENT` at a time), and records overwrite them. A sync that grows a file
commits its new size through ext4's journal every time; one that overwrites allocated,
written blocks does not (0.39–4.7 ms against 0.16–0.87 ms a sync, benchmarks/README.md).

Layout of the file (little-endian)::

    slots    two at offsets 0 and 512, each                            40 bytes
             b"GRWAL" b"\\0\\0\\0"  u32 format version (2)
             u32 crc32(format, generation, end, salt)  u64 generation  u64 end  u64 salt
    records  from offset 4096, one after the other:                    32 + length bytes
             u32 crc32(salt, the rest)  u32 length  u64 generation  u64 sequence
             u64 version  data (length bytes)

``data`` is the caller's bytes (the store logs a ``msgspec.msgpack`` Piece); ``version``
is the write batch's version (records need not come in version order: pieces of several
batches are prepared in parallel). Writes are group-committed: :meth:`WriteAheadLog.append`
buffers, :meth:`WriteAheadLog.sync` writes what was appended with one ``pwritev``, the
next slot and one ``fdatasync``; only then may the caller acknowledge.

**Where the log ends.** Bytes after the last synced record are a torn group (any subset
of its pages reached the disk) or records left from before an earlier crash, valid
and stale. Each open takes a new *generation*: it syncs what it read, then writes one
slot with the generation and the end it found and syncs it, before any record of its
own. Records are numbered from 0 in the file. Replay (:meth:`WriteAheadLog.records`)
reads from offset 4096 while each record has the next number, a generation at least its
predecessor's and at most the slot's, a length within the bound and the file, and its
CRC; the first that fails ends the log, and what follows it was never acknowledged and
is overwritten next. A stale record cannot pass: one that sits where the next record of
the chain starts is older than the generation that wrote that part of the chain. The
salt is random for each file (kept by a truncation): a record a writer planted inside
its own data, left after the end by a crash, does not check either.

**Corruption.** Each sync also writes a slot (the two in turn) with the end the sync
before it left, durable by then; the slot with the greater ``(generation, end)`` whose
CRC checks is read at open. A record that fails before that end is damage a crash cannot
cause: one :class:`StoreError` naming the file and the offset, and the server does not
start on it (nothing is overwritten). A torn slot leaves the other, older one.

A log of format 1 (graphrun before this layout, :mod:`graphrun.store.wal_v1`) is read
at open and rewritten in this format, atomically, before anything is appended.

Bounds: a record's version and data are at most ``max_record`` bytes (a length above it
ends the log, never allocated) and the records at most ``max_bytes``; an append past it
is refused with a StoreError (the delta must be compacted and the log truncated first:
:meth:`WriteAheadLog.truncate_before`, which rewrites the file atomically, fsynced).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from graphrun.errors import StoreError
from graphrun.files import fsync_path, write_atomic
from graphrun.store.wal_v1 import HEADER_V1, records_v1

log = logging.getLogger("graphrun.store")

MAGIC = b"GRWAL\0\0\0"
FORMAT_VERSION = 2
SLOT = struct.Struct("<8sIIQQQ")
SLOTS = (0, 512)
START = 4096  # the first record
RECORD = struct.Struct("<IIQQQ")
_CHECKED = struct.Struct("<IQQQ")  # what a slot's CRC covers
_VERSION_BYTES = 8
WAL_MAX_BYTES = 8 << 30
WAL_MAX_RECORD = 512 << 20
WAL_EXTENT = 64 << 20
_FIRST_EXTENT = 1 << 20
_ZEROS = bytes(1 << 20)
_IOV_MAX = 512  # buffers per pwritev (the kernel takes up to 1024)


@dataclass(frozen=True, eq=False)
class Record:
    """One logged write: its version, the caller's bytes, and where it starts in the file."""

    version: int
    data: bytes
    offset: int


@dataclass(frozen=True)
class _Frame:
    offset: int
    end: int
    version: int
    data: bytes | None  # None: the chain ends here, for ``problem``
    problem: str = ""
    quiet: bool = False  # zeros or the file's end: nothing was written there


def _slot(generation: int, end: int, salt: int) -> bytes:
    crc = zlib.crc32(_CHECKED.pack(FORMAT_VERSION, generation, end, salt))
    return SLOT.pack(MAGIC, FORMAT_VERSION, crc, generation, end, salt)


def _read_slot(raw: bytes) -> tuple[int, int, int] | None:
    """``(generation, end, salt)`` of a slot whose CRC checks, else None."""
    if len(raw) < SLOT.size:
        return None
    magic, fmt, crc, generation, end, salt = SLOT.unpack_from(raw)
    if magic != MAGIC or fmt != FORMAT_VERSION or generation < 1 or end < START:
        return None
    good = zlib.crc32(_CHECKED.pack(fmt, generation, end, salt)) == crc
    return (generation, end, salt) if good else None


def _crc(seed: int, rest: bytes, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(rest, seed))


def _frame(seed: int, generation: int, seq: int, version: int, data: bytes) -> bytes:
    rest = RECORD.pack(0, len(data), generation, seq, version)[4:]
    return struct.pack("<I", _crc(seed, rest, data)) + rest


def _write_all(fd: int, parts: list[bytes], offset: int) -> None:
    """``parts`` one after the other at ``offset`` with ``pwritev`` (no copy of the
    records into one buffer), short writes resumed."""
    views = [memoryview(p) for p in parts if len(p)]
    i = 0
    while i < len(views):
        n = os.pwritev(fd, views[i : i + _IOV_MAX], offset)
        offset += n
        while i < len(views) and n >= len(views[i]):
            n -= len(views[i])
            i += 1
        if n:
            views[i] = views[i][n:]


def _grown(alloc: int, need: int, extent: int) -> int:
    """The allocation that holds ``need`` bytes: extents of the file's own size, from
    1 MiB, at most ``extent`` each."""
    while alloc < need:
        alloc += min(max(alloc, _FIRST_EXTENT), extent)
    return alloc


class WriteAheadLog:
    """A log file written in place; opening it finds where its records end (see the
    module's docstring) and takes the next generation.

    Thread-safe: the server's loop appends and syncs while a compaction thread may
    truncate."""

    def __init__(
        self,
        path: str | Path,
        *,
        max_bytes: int = WAL_MAX_BYTES,
        max_record: int = WAL_MAX_RECORD,
        extent: int = WAL_EXTENT,
    ) -> None:
        if max_record < _VERSION_BYTES or max_bytes < START or extent < 4096:
            raise StoreError(
                f"{path}: log bounds too small ({max_bytes=}, {max_record=}, {extent=})"
            )
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.max_record = max_record
        self.extent = extent
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.syncs = 0  # fdatasyncs of appended records (groups)
        self.count = 0  # records, synced or not: the next one's sequence number
        self._size = START  # the end of the synced records
        self._alloc = 0  # the file's size: zeros or stale bytes after ``_size``
        self._generation = 0
        self._salt = 0
        self._next_slot = 0
        self._fd = self._open()
        try:
            self._start()
        except BaseException:
            os.close(self._fd)
            raise

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open the log ({exc.strerror or exc})") from None

    def _start(self) -> None:
        head = self._head()
        if head is None:  # new (or a crash while it was made: nothing was ever logged)
            self._alloc = 0
            self._grow(START)
            salt = int.from_bytes(os.urandom(8), "little")
            os.pwrite(self._fd, _slot(1, START, salt), SLOTS[0])
            os.fdatasync(self._fd)
            fsync_path(self.path.parent)
            head = (1, START, salt, 0)
        generation, synced, self._salt, slot = head
        self._generation, self._alloc = generation, os.fstat(self._fd).st_size
        self._size, self.count = START, 0
        with open(self._fd, "rb", closefd=False) as f:
            for frame in self._chain(f, self._alloc, generation):
                if frame.data is not None:
                    self._size, self.count = frame.end, self.count + 1
                    continue
                if frame.offset < synced:
                    raise StoreError(
                        f"{self.path}: corrupt at offset {frame.offset}: {frame.problem}, "
                        f"before the end of the synced records ({synced})"
                    )
                if not frame.quiet:
                    log.warning("%s: %s at offset %d; the log ends there (never acknowledged)",
                                self.path, frame.problem, frame.offset)  # fmt: skip
        os.fdatasync(self._fd)  # what was read is on disk before the slot says so
        self._generation, self._next_slot = generation + 1, 1 - slot
        self._write_slot()
        os.fdatasync(self._fd)

    def _head(self) -> tuple[int, int, int, int] | None:
        """``(generation, end, salt, slot)`` of the newest good slot; None for a log
        never written; a format-1 log is rewritten first."""
        raw = os.pread(self._fd, START, 0)
        fmt = HEADER_V1.unpack_from(raw)[1] if len(raw) >= HEADER_V1.size else 0
        if raw[: len(MAGIC)] == MAGIC and fmt == 1:
            self._convert()
            raw = os.pread(self._fd, START, 0)
        slots = [(s, i) for i, at in enumerate(SLOTS) if (s := _read_slot(raw[at:]))]
        if slots:
            (generation, end, salt), i = max(slots)
            return generation, end, salt, i
        if raw[: len(MAGIC)] == MAGIC and fmt not in (0, FORMAT_VERSION):
            raise StoreError(f"{self.path}: log format version {fmt}; this graphrun reads "
                                 f"{FORMAT_VERSION} (and 1)")  # fmt: skip
        if self._blank(raw):
            return None
        raise StoreError(f"{self.path}: not a graphrun write-ahead log (bad header)")

    def _blank(self, raw: bytes) -> bool:
        """Nothing but zeros, or a slot begun and zeros (a crash while the log was made)."""
        head = raw[: SLOT.size].rstrip(b"\0")
        if not (MAGIC.startswith(head[: len(MAGIC)]) and not raw[SLOT.size :].strip(b"\0")):
            return False
        size, at = os.fstat(self._fd).st_size, START
        while at < size:
            block = os.pread(self._fd, min(len(_ZEROS), size - at), at)
            if block.strip(b"\0"):
                return False
            at += len(block)
        return True

    def _convert(self) -> None:
        size = os.fstat(self._fd).st_size
        with open(self._fd, "rb", closefd=False) as f:
            self._generation, self._salt = 1, int.from_bytes(os.urandom(8), "little")
            self._rewrite(records_v1(self.path, f, size, self.max_record))
        log.info("%s: a log of format 1, rewritten in format %d (%d records)",
                 self.path, FORMAT_VERSION, self.count)  # fmt: skip

    def _chain(self, f: BinaryIO, size: int, last: int) -> Iterator[_Frame]:
        """The records from :data:`START` while they chain (see the module's docstring);
        the frame where the chain ends (``data`` None) is the last yielded, if any."""
        offset, seq, generation, seed = START, 0, 1, self._seed()
        while offset + RECORD.size <= size:
            f.seek(offset)
            crc, length, gen, number, version = RECORD.unpack(f.read(RECORD.size))
            end = offset + RECORD.size + length
            if not crc and not length and not gen:
                yield _Frame(offset, end, version, None, "zeros", quiet=True)
                return
            if number != seq or not generation <= gen <= last:
                problem = f"record {number} of generation {gen} where {seq} was next"
            elif _VERSION_BYTES + length > self.max_record or end > size:
                problem = f"a record length of {length} bytes"
            else:
                data = f.read(length)
                if _crc(seed, RECORD.pack(0, length, gen, number, version)[4:], data) == crc:
                    yield _Frame(offset, end, version, data)
                    offset, seq, generation = end, seq + 1, gen
                    continue
                problem = "a record whose CRC does not match"
            yield _Frame(offset, end, version, None, problem)
            return
        yield _Frame(offset, size, 0, None, "the end of the file", quiet=True)

    def records(self) -> Iterator[Record]:
        """The logged records in file order (the replay at start)."""
        with self._lock:
            self._flush()
            size, generation = self._size, self._generation
        with open(self.path, "rb") as f:
            for frame in self._chain(f, size, generation):
                if frame.data is None:
                    if frame.offset < size:  # the file changed under us since it was opened
                        raise StoreError(
                            f"{self.path}: corrupt at offset {frame.offset}: {frame.problem}"
                        )
                    return
                yield Record(frame.version, frame.data, frame.offset)

    @property
    def size(self) -> int:
        """Bytes of the records, synced or not (the file holds more: its extents)."""
        return self._size + self._pending_bytes

    def append(self, version: int, data: bytes, *, sync: bool = False) -> None:
        """Log one record; durable only after :meth:`sync` (or with ``sync=True``)."""
        if not 0 <= version < 1 << 64:
            raise StoreError(f"{self.path}: version {version} is not a u64")
        length = _VERSION_BYTES + len(data)
        if length > self.max_record:
            raise StoreError(
                f"{self.path}: a record of {length} bytes is over the bound of {self.max_record}"
            )
        with self._lock:
            if self.size + RECORD.size + len(data) > self.max_bytes:
                raise StoreError(
                    f"{self.path}: the log is full ({self.size} of {self.max_bytes} bytes); "
                    "compact and truncate it first"
                )
            head = _frame(self._seed(), self._generation, self.count, version, data)
            self._pending += (head, data)  # written as they are
            self._pending_bytes += RECORD.size + len(data)
            self.count += 1
            if sync:
                self._flush()

    def discard(self) -> None:
        """Forget what was appended and not synced (never acknowledged: a failed log)."""
        with self._lock:
            self.count -= len(self._pending) // 2
            self._pending.clear()
            self._pending_bytes = 0

    def sync(self) -> None:
        """Write and fsync everything appended (a group commit)."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._fd < 0:
            raise StoreError(f"{self.path}: the log is closed")
        end = self._size + self._pending_bytes
        if end > self._alloc:
            self._grow(end)
        _write_all(self._fd, self._pending, self._size)
        self._write_slot()  # the end the last sync left: durable already
        os.fdatasync(self._fd)
        self.syncs += 1
        self._size = end
        self._pending.clear()
        self._pending_bytes = 0

    def _seed(self) -> int:
        return zlib.crc32(self._salt.to_bytes(8, "little"))

    def _write_slot(self) -> None:
        slot = _slot(self._generation, self._size, self._salt)
        os.pwrite(self._fd, slot, SLOTS[self._next_slot])
        self._next_slot = 1 - self._next_slot

    def _grow(self, need: int) -> None:
        """Extend the file with real zeros, synced on their own (not a sparse or
        unwritten extent: its first write would journal again)."""
        alloc = _grown(self._alloc, need, self.extent)
        at = self._alloc
        while at < alloc:
            at += os.pwrite(self._fd, memoryview(_ZEROS)[: min(len(_ZEROS), alloc - at)], at)
        os.fdatasync(self._fd)
        self._alloc = alloc

    def truncate_before(self, version: int) -> int:
        """Drop every record with a version below ``version`` (folded into the base by
        compaction): the kept records are written to a new file, fsynced, and renamed over
        the log. Returns the number of records dropped."""
        with self._lock:
            self._flush()
            before = self.count
            with open(self.path, "rb") as f:
                frames = self._chain(f, self._size, self._generation)
                self._rewrite(
                    (r.version, r.data)
                    for r in frames
                    if r.data is not None and r.version >= version
                )
            return before - self.count

    def _rewrite(self, records: Iterable[tuple[int, bytes]]) -> None:
        """The log made of ``records`` (numbered from 0, of this generation), in a new
        file, synced, renamed over the log; the caller holds the lock."""
        count, end, seed = 0, START, self._seed()

        def write(out: BinaryIO) -> None:
            nonlocal count, end
            out.write(bytes(START))
            for version, data in records:
                out.write(_frame(seed, self._generation, count, version, data))
                out.write(data)
                count, end = count + 1, end + RECORD.size + len(data)
            at, alloc = end, _grown(0, end, self.extent)
            while at < alloc:
                at += out.write(memoryview(_ZEROS)[: min(len(_ZEROS), alloc - at)])
            out.seek(SLOTS[0])
            out.write(_slot(self._generation, end, self._salt))
            out.flush()
            os.fsync(out.fileno())

        write_atomic(self.path, write, mode=0o600)
        fsync_path(self.path.parent)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
        self._size, self.count, self._next_slot = end, count, 1
        self._alloc = os.fstat(self._fd).st_size

    def close(self) -> None:
        """Sync what was appended and close the file."""
        with self._lock:
            if self._fd < 0:
                return
            self._flush()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
