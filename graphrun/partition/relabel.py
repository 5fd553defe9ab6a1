"""Relabelling: from a node -> partition assignment to contiguous new ids.

New node ids are ordered by (partition, node type, original id). Because a
:class:`~graphrun.graph.Graph` keeps the nodes of one type contiguous in original id
order, that is simply a stable sort by partition. Edges belong to the partition of
their destination and are ordered by (owner, edge type, original id), which is
(owner, original id): a counting sort by owner, so an edge's new id follows from the
edges before it (:func:`edge_numbers`, one pass over the edges in slices).

Nothing E-long is held: :func:`relabel` keeps the node maps (N-long) and the
partition book; the edge maps are written as they are computed
(:func:`write_edge_maps`), and a partition's structure (owned nodes plus halo,
:func:`local_structure`) is gathered by a pass over the edges that keeps the in-edges
of its rows only, put in CSC order by one sort of ``row << b | position`` keys.
Edges are read slice by slice, and a memory-mapped graph lets go of each slice's
pages (:func:`graphrun.partition.arrays.pieces`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from graphrun.graph import Graph
from graphrun.graph.graph import release
from graphrun.partition.arrays import SLICE, group_ranks, pieces, stable_argsort
from graphrun.partition.book import PartitionBook


def _inverse(perm: np.ndarray) -> np.ndarray:
    inv = np.empty_like(perm)
    for i in range(0, len(perm), SLICE):  # in slices: no N-long arange
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


def _bits(n: int) -> int:
    return max(int(n).bit_length(), 1)


@dataclass(frozen=True, eq=False)
class Relabelling:
    """The node id maps both ways, the assignment and the partition book."""

    book: PartitionBook
    orig_nids: np.ndarray  # new homogeneous node id -> original id
    new_nids: np.ndarray  # original -> new
    part: np.ndarray  # the part of every original node (int16 or int32)
    in_degree: np.ndarray  # [N] by new id

    def node_block(self, part: int, t: int) -> tuple[int, int]:
        """Homogeneous new ids of the nodes of type index ``t`` owned by ``part``."""
        return self.book.node_type_block(part, self.book.node_types[t])

    def edge_block(self, part: int, r: int) -> tuple[int, int]:
        return self.book.edge_type_block(part, self.book.edge_types[r])


def relabel(graph: Graph, part: np.ndarray, num_parts: int) -> Relabelling:
    """Relabel ``graph`` for the assignment ``part`` (int, one entry per node)."""
    small = np.int16 if num_parts < 1 << 15 else np.int32
    part = part.astype(small, copy=False)
    nto, eto = graph.node_type_offsets, graph.edge_type_offsets
    assert nto is not None and eto is not None  # set by Graph.__post_init__
    orig_nids = stable_argsort(part, num_parts)
    new_nids = _inverse(orig_nids)
    in_degree = np.zeros(graph.num_nodes, dtype=np.int64)
    by_type = np.zeros((len(eto) - 1, num_parts), dtype=np.int64)  # owned edges per type
    for i, d in pieces(graph.dst):
        in_degree += np.bincount(d, minlength=graph.num_nodes)
        owner = part[d]
        for r in range(len(eto) - 1):
            lo, hi = max(int(eto[r]), i), min(int(eto[r + 1]), i + len(d))
            if lo < hi:
                by_type[r] += np.bincount(owner[lo - i : hi - i], minlength=num_parts)
    edge_ranges = np.zeros((len(eto) - 1, num_parts + 1), dtype=np.int64)
    np.cumsum(by_type, axis=1, out=edge_ranges[:, 1:])
    book = PartitionBook(
        num_parts=num_parts,
        node_types=graph.node_types,
        edge_types=graph.edge_types,
        node_offsets=np.concatenate([[0], np.cumsum(np.bincount(part, minlength=num_parts))]),
        edge_offsets=np.concatenate([[0], np.cumsum(by_type.sum(axis=0))]),
        node_ranges_all=_ranges(part, nto, num_parts),
        edge_ranges_all=edge_ranges,
    )
    return Relabelling(book, orig_nids, new_nids, part, in_degree[orig_nids])


FEW_PARTS = 16  # up to this many parts, edges are numbered part by part (no sort)


def edge_numbers(graph: Graph, rl: Relabelling) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, new ids)`` of the edges ``start ..``, slice by slice in original order:
    an edge's new id is its owner's first plus the number of the owner's edges before
    it."""
    offsets, parts = rl.book.edge_offsets, rl.book.num_parts
    fill = np.zeros(parts, dtype=np.int64)
    for i, d in pieces(graph.dst):
        owner = rl.part[d]
        new = np.empty(len(d), dtype=np.int64)
        if parts <= FEW_PARTS:
            for q in range(parts):
                mine = np.flatnonzero(owner == q)
                new[mine] = np.arange(len(mine)) + (offsets[q] + fill[q])
                fill[q] += len(mine)
        else:
            order = stable_argsort(owner, parts)
            k = owner[order]
            new[order] = offsets[k] + fill[k] + group_ranks(k)
            fill += np.bincount(owner, minlength=parts)
        yield i, new


def write_edge_maps(
    graph: Graph, rl: Relabelling, orig_eids: np.ndarray, new_eids: np.ndarray
) -> None:
    """Fill ``orig_eids`` (new edge id -> original) and ``new_eids`` (original -> new),
    E-long arrays (or memory-mapped output files: each slice is flushed and let go of)."""
    for i, new in edge_numbers(graph, rl):
        new_eids[i : i + len(new)] = new
        orig_eids[new] = np.arange(i, i + len(new), dtype=np.int64)
        for out in (orig_eids, new_eids):
            if isinstance(out, np.memmap):
                out.flush()
                release(out)


