"""The delta index's merge of two runs (:func:`graphrun.store.live_index.merge_runs`)
and sort of a fresh run (:func:`sort_columns`, for ``live_index._sorted``),
compiled with numba when imported, cached on disk as :func:`graphrun.jit.njit` says.
The merging thread imports this module when first woken (a server with a log: as it
starts, before it serves; else at the first commit) and uses it for merges of
:data:`~graphrun.store.live_index.COMPILED_MIN` entries or more (smaller ones are
numpy's; once the merging thread has loaded them, its delta's sorts and merges of any
size): a delta that takes no write never imports numba.

numpy merges two sorted runs as a stable ``argsort`` of their keys (a timsort of two
runs), then per row a concatenation and a gather: three passes over the entries and six
per row. Here it is a pass over the keys, then one over each other row, without the GIL
(the server's loop thread runs meanwhile): two runs of 640k edges, 5 rows, about 35 ms
in numpy on the loaded 2-core box (benchmarks/README.md, issue 42, ingest round 6).
"""

from __future__ import annotations

import numpy as np

from graphrun.jit import njit

#: the signatures compiled: runs in any layout (a run sorted by ``cols[:, order]`` is
#: Fortran-ordered, a merged one C-ordered: a kernel a layout would compile at ingest),
#: and C-ordered ones first (every run the merging thread makes: its unit strides make
#: :func:`_merge_two`'s row passes about 40% quicker an entry)
SIGNATURE = "void(int64[:, :], int64[:, :], int64, int64[:, :])"
C_SIGNATURE = "void(int64[:, ::1], int64[:, ::1], int64, int64[:, ::1])"


#: how many times the other run's size one of :func:`_merge_two`'s is over for a merge
#: of one pass (the rule merges runs within twice each other: rarely this lopsided)
LOPSIDED = 4


def _merge_two(a: np.ndarray, b: np.ndarray, key: int, out: np.ndarray) -> None:
    """``out`` (``[rows, na + nb]``): the columns of ``a`` and ``b`` (each sorted by row
    ``key``) in order of that row, ``a``'s first among equal keys (a stable merge).
    The key row first, noting which run each column came from, then every other row
    by those notes, one row at a time, with no branch on the keys while both runs
    last (a select and two adds: the keys of two runs of random destinations
    interleave at random, so a branch on them is mispredicted about every other
    entry): 7.5–10 against 12–14 ns an entry, rows of five, C-ordered runs of 15k to
    600k entries (benchmarks/README.md, issue 42, merge63). One run over
    :data:`LOPSIDED` times the other comes in long streaks, which a branch predicts:
    there one pass writes every row of an entry as it goes (the merge before)."""
    rows, na, nb = a.shape[0], a.shape[1], b.shape[1]
    n = na + nb
    if na > LOPSIDED * nb or nb > LOPSIDED * na:  # long streaks of one run: predicted
        i = j = 0
        for k in range(n):
            if j >= nb or (i < na and a[key, i] <= b[key, j]):
                for r in range(rows):
                    out[r, k] = a[r, i]
                i += 1
            else:
                for r in range(rows):
                    out[r, k] = b[r, j]
                j += 1
        return
    first = np.empty(n, np.uint8)  # 1 where column k of ``out`` is ``a``'s
    ka, kb, ko = a[key], b[key], out[key]
    i = j = k = 0
    while i < na and j < nb:
        x, y = ka[i], kb[j]
        t = x <= y
        ko[k] = x if t else y
        first[k] = t
        i += t
        j += 1 - t
        k += 1
    both = k  # columns taken while both runs lasted; then one run's rest
    for rest in range(i, na):
        ko[k], first[k] = ka[rest], 1
        k += 1
    for rest in range(j, nb):
        ko[k], first[k] = kb[rest], 0
        k += 1
    for r in range(rows):
        if r == key:
            continue
        x, y, o = a[r], b[r], out[r]
        i = j = 0
        for k in range(both):
            t = first[k]
            u, v = x[i], y[j]
            o[k] = u if t else v
            i += t
            j += 1 - t
        for k in range(both, n):
            if first[k]:
                o[k] = x[i]
                i += 1
            else:
                o[k] = y[j]
                j += 1


merge_two = njit(_merge_two, [C_SIGNATURE, SIGNATURE], nogil=True)

#: the bits of a key a pass of :func:`_sort_columns` places (a 2,048-slot count)
DIGIT_BITS = 11


def _sort_columns(cols: np.ndarray, key: int, out: np.ndarray) -> None:
    """``out``: the columns of ``cols`` in order of row ``key`` (non-negative), equal
    keys in their order in ``cols`` (a stable sort). A radix sort of the key less its
    lowest, :data:`DIGIT_BITS` a pass (two passes for a piece's destinations among 4M
    rows), then every row written once in that order: numpy's stable argsort and the
    gather of each row took 230 µs for a 5,000-edge piece's five rows, this ~40
    (benchmarks/README.md, issue 42, idx42)."""
    rows, n = cols.shape[0], cols.shape[1]
    if n == 0:
        return
    keys = cols[key]
    lo = hi = keys[0]
    for i in range(1, n):
        lo = min(lo, keys[i])
        hi = max(hi, keys[i])
    span = hi - lo
    mask = (1 << DIGIT_BITS) - 1
    order, spare = np.arange(n), np.empty(n, np.int64)
    rest, rest2 = keys - lo, np.empty(n, np.int64)  # the keys in ``order``, less the lowest
    count = np.empty(mask + 2, np.int64)
    shift = 0
    while shift == 0 or span >> shift > 0:
        count[:] = 0
        for i in range(n):
            count[(rest[i] >> shift & mask) + 1] += 1
        for d in range(mask + 1):
            count[d + 1] += count[d]
        for i in range(n):
            d = rest[i] >> shift & mask
            at = count[d]
            spare[at], rest2[at] = order[i], rest[i]
            count[d] = at + 1
        order, spare, rest, rest2 = spare, order, rest2, rest
        shift += DIGIT_BITS
    for r in range(rows):
        for i in range(n):
            out[r, i] = cols[r, order[i]]


#: the sort's one signature, as :data:`SIGNATURE`'s
SORT_SIGNATURE = "void(int64[:, :], int64, int64[:, :])"
sort_columns = njit(_sort_columns, SORT_SIGNATURE, nogil=True)


def warm_up() -> None:
    """One merge of two entries: the kernel is compiled (or loaded) when this module is
    imported; the merging thread calls this first, so that its first merge of a
    commit does not wait for it."""
    one = np.zeros((2, 1), np.int64)
    merge_two(one, one, 0, np.empty((2, 2), np.int64))
    sort_columns(one, 0, np.empty((2, 1), np.int64))
