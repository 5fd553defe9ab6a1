"""METIS through pymetis, on the symmetrised graph, in one process.

:func:`symmetric_csr` builds the undirected adjacency METIS needs (both directions,
no self loops, no duplicate edges) with numpy only: counting sorts over the edges
read slice by slice.
:func:`metis_assign` calls ``pymetis.part_graph`` with int64 buffers, which pymetis
passes to METIS without copying (its ``idx_t`` is 64 bits wide here). pymetis fixes
the number of balance constraints at one (``ncon = 1``), so balance of training
nodes and edges is reached through combined vertex weights plus a rebalancing pass
(:mod:`graphrun.partition.balance`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from graphrun.errors import ArgumentError, GraphrunError
from graphrun.graph.graph import release
from graphrun.partition.arrays import SLICE, pieces

BLOCK = 1 << 24  # sort keys held at once (int64): rows are sorted a block at a time


def _blocks(counts: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive row ranges holding at most ``BLOCK`` entries each (or one row)."""
    ends = np.append(0, np.cumsum(counts))
    out, row = [], 0
    while row < len(counts):
        last = int(np.searchsorted(ends, ends[row] + BLOCK, side="right")) - 1
        last = max(last, row + 1)
        out.append((row, last))
        row = last
    return out


def _edge_ends(
    src: np.ndarray, dst: np.ndarray, narrow: type[np.signedinteger]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The smaller and larger end of every edge that is not a self loop, slice by slice
    (a mapped file is let go of after each)."""
    for i, s in pieces(src, SLICE):
        d = dst[i : i + len(s)]
        lo = np.minimum(s, d).astype(narrow)
        hi = np.maximum(s, d).astype(narrow)
        release(dst)
        keep = lo != hi
        yield (lo, hi) if keep.all() else (lo[keep], hi[keep])


def _larger_neighbours(
    src: np.ndarray, dst: np.ndarray, num_nodes: int, narrow: type[np.signedinteger]
) -> tuple[np.ndarray, np.ndarray]:
    """``(deg, cols)``: every row's distinct larger neighbours, ascending, rows after
    rows. Rows are sorted a block at a time: ``row << bits | col`` keys of the edges in
    the block, gathered by a pass over the edges, sorted and deduplicated."""
    counts = np.zeros(num_nodes, dtype=np.int64)
    for lo, _ in _edge_ends(src, dst, narrow):
        counts += np.bincount(lo, minlength=num_nodes)
    bits = max(int(num_nodes - 1).bit_length(), 1)
    deg = np.zeros(num_nodes, dtype=np.int64)
    cols = np.empty(int(counts.sum()), dtype=narrow)  # shrunk to the distinct pairs
    written = 0
    for a, b in _blocks(counts):
        keys = np.empty(int(counts[a:b].sum()), dtype=np.int64)
        filled = 0
        for lo, hi in _edge_ends(src, dst, narrow):
            sel = (lo >= a) & (lo < b)
            k = (lo[sel].astype(np.int64) - a) << bits
            k |= hi[sel]
            keys[filled : filled + len(k)] = k
            filled += len(k)
        keys.sort()
        if len(keys) > 1:  # np.unique hashes: 6x slower here
            keys = keys[np.append(True, keys[1:] != keys[:-1])]
        deg[a:b] = np.bincount(keys >> bits, minlength=b - a)
        cols[written : written + len(keys)] = keys & ((1 << bits) - 1)
        written += len(keys)
    cols.resize(written, refcheck=False)  # shrinks in place: no copy held beside it
    return deg, cols


def _place(out: np.ndarray, keys: np.ndarray, bits: int, base: np.ndarray, row0: int) -> None:
    """Sorted ``row << bits | col`` keys (rows from ``row0``): the cols to
    ``out[base[row] + j]``, ``j`` the key's rank in its row."""
    rows = keys >> bits
    first = np.searchsorted(rows, np.arange(int(rows[-1]) + 1 if len(rows) else 0))
    pos = np.arange(len(keys), dtype=np.int64) - first[rows]
    pos += base[row0 + rows]
    out[pos] = keys & ((1 << bits) - 1)


def symmetric_csr(
    src: np.ndarray, dst: np.ndarray, num_nodes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(xadj int64[N+1], adjncy[2M])`` of the simple undirected graph (``adjncy``
    int32 when node ids fit, else int64).

    Every edge ``(s, d)`` counts once as the pair ``(min, max)`` (self loops dropped),
    so the two directions of a graph stored both ways merge; the pairs' keys ``min <<
    b | max`` are sorted and deduplicated a block of rows at a time (the edges read in
    slices, once per block): every row's larger neighbours. A row's smaller
    neighbours are the rows whose larger neighbours hold it: the keys ``max << b |
    min``, sorted a block at a time too. Nothing E-long but the distinct pairs' larger
    ends and the result is held.
    """
    bits = max(int(num_nodes - 1).bit_length(), 1)
    if 2 * bits > 62:
        raise ArgumentError(f"num_nodes: {num_nodes} nodes are too many for METIS input keys")
    narrow = np.int32 if num_nodes < 1 << 31 else np.int64
    f_deg, f_col = _larger_neighbours(src, dst, num_nodes, narrow)
    r_deg = np.bincount(f_col, minlength=num_nodes)
    xadj = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(f_deg + r_deg, out=xadj[1:])
    adjncy = np.empty(int(xadj[-1]), dtype=narrow)
    f_ptr = np.append(0, np.cumsum(f_deg))
    # a row's larger neighbours after its smaller ones, in their order
    for i in range(0, len(f_col), SLICE):
        cols = f_col[i : i + SLICE]
        entries = np.arange(i, i + len(cols), dtype=np.int64)
        rows = np.searchsorted(f_ptr, entries, side="right") - 1
        entries += (xadj[:-1] + r_deg - f_ptr[:-1])[rows]
        adjncy[entries] = cols
    for a, b in _blocks(r_deg):
        keys = np.empty(int(r_deg[a:b].sum()), dtype=np.int64)
        filled = 0
        for i in range(0, len(f_col), SLICE):
            cols = f_col[i : i + SLICE]
            sel = np.flatnonzero((cols >= a) & (cols < b))
            rows = np.searchsorted(f_ptr[1:], i + sel, side="right")
            k = (cols[sel].astype(np.int64) - a) << bits
            k |= rows
            keys[filled : filled + len(k)] = k
            filled += len(k)
        keys.sort()
        _place(adjncy, keys, bits, xadj, a)
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
