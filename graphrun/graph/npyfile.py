"""``.npy`` files written slice by slice, never whole in memory.

:func:`open_npy` makes the file (header and size as ``np.save`` writes them, its blocks
allocated now) and maps it; a writer fills a slice, then :func:`flushed` writes it back
and lets go of its pages, so a large output costs a slice of memory, not the file.
Readers see the same bytes as from ``np.save``. :func:`concat_npy` joins arrays end to
end this way: the graph's chunked reader and the partitioner's writers share it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from graphrun.graph.graph import release

CONCAT_SLICE_BYTES = 16 << 20  # bytes of the inputs joined at once (each slice flushed)


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


def concat_npy(path: Path, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``np.concatenate(arrays)`` written to ``path`` about :data:`CONCAT_SLICE_BYTES` at
    a time (each input's pages and the output's let go after its slice) and mapped back
    read-only: the rows of several memory-mapped files as one array that costs memory
    only for the pages a reader touches."""
    first = arrays[0]
    shape = (sum(len(a) for a in arrays), *first.shape[1:])
    out = open_npy(path, first.dtype, shape)
    if not shape[0]:
        return out
    step = max(1, CONCAT_SLICE_BYTES // max(first[:1].nbytes, 1))
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
