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
read-only (no ``push``); co-located clients pull it through the server (they cannot read
another process's cache; see :mod:`graphrun.store.catalog`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphrun.errors import PartitionFormatError


@dataclass
class DiskCounters:
    """What the cache of one server did since it started."""

    hits: int = 0  # rows
    misses: int = 0
    hit_bytes: int = 0  # bytes of the rows the cache served
    disk_bytes: int = 0  # ... and of those read from the file


class DiskRows:
    """One tensor's rows: a read-only mapping of its file and a bounded cache of hot rows."""

    def __init__(self, path: Path, mapping: np.ndarray, hot: np.ndarray, budget: int) -> None:
        self.path = path
        self.mapping = mapping
        n = len(mapping)
        index = np.dtype(np.int32 if n < 2**31 else np.int64)
        room = max(budget, 0) - n * index.itemsize  # the slot index first, then rows
        keep = min(len(hot), max(room, 0) // max(row_bytes(mapping), 1)) if room > 0 else 0
        self.rows = np.sort(np.asarray(hot[:keep], dtype=np.int64))
        self.slot = np.full(n if keep else 0, -1, dtype=index)  # local row -> cache row
        self.slot[self.rows] = np.arange(keep)
        try:
            self.cache = np.ascontiguousarray(mapping[self.rows])
        except (OSError, ValueError) as exc:  # a file cut short after it was mapped
            raise PartitionFormatError(f"{path}: cannot be read ({exc})") from None
        self.counters = DiskCounters()

    @property
    def cache_bytes(self) -> int:
        """Memory the cache holds (its rows and the slot index)."""
        return int(self.cache.nbytes + self.slot.nbytes)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (local, checked) in the given order."""
        if not len(self.slot):
            missed = rows
            out = np.take(self.mapping, rows, axis=0, mode="clip")
        else:
            out = np.empty((len(rows), *self.mapping.shape[1:]), dtype=self.mapping.dtype)
            slot = self.slot[rows]
            hit, miss = np.flatnonzero(slot >= 0), np.flatnonzero(slot < 0)
            out[hit] = np.take(self.cache, slot[hit], axis=0, mode="clip")
            out[miss] = np.take(self.mapping, rows[miss], axis=0, mode="clip")
            missed = miss
        c, size = self.counters, row_bytes(self.mapping)
        c.hits += len(rows) - len(missed)
        c.misses += len(missed)
        c.hit_bytes += (len(rows) - len(missed)) * size
        c.disk_bytes += len(missed) * size
        return out


def row_bytes(arr: np.ndarray) -> int:
    return int(arr.dtype.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64)))


#: the counters a server reports in ``stats`` (``disk``), summed over its disk tensors
DISK_COUNTERS = ("hits", "misses", "hit_bytes", "disk_bytes", "cache_bytes")


def epoch_fields(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, Any]:
    """The epoch metrics of the store's disk features, from the servers' counters at the
    epoch's start and end: ``disk_hit_rate`` (of the bytes pulled, the cache's share, as the
    trainers' ``cache_hit_rate``; None without a pull) and ``disk_bytes`` (read from the
    files). Nothing without disk features."""
    if before is None or after is None:
        return {}
    hit = after["hit_bytes"] - before["hit_bytes"]
    read = after["disk_bytes"] - before["disk_bytes"]
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
