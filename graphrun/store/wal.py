"""The write-ahead log of one partition's live writes (issue 42): what a server has
acknowledged survives ``kill -9`` because it is on disk before the acknowledgement.

Layout of the file (little-endian; the header carries the format version)::

    header   b"GRWAL" b"\\0\\0\\0"  u32 format version (1)          16 bytes
             u32 0 (reserved)
    record   u32 length  u32 crc32(payload)  payload               8 + length bytes
    payload  u64 version  data                                     length >= 8

``data`` is the caller's bytes (the store logs a ``msgspec.msgpack`` Piece); ``version``
is the write batch's version (records need not come in version order: pieces of several
batches are prepared in parallel). Writes are group-committed: :meth:`WriteAheadLog.append`
buffers, :meth:`WriteAheadLog.sync` writes what was appended with one ``pwritev`` and one
``fdatasync``; only then may the caller acknowledge (``append(..., sync=True)`` does both).

Replay at start (:meth:`WriteAheadLog.records`) yields the records in file order. What a
crash can leave is cut off and logged, not an error: a last record shorter than its
frame says, a last record whose CRC does not match, or zeros from the first bad record to
the end (a file extended but not written). Anything else that does not check (a bad
record followed by more bytes) is damage a crash cannot cause: one :class:`StoreError`
naming the file and the offset, and the server does not start on it.

Bounds: a record's payload is at most ``max_record`` bytes (a length above it is
corruption, never allocated) and the file at most ``max_bytes``; an append past it is
refused with a StoreError (the delta must be compacted and the log truncated first:
:meth:`WriteAheadLog.truncate_before`, which rewrites the file atomically, fsynced).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from graphrun.errors import StoreError
from graphrun.files import write_atomic

log = logging.getLogger("graphrun.store")

MAGIC = b"GRWAL\0\0\0"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sII")
FRAME = struct.Struct("<II")
VERSION = struct.Struct("<Q")
WAL_MAX_BYTES = 8 << 30
WAL_MAX_RECORD = 512 << 20
_READ = 1 << 20
_IOV_MAX = 512  # buffers per pwritev (the kernel takes up to 1024)


@dataclass(frozen=True, eq=False)
class Record:
    """One logged write: its version, the caller's bytes, and where it starts in the file."""

    version: int
    data: bytes
    offset: int


@dataclass(frozen=True)
class _Scan:
    end: int  # offset after the last good record
    count: int
    cut: str  # why bytes after ``end`` were cut off ("" if none)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _zeros_to_end(f: BinaryIO, start: int, size: int) -> bool:
    f.seek(start)
    while block := f.read(min(_READ, size - f.tell())):
        if block.count(0) != len(block):
            return False
    return True


def _write_all(fd: int, parts: list[bytes], offset: int) -> None:
    """``parts`` one after the other at ``offset`` with ``pwritev`` (the file's end is
    ours alone; no copy of the records into one buffer), short writes resumed."""
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


