"""Node features served from the partition's files on local disk, through a bounded cache.

With ``features: disk`` (``graphrun serve --features disk``) a store server does not copy
the partition's node features into shared memory: it maps each ``part-K/node/<ntype>/
<name>.npy`` read-only and answers pulls from the mapping, with the hottest rows kept in
memory. The table may be larger than the host's memory; the page cache holds what the
kernel can spare, the server holds the cache and nothing else.

The cache is a **static hot set**: at start, the rows of the partition's nodes with the
most in-edges (ties: the lower row) are read once into one array, as many as fit
``cache_bytes``. Sampling reaches a node the more often the more edges it has (less than
in proportion: a batch reads a node once), so degree ranks rows by how often they are
pulled, with no bookkeeping on the read path: a pull looks its rows up in a slot index
(int32, one entry per row of the partition), gathers the hits from the cache and the
misses from the mapping. The hit rate is the same on every run of a job, which makes it
measurable.

Bounds: the cache of every tensor is its slot index (4 bytes a row of the partition,
taken from its share first; a share smaller than the index gets no cache) and its rows;
the server's ``cache_bytes`` is split over its disk tensors by their size, so the sum
never exceeds it. ``disk_bytes`` counts the bytes of the rows read from the mapping
(the misses): what a cold page cache reads from disk, at most.

Edge features, structure and tensors jobs create stay in shared memory. A disk tensor is
read-only (no ``push``).

**Co-located clients read it themselves.** The hot set is chosen once, at start, and never
changes: the main server keeps the cache and its slot index in two shared-memory segments
(:meth:`DiskRows.share`; one cache per partition and host, still within ``cache_bytes``)
and names them and the file in the tensor's :class:`~graphrun.store.state.TensorInfo`. A
client on the same machine maps both read-only and the file itself (:func:`open_shared`):
hits are copied from the shared cache, misses from its own mapping of the file (the page
cache, shared by every process of the host), with no request and no lock (nothing is ever
written after start). Each process counts its own hits and bytes (``counters``); the
trainers carry them to the epoch record with their batches (``BatchCost.disk_hit_bytes``,
``disk_bytes``), the server counts what it serves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from graphrun.errors import PartitionFormatError, StoreError
from graphrun.store.shm import SegmentStore, attach


@dataclass
class DiskCounters:
    """What the cache of one server did since it started."""

    hits: int = 0  # rows
    misses: int = 0
    hit_bytes: int = 0  # bytes of the rows the cache served
    disk_bytes: int = 0  # ... and of those read from the file


class DiskRows:
    """One tensor's rows: a read-only mapping of its file and a cache of hot rows (``cache``,
    and ``slot``: local row -> cache row or -1; both empty without a cache)."""

    def __init__(
        self, path: Path, mapping: np.ndarray, cache: np.ndarray, slot: np.ndarray
    ) -> None:
        self.path = path
        self.mapping = mapping
        self.cache = cache
        self.slot = slot
        self.counters = DiskCounters()

    @classmethod
    def build(cls, path: Path, mapping: np.ndarray, hot: np.ndarray, budget: int) -> DiskRows:
        """The rows ``hot`` (most wanted first) cached, as many as fit ``budget`` bytes
        after the slot index (4 bytes a row of the partition; a budget smaller than that
        gets no cache)."""
        n = len(mapping)
        room = max(budget, 0) - n * slot_dtype(n).itemsize  # the slot index first, then rows
        keep = min(len(hot), max(room, 0) // max(row_bytes(mapping), 1)) if room > 0 else 0
        rows = np.sort(np.asarray(hot[:keep], dtype=np.int64))
        slot = np.full(n if keep else 0, -1, dtype=slot_dtype(n))
        slot[rows] = np.arange(keep)
        try:
            cache = np.ascontiguousarray(mapping[rows])
        except (OSError, ValueError) as exc:  # a file cut short after it was mapped
            raise PartitionFormatError(f"{path}: cannot be read ({exc})") from None
        return cls(path, mapping, cache, slot)

    @property
    def rows(self) -> np.ndarray:
        """The local rows the cache holds, ascending."""
        return np.flatnonzero(self.slot >= 0)

    @property
    def cache_bytes(self) -> int:
        """Memory the cache holds (its rows and the slot index)."""
        return int(self.cache.nbytes + self.slot.nbytes)

    def share(self, segments: SegmentStore) -> tuple[str, str]:
        """Move the cache and the slot index into shared memory (the main server, once at
        start); returns their segments' names ("" without a cache)."""
        if not len(self.cache):
            return "", ""
        cache_seg, self.cache = segments.copy_in(self.cache)
        slot_seg, self.slot = segments.copy_in(self.slot)
        self.cache.flags.writeable = self.slot.flags.writeable = False
        return cache_seg, slot_seg

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (local, checked) in the given order."""
        if not len(self.slot):
            missed = len(rows)
            out = np.take(self.mapping, rows, axis=0, mode="clip")
        else:
            out = np.empty((len(rows), *self.mapping.shape[1:]), dtype=self.mapping.dtype)
            slot = self.slot[rows]
            hit, miss = np.flatnonzero(slot >= 0), np.flatnonzero(slot < 0)
            out[hit] = np.take(self.cache, slot[hit], axis=0, mode="clip")
            out[miss] = np.take(self.mapping, rows[miss], axis=0, mode="clip")
            missed = len(miss)
        c, size = self.counters, row_bytes(self.mapping)
        c.hits += len(rows) - missed
        c.misses += missed
        c.hit_bytes += (len(rows) - missed) * size
        c.disk_bytes += missed * size
        return out


def slot_dtype(n: int) -> np.dtype:
    """The slot index's entries, for a partition of ``n`` rows."""
    return np.dtype(np.int32 if n < 2**31 else np.int64)


