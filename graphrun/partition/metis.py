"""METIS through pymetis, on the symmetrised graph, in one process.

:func:`symmetric_csr` builds the undirected adjacency METIS needs (both directions,
no self loops, no duplicate edges) with numpy only: sorts of ``min << b | max`` keys.
:func:`metis_assign` calls ``pymetis.part_graph`` with int64 buffers, which pymetis
passes to METIS without copying (its ``idx_t`` is 64 bits wide here). pymetis fixes
the number of balance constraints at one (``ncon = 1``), so balance of training
nodes and edges is reached through combined vertex weights plus a rebalancing pass
(:mod:`graphrun.partition.balance`).
"""

from __future__ import annotations

import numpy as np

from graphrun.errors import ArgumentError, GraphrunError
from graphrun.partition.arrays import SLICE


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    keys.sort()
    if len(keys) < 2:
        return keys
    fresh = np.empty(len(keys), dtype=bool)
    fresh[0] = True
    np.not_equal(keys[1:], keys[:-1], out=fresh[1:])
    return keys[fresh]


def _row_starts(rows: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Degree of every row and the index of its first entry, for entries sorted by row."""
    deg = np.bincount(rows, minlength=num_nodes)
    return deg, np.cumsum(deg) - deg


def _scatter(out: np.ndarray, rows: np.ndarray, cols: np.ndarray, base: np.ndarray) -> None:
    for i in range(0, len(rows), SLICE):
        r = rows[i : i + SLICE]
        out[np.arange(i, i + len(r), dtype=np.int64) + base[r]] = cols[i : i + SLICE]


def symmetric_csr(
    src: np.ndarray, dst: np.ndarray, num_nodes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(xadj int64[N+1], adjncy int64[2M])`` of the simple undirected graph.

    Every edge becomes the key ``min << b | max`` (``b`` bits hold a node id; self
    loops dropped); one sort and a diff remove duplicates, which also merges the two
    directions of a graph stored both ways, so the sort is over E keys, not 2E. The
    same pairs sorted by ``max << b | min`` give every row's smaller neighbours; a
    row's adjacency is its smaller neighbours, then its larger ones, placed by
    vectorised scatters.
    """
    bits = max(int(num_nodes - 1).bit_length(), 1)
    if 2 * bits > 62:
        raise ArgumentError(f"num_nodes: {num_nodes} nodes are too many for METIS input keys")
    shift, mask = np.int64(bits), np.int64((1 << bits) - 1)
    keys = np.empty(len(src), dtype=np.int64)  # min << bits | max, built in slices
    loops, step = 0, SLICE
    for i in range(0, len(src), step):
        s = np.asarray(src[i : i + step], dtype=np.int64)
        d = np.asarray(dst[i : i + step], dtype=np.int64)
        np.left_shift(np.minimum(s, d), shift, out=keys[i : i + len(s)])
        keys[i : i + len(s)] |= np.maximum(s, d)
        loops += int(np.count_nonzero(s == d))
    if loops:
        keys = keys[(keys >> shift) != (keys & mask)]
    fwd = _sorted_unique(keys)  # keys lo << bits | hi, sorted by (lo, hi)
    del keys
    m = len(fwd)
    narrow = np.int32 if bits <= 31 else np.int64  # rows and columns: half the memory
    f_row = (fwd >> shift).astype(narrow)
    f_col = (fwd & mask).astype(narrow)
    del fwd
    rev = f_col.astype(np.int64) << shift  # keys hi << bits | lo
    np.bitwise_or(rev, f_row, out=rev)
    rev.sort()
    r_row = (rev >> shift).astype(narrow)
    r_col = (rev & mask).astype(narrow)
    del rev
    f_deg, f_first = _row_starts(f_row, num_nodes)
    r_deg, r_first = _row_starts(r_row, num_nodes)
    xadj = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(f_deg + r_deg, out=xadj[1:])
    adjncy = np.empty(2 * m, dtype=np.int64)
    # a row's smaller neighbours first, then its larger ones; entry i of a row-sorted
    # list goes to i + base[row] (scattered in slices: no full-length temporaries)
    _scatter(adjncy, r_row, r_col, xadj[:-1] - r_first)
    del r_row, r_col
    _scatter(adjncy, f_row, f_col, xadj[:-1] + r_deg - f_first)
    return xadj, adjncy


def trivial_parts(xadj: np.ndarray, num_parts: int) -> np.ndarray | None:
    """Every vertex's part when there is nothing to partition (one part, no vertices),
    else None; ArgumentError when ``num_parts`` is not in ``[1, n]`` (any partitioner's
    check, METIS's and KaMinPar's)."""
    n = len(xadj) - 1
    if num_parts < 1 or num_parts > max(n, 1):
        raise ArgumentError(f"num_parts: {num_parts} is not in [1, {n}] (the node count)")
    if num_parts == 1 or n == 0:
        return np.zeros(n, dtype=np.int64)
    return None


def metis_assign(
    xadj: np.ndarray,
    adjncy: np.ndarray,
    num_parts: int,
    *,
    vweights: np.ndarray | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Partition id (int64) of every vertex, by METIS (recursive bisection up to 8 parts)."""
    import pymetis

    if (trivial := trivial_parts(xadj, num_parts)) is not None:
        return trivial
    dtype = np.dtype(getattr(pymetis, "zero_copy_dtype", lambda: np.int64)())
    opts = pymetis.Options(seed=int(seed))
    try:
        _, parts = pymetis.part_graph(
            num_parts,
            adjacency=pymetis.CSRAdjacency(
                np.ascontiguousarray(xadj, dtype=dtype), np.ascontiguousarray(adjncy, dtype=dtype)
            ),
            vweights=None if vweights is None else np.ascontiguousarray(vweights, dtype=dtype),
            options=opts,
        )
    except (RuntimeError, ValueError, MemoryError) as exc:
        raise GraphrunError(f"METIS failed to partition the graph: {exc}") from exc
    return np.asarray(parts, dtype=np.int64)