class WriteAheadLog:
    """An append-only log file; opening it checks every record and cuts off a torn tail.

    Thread-safe: the server's loop appends and syncs while a compaction thread may
    truncate."""

    def __init__(
        self, path: str | Path, *, max_bytes: int = WAL_MAX_BYTES, max_record: int = WAL_MAX_RECORD
    ) -> None:
        if max_record < VERSION.size or max_bytes < HEADER.size:
            raise StoreError(f"{path}: log bounds too small ({max_bytes=}, {max_record=})")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.max_record = max_record
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.syncs = 0  # fdatasyncs of appended records (groups)
        self._fd = self._open()
        try:
            scan = self._scan()
            if scan.cut:
                log.warning(
                    "%s: %s; cut off at offset %d (never acknowledged)",
                    self.path, scan.cut, scan.end,
                )  # fmt: skip
                os.ftruncate(self._fd, scan.end)
                os.fsync(self._fd)
        except BaseException:
            os.close(self._fd)
            raise
        self._size = scan.end
        self.count = scan.count

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open the log ({exc.strerror or exc})") from None
        header = HEADER.pack(MAGIC, FORMAT_VERSION, 0)
        size = os.fstat(fd).st_size
        if size < HEADER.size and header.startswith(os.pread(fd, size, 0)):  # new, or torn
            os.ftruncate(fd, 0)
            os.pwrite(fd, header, 0)
            os.fsync(fd)
            _fsync_dir(self.path)
        return fd

    def _check_header(self, f: BinaryIO) -> None:
        f.seek(0)
        head = f.read(HEADER.size)
        if len(head) < HEADER.size or head[: len(MAGIC)] != MAGIC:
            raise StoreError(f"{self.path}: not a graphrun write-ahead log (bad header)")
        _, version, _ = HEADER.unpack(head)
        if version != FORMAT_VERSION:
            raise StoreError(
                f"{self.path}: log format version {version}; this graphrun reads {FORMAT_VERSION}"
            )

    def _frames(self, f: BinaryIO, size: int) -> Iterator[tuple[int, int, bytes | None, str]]:
        """``(offset, end, payload, problem)`` per frame from the header on; a frame with
        a problem is the last one yielded."""
        offset = HEADER.size
        while offset < size:
            f.seek(offset)
            head = f.read(FRAME.size)
            if len(head) < FRAME.size:
                yield offset, size, None, "a torn record header"
                return
            length, crc = FRAME.unpack(head)
            if not VERSION.size <= length <= self.max_record:
                yield offset, offset + FRAME.size, None, f"a record length of {length} bytes"
                return
            end = offset + FRAME.size + length
            if end > size:
                yield offset, size, None, f"a torn record ({size - offset} of {end - offset} bytes)"
                return
            payload = f.read(length)
            if zlib.crc32(payload) != crc:
                yield offset, end, None, "a record whose CRC does not match"
                return
            yield offset, end, payload, ""
            offset = end

    def _scan(self) -> _Scan:
        size = os.fstat(self._fd).st_size
        with open(self._fd, "rb", closefd=False) as f:
            self._check_header(f)
            good, count = HEADER.size, 0
            for offset, end, payload, problem in self._frames(f, size):
                if payload is not None:
                    good, count = end, count + 1
                    continue
                if end < size and not _zeros_to_end(f, offset + FRAME.size, size):
                    raise StoreError(
                        f"{self.path}: corrupt at offset {offset}: {problem}, "
                        f"with {size - end} more bytes after it (not a torn tail)"
                    )
                return _Scan(offset, count, problem)
        return _Scan(good, count, "")

    def records(self) -> Iterator[Record]:
        """The logged records in file order (the replay at start)."""
        with self._lock:
            self._flush()
            size = self._size
        with open(self.path, "rb") as f:
            self._check_header(f)
            for offset, _, payload, problem in self._frames(f, size):
                if payload is None:  # the file changed under us since it was opened
                    raise StoreError(f"{self.path}: corrupt at offset {offset}: {problem}")
                (version,) = VERSION.unpack_from(payload)
                yield Record(version, payload[VERSION.size :], offset)

    @property
    def size(self) -> int:
        """Bytes in the file and appended, synced or not."""
        return self._size + self._pending_bytes

    def append(self, version: int, data: bytes, *, sync: bool = False) -> None:
        """Log one record; durable only after :meth:`sync` (or with ``sync=True``)."""
        if not 0 <= version < 1 << 64:
            raise StoreError(f"{self.path}: version {version} is not a u64")
        length = VERSION.size + len(data)
        if length > self.max_record:
            raise StoreError(
                f"{self.path}: a record of {length} bytes is over the bound of {self.max_record}"
            )
        head = VERSION.pack(version)
        crc = zlib.crc32(data, zlib.crc32(head))
        with self._lock:
            if self.size + FRAME.size + length > self.max_bytes:
                raise StoreError(
                    f"{self.path}: the log is full ({self.size} of {self.max_bytes} bytes); "
                    "compact and truncate it first"
                )
            self._pending += (FRAME.pack(length, crc) + head, data)  # written as they are
            self._pending_bytes += FRAME.size + length
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
        _write_all(self._fd, self._pending, self._size)
        os.fdatasync(self._fd)
        self.syncs += 1
        self._size += self._pending_bytes
        self._pending.clear()
        self._pending_bytes = 0

    def truncate_before(self, version: int) -> int:
        """Drop every record with a version below ``version`` (folded into the base by
        compaction): the kept records are written to a new file, fsynced, and renamed over
        the log. Returns the number of records dropped."""
        with self._lock:
            self._flush()
            kept = 0

            def write(out: BinaryIO) -> None:
                nonlocal kept
                out.write(HEADER.pack(MAGIC, FORMAT_VERSION, 0))
                with open(self.path, "rb") as f:
                    for offset, end, payload, problem in self._frames(f, self._size):
                        if payload is None:
                            raise StoreError(f"{self.path}: corrupt at offset {offset}: {problem}")
                        if VERSION.unpack_from(payload)[0] >= version:
                            f.seek(offset)
                            out.write(f.read(end - offset))
                            kept += 1
                out.flush()
                os.fsync(out.fileno())

            write_atomic(self.path, write, mode=0o600)
            _fsync_dir(self.path)
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
            self._size = os.fstat(self._fd).st_size
            dropped, self.count = self.count - kept, kept
            return dropped

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