def file_id(path: Path) -> tuple[int, int, int]:
    """What tells one file from another at the same path: device, inode, change time (ns)."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_ctime_ns


class DiskInfo(Protocol):
    """What :func:`open_info` reads of a disk tensor's ``TensorInfo``."""

    @property
    def dtype(self) -> str: ...
    @property
    def row_shape(self) -> tuple[int, ...]: ...
    @property
    def part_rows(self) -> int: ...
    @property
    def file(self) -> str: ...
    @property
    def file_id(self) -> tuple[int, int, int]: ...
    @property
    def cache(self) -> tuple[str, str]: ...
    @property
    def cache_rows(self) -> int: ...


def open_info(info: DiskInfo, shm_dir: Path) -> DiskRows:
    """The rows of a disk tensor as its main server describes it (``TensorInfo``): the
    file and the cache and slot index in shared memory, all mapped read-only."""
    n = info.part_rows
    cache = np.empty((0, *info.row_shape), info.dtype)
    slot = np.empty(0, slot_dtype(n))
    cache_seg, slot_seg = info.cache
    if cache_seg:
        cache = attach(shm_dir, cache_seg, info.dtype, (info.cache_rows, *info.row_shape), False)
        slot = attach(shm_dir, slot_seg, slot_dtype(n), (n,), False)
    shape = (n, *info.row_shape)
    return open_shared(Path(info.file), info.file_id, info.dtype, shape, cache, slot)


def open_shared(
    path: Path,
    ident: tuple[int, int, int],
    dtype: str,
    shape: tuple[int, ...],
    cache: np.ndarray,
    slot: np.ndarray,
) -> DiskRows:
    """A co-located client's view of a disk tensor: its own read-only mapping of ``path``
    (the server's file: ``ident`` is its :func:`file_id`, another file at that path in
    another mount namespace is refused; checked against the tensor's ``dtype`` and
    ``shape``) and the server's cache and slot index (mapped from shared memory).
    StoreError when the file cannot be mapped as that."""
    try:
        if file_id(path) != tuple(ident):
            raise StoreError(f"{path}: not the file the server maps")
        mapping = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: cannot be mapped ({exc})") from None
    if mapping.dtype != np.dtype(dtype) or mapping.shape != shape:
        raise StoreError(
            f"{path}: {mapping.dtype}{list(mapping.shape)}, the server serves {dtype}{list(shape)}"
        )
    return DiskRows(path, mapping, cache, slot)


def row_bytes(arr: np.ndarray) -> int:
    return int(arr.dtype.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64)))


#: the counters a server reports in ``stats`` (``disk``), summed over its disk tensors
DISK_COUNTERS = ("hits", "misses", "hit_bytes", "disk_bytes", "cache_bytes")


def epoch_fields(
    before: dict[str, int] | None,
    after: dict[str, int] | None,
    local_hit: float = 0,
    local_read: float = 0,
) -> dict[str, Any]:
    """The epoch metrics of the store's disk features: ``disk_hit_rate`` (of the bytes
    pulled, the cache's share, as the trainers' ``cache_hit_rate``; None without a pull)
    and ``disk_bytes`` (read from the files). What the servers served is their counters at
    the epoch's start and end (None: not readable, a job key); what co-located trainers
    and their sampler workers read themselves, ``local_hit`` and ``local_read``, comes
    with their batches. Nothing without disk features."""
    hit, read = int(local_hit), int(local_read)
    if before is not None and after is not None:
        hit += after["hit_bytes"] - before["hit_bytes"]
        read += after["disk_bytes"] - before["disk_bytes"]
    elif not hit + read:
        return {}
    return {"disk_hit_rate": round(hit / (hit + read), 4) if hit + read else None,
            "disk_bytes": read}  # fmt: skip


def disk_stats(tensors: list[DiskRows]) -> dict[str, int]:
    """A server's disk counters, summed over its disk tensors (the ``stats`` reply)."""
    return {
        "tensors": len(tensors),
        "hits": sum(d.counters.hits for d in tensors),
        "misses": sum(d.counters.misses for d in tensors),
        "hit_bytes": sum(d.counters.hit_bytes for d in tensors),
        "disk_bytes": sum(d.counters.disk_bytes for d in tensors),
        "cache_bytes": sum(d.cache_bytes for d in tensors),
    }
