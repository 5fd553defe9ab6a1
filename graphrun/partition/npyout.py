"""A partition's output ``.npy`` files written slice by slice, never whole in memory,
with :mod:`graphrun.graph.npyfile`'s :func:`open_npy` and :func:`flushed`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graphrun.graph.graph import release
from graphrun.graph.npyfile import flushed, open_npy
from graphrun.partition.relabel import LocalStructure

ROW_BYTES = 1 << 26  # feature bytes gathered at once


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
