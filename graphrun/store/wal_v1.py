"""Reading a write-ahead log of format 1 (graphrun before issue 42's in-place log), so
that :class:`~graphrun.store.wal.WriteAheadLog` can rewrite it in its own format at open.

Layout (little-endian)::

    header   b"GRWAL" b"\\0\\0\\0"  u32 format version (1)  u32 0     16 bytes
    record   u32 length  u32 crc32(payload)  payload               8 + length bytes
    payload  u64 version  data                                     length >= 8

The file only grew, so what a crash can leave is at its end: a last record shorter than
its frame says, a last record whose CRC does not match, or zeros to the end. That is cut
off (never acknowledged); a bad record with other bytes after it is damage a crash
cannot cause: one :class:`StoreError` naming the file and the offset.
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from graphrun.errors import StoreError

log = logging.getLogger("graphrun.store")

HEADER_V1 = struct.Struct("<8sII")
FRAME_V1 = struct.Struct("<II")
_VERSION = struct.Struct("<Q")
_READ = 1 << 20


def _zeros_to_end(f: BinaryIO, start: int, size: int) -> bool:
    f.seek(start)
    while block := f.read(min(_READ, size - f.tell())):
        if block.count(0) != len(block):
            return False
    return True


def _frames(
    f: BinaryIO, size: int, max_record: int
) -> Iterator[tuple[int, int, bytes | None, str]]:
    """``(offset, end, payload, problem)`` per frame; a frame with a problem is the last."""
    offset = HEADER_V1.size
    while offset < size:
        f.seek(offset)
        head = f.read(FRAME_V1.size)
        if len(head) < FRAME_V1.size:
            yield offset, size, None, "a torn record header"
            return
        length, crc = FRAME_V1.unpack(head)
        if not _VERSION.size <= length <= max_record:
            yield offset, offset + FRAME_V1.size, None, f"a record length of {length} bytes"
            return
        end = offset + FRAME_V1.size + length
        if end > size:
            yield offset, size, None, f"a torn record ({size - offset} of {end - offset} bytes)"
            return
        payload = f.read(length)
        if zlib.crc32(payload) != crc:
            yield offset, end, None, "a record whose CRC does not match"
            return
        yield offset, end, payload, ""
        offset = end


def records_v1(path: Path, f: BinaryIO, size: int, max_record: int) -> Iterator[tuple[int, bytes]]:
    """``(version, data)`` of each good record of the format-1 log open as ``f``, in file
    order; a torn tail is logged and left out, damage raises StoreError."""
    for offset, end, payload, problem in _frames(f, size, max_record):
        if payload is not None:
            (version,) = _VERSION.unpack_from(payload)
            yield version, payload[_VERSION.size :]
            continue
        if end < size and not _zeros_to_end(f, offset + FRAME_V1.size, size):
            raise StoreError(
                f"{path}: corrupt at offset {offset}: {problem}, with more bytes after it "
                "(not a torn tail)"
            )
        log.warning("%s: %s; cut off at offset %d (never acknowledged)", path, problem, offset)
        return
