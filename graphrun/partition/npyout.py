"""Output ``.npy`` files written slice by slice, never whole in memory.

:func:`open_npy` makes the file (header and size as ``np.save`` writes them) and maps
it; a writer fills a slice, then :func:`flushed` writes it back and lets go of its
pages, so a large output costs a slice of memory, not the file. Readers see the same
bytes as from ``np.save``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from graphrun.graph.graph import release
from graphrun.partition.relabel import LocalStructure

ROW_BYTES = 1 << 26  # feature bytes gathered at once


def open_npy(path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """An output ``.npy`` to fill slice by slice (the bytes ``np.save`` writes); memory
    mapped when it has rows (flushed and let go of by :func:`flushed`)."""
    if not shape[0]:
        np.save(path, np.empty(shape, dtype=dtype))
        return np.empty(shape, dtype=dtype)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    with open(path, "r+b") as f:  # the blocks now: a full disk is ENOSPC here, not SIGBUS later
        os.posix_fallocate(f.fileno(), 0, out.offset + out.nbytes)
    return out


def flushed(out: np.ndarray) -> None:
    if isinstance(out, np.memmap):
        out.flush()
        release(out)


def save_column(path: Path, loc: LocalStructure, name: str, dtype: type = np.int64) -> None:
    out = open_npy(path, np.dtype(dtype), (loc.num_edges,))
    at = 0
    for piece in loc.column(name):
        out[at : at + len(piece)] = piece
        at += len(piece)
        flushed(out)


def save_rows(path: Path, arr: np.ndarray, rows: np.ndarray) -> None:
    """``arr[rows]`` to ``path``, gathered a slice of rows at a time."""
    out = open_npy(path, arr.dtype, (len(rows), *arr.shape[1:]))
    step = max(1, ROW_BYTES // max(arr[:1].nbytes, 1))
    for i in range(0, len(rows), step):
        out[i : i + step] = arr[rows[i : i + step]]
        release(arr)
        flushed(out)


def concat_npy(path: Path, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``np.concatenate(arrays)`` written to ``path`` a slice at a time and mapped back
    read-only: the rows of several memory-mapped files as one array that costs
    memory only for the pages a reader touches."""
    first = arrays[0]
    shape = (sum(len(a) for a in arrays), *first.shape[1:])
    out = open_npy(path, first.dtype, shape)
    if not shape[0]:
        return out
    step = max(1, ROW_BYTES // max(first[:1].nbytes, 1))
    at = 0
    for arr in arrays:
        for i in range(0, len(arr), step):
            piece = arr[i : i + step]
            out[at : at + len(piece)] = piece
            at += len(piece)
            release(arr)
            flushed(out)
    del out
    return np.load(path, mmap_mode="r")
