"""Row copies the client's pull makes, compiled with numba (imported on first use).

:func:`take_rows` is ``out[at] = src[rows]`` in one pass over the bytes, rows as raw
bytes (one compiled kernel for every dtype and row shape). numpy has no gather that
scatters: it gathers into a temporary, then scatters it, two passes over the rows
(32k rows of 100 float32 from a 100k-row table into 65k places, one thread: 4.5 ms
against 2.8 ms here; benchmarks/README.md, "Kernels"). A plain gather is no faster
here than ``np.take``, which the client keeps for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from graphrun.jit import njit

F = TypeVar("F", bound=Callable[..., Any])


def jit(fn: F) -> F:
    """``numba.njit(nogil=True)``, cached on disk where it can be (:mod:`graphrun.jit`)."""
    return njit(fn, nogil=True)


@jit
def take_rows(src: np.ndarray, rows: np.ndarray, out: np.ndarray, at: np.ndarray) -> None:
    """``out[at[i]] = src[rows[i]]`` for ``[n, row bytes]`` uint8 views; an index out of
    range is clipped to the nearest row, as ``np.take(mode="clip")`` does."""
    width = src.shape[1]
    last_src, last_out = src.shape[0] - 1, out.shape[0] - 1
    for i in range(len(rows)):
        r = min(max(rows[i], 0), last_src)
        o = min(max(at[i], 0), last_out)
        for j in range(width):
            out[o, j] = src[r, j]
