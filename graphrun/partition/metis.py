"""METIS through pymetis, on the symmetrised graph, in one process.

:func:`symmetric_csr` builds the undirected adjacency METIS needs (both directions,
no self loops, no duplicate edges) with numpy only: one sort of ``u * N + v`` keys.
:func:`metis_assign` calls ``pymetis.part_graph`` with int64 buffers, which pymetis
passes to METIS without copying (its ``idx_t`` is 64 bits wide here). pymetis fixes
the number of balance constraints at one (``ncon = 1``), so balance of training
nodes and edges is reached through combined vertex weights plus a rebalancing pass
(:mod:`graphrun.partition.balance`).
"""

from __future__ import annotations

import numpy as np

from graphrun.errors import ArgumentError, GraphrunError


def symmetric_csr(
    src: np.ndarray, dst: np.ndarray, num_nodes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(xadj int64[N+1], adjncy int64[2M])`` of the simple undirected graph."""
    n = np.int64(num_nodes)
    keep = src != dst
    s = src[keep] if not keep.all() else np.asarray(src)
    d = dst[keep] if not keep.all() else np.asarray(dst)
    keys = np.empty(2 * len(s), dtype=np.int64)
    np.multiply(s, n, out=keys[: len(s)])
    keys[: len(s)] += d
    np.multiply(d, n, out=keys[len(s) :])
    keys[len(s) :] += s
    del s, d, keep
    keys.sort()
    if len(keys):
        fresh = np.empty(len(keys), dtype=bool)
        fresh[0] = True
        np.not_equal(keys[1:], keys[:-1], out=fresh[1:])
        keys = keys[fresh]
        del fresh
    rows = keys // n
    keys -= rows * n  # keys now hold the column of every entry
    xadj = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=num_nodes), out=xadj[1:])
    return xadj, keys


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

    n = len(xadj) - 1
    if num_parts < 1 or num_parts > max(n, 1):
        raise ArgumentError(f"num_parts: {num_parts} is not in [1, {n}] (the node count)")
    if num_parts == 1 or n == 0:
        return np.zeros(n, dtype=np.int64)
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