@dataclass(frozen=True, eq=False)
class EdgeRows:
    """The in-edges of some rows, gathered in original order: position ``order[j]``
    of ``src`` / ``eids`` / ``orig`` (new source id, new edge id, original id) is the
    ``j``-th edge in CSC order (by row, then original id). The in-edges of a part's
    own nodes are its edges in new id order: ``eids`` is None, position ``k`` is new
    id ``first_eid + k``."""

    order: np.ndarray
    src: np.ndarray
    orig: np.ndarray
    eids: np.ndarray | None = None
    first_eid: int = 0

    def csc(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Entries ``lo .. hi`` of the column ``name`` in CSC order (int64)."""
        pos = self.order[lo:hi]
        if name == "eids" and self.eids is None:
            return pos + self.first_eid
        return np.asarray(getattr(self, name)[pos], dtype=np.int64)


def _gather(
    graph: Graph, rl: Relabelling, rows: np.ndarray, part: int | None
) -> Iterator[tuple[slice, np.ndarray, np.ndarray, np.ndarray | None]]:
    """``(edges, positions in them, row of each, new ids or None)`` of the edges of
    every slice whose destination is one of ``rows`` (``part``: that part's own
    nodes)."""
    if part is not None:
        a = rl.book.owned_nodes(part)[0]
        for i, d in pieces(graph.dst):
            sel = np.flatnonzero(rl.part[d] == part)
            yield slice(i, i + len(d)), sel, rl.new_nids[d[sel]] - a, None
        return
    slot = np.full(graph.num_nodes, -1, dtype=np.int64)
    slot[rows] = np.arange(len(rows))
    for i, new in edge_numbers(graph, rl):
        edges = slice(i, i + len(new))
        row = slot[rl.new_nids[graph.dst[edges]]]
        sel = np.flatnonzero(row >= 0)
        yield edges, sel, row[sel], new[sel]


def in_edges(
    graph: Graph, rl: Relabelling, rows: np.ndarray, part: int | None = None
) -> tuple[np.ndarray, EdgeRows]:
    """``(counts, edges)``: the in-edges of the new ids ``rows`` (increasing; with
    ``part``, that part's own nodes), from one pass over the edges keeping theirs."""
    n, e = graph.num_nodes, graph.num_edges
    node_t = np.int32 if n < 1 << 31 else np.int64
    edge_t = np.int32 if e < 1 << 31 else np.int64
    total = int(rl.in_degree[rows].sum())
    shift = _bits(total)
    keys = np.empty(total, dtype=np.int64)  # row << shift | position: < 2**62 (ids < 2**31)
    src = np.empty(total, dtype=node_t)
    orig = np.empty(total, dtype=edge_t)
    eids = None if part is not None else np.empty(total, dtype=edge_t)
    filled = 0
    for edges, sel, row, new in _gather(graph, rl, rows, part):
        end = filled + len(sel)
        keys[filled:end] = (row << shift) | np.arange(filled, end)
        src[filled:end] = rl.new_nids[graph.src[edges][sel]]
        release(graph.src)
        orig[filled:end] = sel + edges.start
        if eids is not None and new is not None:
            eids[filled:end] = new
        filled = end
    keys.sort()
    counts = np.bincount(keys >> shift, minlength=len(rows))
    keys &= (1 << shift) - 1  # now the positions, in CSC order
    first = rl.book.owned_edges(part)[0] if part is not None else 0
    return counts, EdgeRows(keys, src, orig, eids, first)


@dataclass(frozen=True, eq=False)
class LocalStructure:
    """One partition's CSC: inner nodes first, then halo nodes hop by hop; the in-edges
    of its rows in ``edges`` (the inner rows', then those of each hop that has some)."""

    nodes: np.ndarray  # int64 [n_local] new global ids
    indptr: np.ndarray  # int64 [n_local+1]
    edges: list[EdgeRows]
    num_inner: int

    def column(self, name: str) -> Iterator[np.ndarray]:
        """The column ``name`` of every local edge in CSC order, slice by slice."""
        for chunk in self.edges:
            for lo in range(0, len(chunk.order), SLICE):
                yield chunk.csc(name, lo, lo + SLICE)

    @property
    def num_edges(self) -> int:
        return sum(len(c.order) for c in self.edges)

    @property
    def orig_eids(self) -> np.ndarray:
        """Original ids of the in-edges in CSC order (int64)."""
        return np.concatenate([np.zeros(0, np.int64), *self.column("orig")])


def local_structure(graph: Graph, rl: Relabelling, part: int, halo_hops: int) -> LocalStructure:
    a, b = rl.book.owned_nodes(part)
    counts, inner = in_edges(graph, rl, np.arange(a, b, dtype=np.int64), part)
    edge_chunks, count_chunks = [inner], [counts]
    node_chunks = [np.arange(a, b, dtype=np.int64)]
    if halo_hops >= 1:
        seen = np.zeros(graph.num_nodes, dtype=bool)
        seen[a:b] = True
        frontier = inner.src
        for hop in range(1, halo_hops + 1):
            fresh = np.zeros(graph.num_nodes, dtype=bool)
            fresh[frontier] = True
            fresh &= ~seen
            halo = np.flatnonzero(fresh)
            del fresh
            if len(halo) == 0:
                break
            seen[halo] = True
            node_chunks.append(halo)
            if hop < halo_hops:  # these halo rows carry their in-edges
                counts, got = in_edges(graph, rl, halo)
                edge_chunks.append(got)
                frontier = got.src
            else:
                counts = np.zeros(len(halo), dtype=np.int64)
            count_chunks.append(counts)
    counts = np.concatenate(count_chunks)
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return LocalStructure(
        nodes=np.concatenate(node_chunks), indptr=indptr, edges=edge_chunks, num_inner=b - a
    )
