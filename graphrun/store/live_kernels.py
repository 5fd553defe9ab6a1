"""The delta index's merge of two runs (:func:`graphrun.store.live_index.merge_runs`),
compiled with numba when imported, cached on disk as :func:`graphrun.jit.njit` says.
The merging thread imports this module when first woken (a server with a log: as it
starts, before it serves; else at the first commit) and uses it for merges of
:data:`~graphrun.store.live_index.COMPILED_MIN` entries or more (smaller ones are
numpy's): a delta that takes no write never imports numba.

numpy merges two sorted runs as a stable ``argsort`` of their keys (a timsort of two
runs), then per row a concatenation and a gather: three passes over the entries and six
per row. Here it is one pass that writes every row of an entry as it goes, without the
GIL (the server's loop thread runs meanwhile): two runs of 640k edges, 5 rows, about 35
ms in numpy on the loaded 2-core box (benchmarks/README.md, issue 42, ingest round 6).
"""

from __future__ import annotations

import numpy as np

from graphrun.jit import njit

#: the one signature compiled: runs in any layout (a run sorted by ``cols[:, order]`` is
#: Fortran-ordered, a merged one C-ordered: a kernel a layout would compile at ingest)
SIGNATURE = "void(int64[:, :], int64[:, :], int64, int64[:, :])"


def _merge_two(a: np.ndarray, b: np.ndarray, key: int, out: np.ndarray) -> None:
    """``out`` (``[rows, na + nb]``): the columns of ``a`` and ``b`` (each sorted by row
    ``key``) in order of that row, ``a``'s first among equal keys (a stable merge)."""
    rows, na, nb = a.shape[0], a.shape[1], b.shape[1]
    i = j = 0
    for k in range(na + nb):
        if j >= nb or (i < na and a[key, i] <= b[key, j]):
            for r in range(rows):
                out[r, k] = a[r, i]
            i += 1
        else:
            for r in range(rows):
                out[r, k] = b[r, j]
            j += 1


merge_two = njit(_merge_two, SIGNATURE, nogil=True)


def warm_up() -> None:
    """One merge of two entries: the kernel is compiled (or loaded) when this module is
    imported; the merging thread calls this first, so that its first merge of a
    commit does not wait for it."""
    one = np.zeros((2, 1), np.int64)
    merge_two(one, one, 0, np.empty((2, 2), np.int64))
