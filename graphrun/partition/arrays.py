"""Linear-time array kernels for integer ids, shared by the partitioning modes.

Sorting is numpy's stable sort over 16-bit digits (a radix sort for keys of 16 bits or
less: two passes cover 32-bit keys); distinct ids and their counts come from a dense
table over the id range when that table is not larger than the input itself
(``np.unique`` sorts: 20x slower on 40M ids of a 2M range). Every result is exactly
what the sorting version returns.

The distributed mode's rows grouped by destination rank (:func:`by_rank`) are here, not
with the collectives in :mod:`.comm`: only a rank imports torch, and the launcher and
the modules a rank's phases live in import this one (a refused ``graphrun partition
--mode distributed`` took 1.8 CPU-s with torch, 0.4 without).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np

from graphrun.graph.graph import release

SLICE = 1 << 23  # entries per slice where a kernel avoids full-length temporaries
ROUND_BYTES = 1 << 24  # bytes a rank sends in one round of a large exchange
PIECE = 1 << 20  # entries a slice-by-slice pass of the distributed mode takes at once


def pieces(arr: np.ndarray, step: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, arr[start : start + step])`` in order (``step``: ``SLICE``); a
    memory-mapped ``arr`` lets go of its pages after each slice
    (:func:`graphrun.graph.graph.release`), so a pass over a mapped file holds one
    slice of it, not the file."""
    step = step or SLICE
    for start in range(0, len(arr), step):
        yield start, arr[start : start + step]
        release(arr)


def group_ranks(sorted_keys: np.ndarray) -> np.ndarray:
    """Position of every entry of sorted ``sorted_keys`` among the entries of its key
    (0 for the first of each key)."""
    n = len(sorted_keys)
    first = np.zeros(n, dtype=np.int64)
    if n > 1:
        new = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
        first[new] = new
        np.maximum.accumulate(first, out=first)
    return np.arange(n, dtype=np.int64) - first


def _digits(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The low and high 16-bit digits of int32/int64 ``keys`` < 2**32 as views (no
    copy), on little-endian machines."""
    if sys.byteorder != "little" or keys.dtype not in (np.int32, np.int64):
        return None
    if not keys.flags.c_contiguous:
        return None
    words = keys.view(np.uint16).reshape(-1, keys.dtype.itemsize // 2)
    return words[:, 0], words[:, 1]


def stable_argsort(keys: np.ndarray, max_key: int) -> np.ndarray:
    """Stable argsort (int64) of non-negative integer ``keys`` < ``max_key``."""
    if max_key <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable").astype(np.int64, copy=False)
    if max_key > 1 << 32:
        return np.argsort(keys, kind="stable").astype(np.int64, copy=False)
    digits = _digits(keys)
    if digits is None:  # 16-bit digits by arithmetic: two int64 temporaries more
        low, high = (keys & 0xFFFF).astype(np.uint16), (keys >> 16).astype(np.uint16)
    else:
        low, high = digits
    # the first pass's order kept as int32 where it fits: three index arrays coexist at
    # the gather below, the peak of relabelling 80M edges
    index = np.int32 if len(keys) < 1 << 31 else np.int64
    order = np.argsort(low, kind="stable").astype(index)
    second = np.argsort(high[order], kind="stable")
    order = order[second]
    del second
    return order.astype(np.int64, copy=False)


def _dense(values: np.ndarray, upper: int) -> bool:
    # a table of `upper` int32 entries costs at most the bytes of the int64 input
    return 0 < upper <= 2 * max(len(values), 1) and upper < 1 << 31


def unique_inverse(values: np.ndarray, upper: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for non-negative ints < ``upper``."""
    values = np.asarray(values)
    if not _dense(values, upper):
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse.reshape(-1)
    uniq = unique(values, upper)
    index = np.zeros(upper, dtype=np.int32)
    index[uniq] = np.arange(len(uniq), dtype=np.int32)
    return uniq, index[values].astype(np.int64)


def unique_counts(values: np.ndarray, upper: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_counts=True)`` for non-negative ints < ``upper``."""
    values = np.asarray(values)
    if not _dense(values, upper):
        return np.unique(values, return_counts=True)
    counts = np.bincount(values, minlength=upper)
    uniq = np.flatnonzero(counts)
    return uniq, counts[uniq]


def unique(values: np.ndarray, upper: int) -> np.ndarray:
    """``np.unique(values)`` for non-negative ints < ``upper``."""
    values = np.asarray(values)
    if not _dense(values, upper):
        return np.unique(values)
    seen = np.zeros(upper, dtype=bool)
    seen[values] = True
    return np.flatnonzero(seen)


def unique_sorted(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of a 1-d array by one sort: numpy 2's own hashes, then sorts (4x
    slower on the ten thousand int64 ids of an embedding refresh)."""
    a = np.sort(values)
    return a[np.concatenate([[True], a[1:] != a[:-1]])] if len(a) else a


def rank_order(dest: np.ndarray, world: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows' order grouped by destination rank (stable inside a rank), and where
    each rank's group starts in it (``world + 1`` cuts)."""
    cuts = np.zeros(world + 1, dtype=np.int64)
    np.cumsum(np.bincount(dest, minlength=world), out=cuts[1:])
    return stable_argsort(dest, world), cuts


def by_rank(
    dest: np.ndarray,
    world: int,
    *cols: np.ndarray,
    grouping: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Rows (the stacked ``cols``) grouped by destination rank, for :meth:`Comm.exchange`
    (``grouping``: :func:`rank_order` of ``dest``, when the caller has it already)."""
    order, cuts = grouping if grouping is not None else rank_order(dest, world)
    rows = np.stack([c[order] for c in cols], axis=1) if cols else np.zeros((len(dest), 0))
    return [np.ascontiguousarray(rows[cuts[q] : cuts[q + 1]]) for q in range(world)]
