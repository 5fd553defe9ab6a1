"""Relabelling: from a node -> partition assignment to contiguous new ids.

New node ids are ordered by (partition, node type, original id). Because a
:class:`~graphrun.graph.Graph` keeps the nodes of one type contiguous in original id
order, that is simply a stable sort by partition. Edges belong to the partition of
their destination and are ordered by (owner, edge type, original id), again a
stable sort by owner. The in-edges of every node, in new ids, form one global CSC
(:attr:`Relabelling.indptr` over new destination ids, :attr:`Relabelling.csc_order`
the original edge ids in that order), from which every partition's structure
(owned nodes plus halo) is cut out by :func:`local_structure`.

Sorting uses LSD radix passes over 16-bit digits (numpy's stable sort is a radix
sort for 16-bit keys), so relabelling is linear in the number of edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphrun.graph import Graph
from graphrun.partition.arrays import SLICE, stable_argsort
from graphrun.partition.book import PartitionBook


def _inverse(perm: np.ndarray) -> np.ndarray:
    inv = np.empty_like(perm)
    for i in range(0, len(perm), SLICE):  # in slices: no E-long arange
        p = perm[i : i + SLICE]
        inv[p] = np.arange(i, i + len(p), dtype=perm.dtype)
    return inv


def _ranges(owner: np.ndarray, type_offsets: np.ndarray, num_parts: int) -> np.ndarray:
    """[T, P+1] per-type boundaries: type t's ids owned by parts < p."""
    rows = []
    for t in range(len(type_offsets) - 1):
        seg = owner[type_offsets[t] : type_offsets[t + 1]]
        rows.append(np.concatenate([[0], np.cumsum(np.bincount(seg, minlength=num_parts))]))
    return np.asarray(rows, dtype=np.int64).reshape(len(type_offsets) - 1, num_parts + 1)


@dataclass(frozen=True, eq=False)
class Relabelling:
    """The id mappings both ways, the partition book and the global CSC in new ids."""

    book: PartitionBook
    orig_nids: np.ndarray  # new homogeneous node id -> original id
    new_nids: np.ndarray  # original -> new
    orig_eids: np.ndarray
    new_eids: np.ndarray
    indptr: np.ndarray  # [N+1] over new destination ids
    csc_order: np.ndarray  # [E] original edge ids, grouped by new destination id

    def node_block(self, part: int, t: int) -> tuple[int, int]:
        """Homogeneous new ids of the nodes of type index ``t`` owned by ``part``."""
        return self.book.node_type_block(part, self.book.node_types[t])

    def edge_block(self, part: int, r: int) -> tuple[int, int]:
        return self.book.edge_type_block(part, self.book.edge_types[r])


def relabel(graph: Graph, part: np.ndarray, num_parts: int) -> Relabelling:
    """Relabel ``graph`` for the assignment ``part`` (int, one entry per node)."""
    small = np.int16 if num_parts < 1 << 15 else np.int32
    part = part.astype(small, copy=False)
    nto = graph.node_type_offsets
    eto = graph.edge_type_offsets
    assert nto is not None and eto is not None  # set by Graph.__post_init__
    orig_nids = stable_argsort(part, num_parts)
    new_nids = _inverse(orig_nids)
    node_counts = np.bincount(part, minlength=num_parts)
    # the global CSC first, while it is the only E-long result: its sort is the peak
    narrow = np.int32 if graph.num_nodes < 1 << 31 else np.int64
    new_dst = new_nids.astype(narrow)[graph.dst]  # int32: half the sort's input
    csc_order = stable_argsort(new_dst, graph.num_nodes)
    indptr = np.zeros(graph.num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(new_dst, minlength=graph.num_nodes), out=indptr[1:])
    del new_dst
    owner = part[graph.dst]
    orig_eids = stable_argsort(owner, num_parts)
    new_eids = _inverse(orig_eids)
    edge_counts = np.bincount(owner, minlength=num_parts)
    book = PartitionBook(
        num_parts=num_parts,
        node_types=graph.node_types,
        edge_types=graph.edge_types,
        node_offsets=np.concatenate([[0], np.cumsum(node_counts)]),
        edge_offsets=np.concatenate([[0], np.cumsum(edge_counts)]),
        node_ranges_all=_ranges(part, nto, num_parts),
        edge_ranges_all=_ranges(owner, eto, num_parts),
    )
    del owner
    return Relabelling(book, orig_nids, new_nids, orig_eids, new_eids, indptr, csc_order)


@dataclass(frozen=True, eq=False)
class LocalStructure:
    """One partition's CSC: inner nodes first, then halo nodes hop by hop."""

    nodes: np.ndarray  # int64 [n_local] new global ids
    indptr: np.ndarray  # int64 [n_local+1]
    orig_eids: np.ndarray  # int64 [e_local] original ids of the in-edges, CSC order
    num_inner: int


def _segments(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the CSC entries of ``rows`` (concatenated) and their counts."""
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    offs = np.cumsum(counts) - counts
    pos = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(starts - offs, counts)
    return pos, counts


def local_structure(graph: Graph, rl: Relabelling, part: int, halo_hops: int) -> LocalStructure:
    a, b = rl.book.owned_nodes(part)
    lo, hi = int(rl.indptr[a]), int(rl.indptr[b])
    inner = np.arange(a, b, dtype=np.int64)
    eid_chunks = [rl.csc_order[lo:hi]]
    count_chunks = [np.diff(rl.indptr[a : b + 1])]
    node_chunks = [inner]
    if halo_hops >= 1:
        seen = np.zeros(graph.num_nodes, dtype=bool)
        seen[a:b] = True
        frontier_eids = eid_chunks[0]
        for hop in range(1, halo_hops + 1):
            fresh = np.zeros(graph.num_nodes, dtype=bool)
            fresh[rl.new_nids[graph.src[frontier_eids]]] = True
            fresh &= ~seen
            halo = np.flatnonzero(fresh)
            if len(halo) == 0:
                break
            seen |= fresh
            node_chunks.append(halo)
            if hop < halo_hops:  # these halo rows carry their in-edges
                pos, counts = _segments(rl.indptr, halo)
                frontier_eids = rl.csc_order[pos]
                eid_chunks.append(frontier_eids)
            else:
                counts = np.zeros(len(halo), dtype=np.int64)
            count_chunks.append(counts)
    counts = np.concatenate(count_chunks)
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return LocalStructure(
        nodes=np.concatenate(node_chunks),
        indptr=indptr,
        orig_eids=np.concatenate(eid_chunks),
        num_inner=b - a,
    )
