"""The distributed mode after the assignment: new ids, the shuffle, one part per rank.

Rank ``r`` read the original nodes ``node_bounds[r] ..`` and edges ``edge_bounds[r] ..``
(its chunks) and knows the part of each of its nodes. Then, with collectives only:

1. **New ids** (:func:`relabel_share`): counts per (part, type) are all-gathered, so
   every rank knows the partition book and where its own nodes land inside each
   (part, type) block — after those of lower ranks, in original id order: the same
   ids :mod:`graphrun.partition.relabel` gives on one machine. Edge endpoints get
   their new ids from the nodes' owners (:meth:`Comm.fetch`); an edge belongs to the
   part of its destination and is numbered the same way.
2. **Shuffle** (:func:`shuffle_share`): node ids, node feature rows, edges and edge
   feature rows go to the rank of their part, ids in one exchange each, feature rows
   in rounds of bounded bytes. Rows arrive in rank order, which is new id order inside
   every (part, type) block. Ids travel as int32 where every id fits.
3. **Structure** (:func:`local_structure`): rank ``p`` sorts its edges into the CSC of
   its inner nodes; halo nodes are found hop by hop, and for ``halo_hops >= 2`` their
   in-edges are asked of their owners (the same rows and order as the one-machine
   writer).
4. **Write** (:func:`write_part`): ``part-p/`` in the format of
   :mod:`graphrun.partition.format`, plus this rank's id-mapping shards
   (``mapping/part-p/``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphrun.graph.chunked import Chunk, ChunkedMeta
from graphrun.graph.graph import release
from graphrun.names import etype_key, owners
from graphrun.partition.arrays import stable_argsort, unique
from graphrun.partition.book import PartitionBook
from graphrun.partition.comm import Comm, by_rank, rank_order
from graphrun.partition.format import MAPPING_DIR
from graphrun.partition.quality import Quality, max_over_mean


@dataclass(frozen=True, eq=False)
class Share:
    """What rank ``comm.rank`` read: ``chunk`` holds the nodes ``node_bounds[rank] ..``
    and edges ``edge_bounds[rank] ..`` of the dataset ``meta``."""

    meta: ChunkedMeta
    chunk: Chunk
    node_bounds: np.ndarray  # [world+1]
    edge_bounds: np.ndarray  # [world+1]

    def node_types(self) -> np.ndarray:
        """Type id of every node of this share."""
        a, b = self.chunk.nodes
        return owners(self.meta.node_type_offsets, np.arange(a, b))

    def edge_types(self) -> np.ndarray:
        c, e = self.chunk.edges
        return owners(self.meta.edge_type_offsets, np.arange(c, e))


def _number(
    comm: Comm, part: np.ndarray, typ: np.ndarray, types: int, parts: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """New ids of items ordered by (part, type, rank, position), and the book's
    ``offsets [P+1]`` and ``ranges [T, P+1]``."""
    key = part * types + typ
    counts = np.bincount(key, minlength=parts * types).reshape(parts, types)
    every = comm.allgather(counts)  # [W, P, T]
    total = every.sum(axis=0)
    offsets = np.concatenate([[0], np.cumsum(total.sum(axis=1))]).astype(np.int64)
    ranges = np.zeros((types, parts + 1), dtype=np.int64)
    np.cumsum(total.T, axis=1, out=ranges[:, 1:])
    start = offsets[:-1, None] + np.cumsum(total, axis=1) - total  # [P, T] block starts
    start = (start + every[: comm.rank].sum(axis=0)).reshape(-1)
    order = stable_argsort(key, parts * types)
    sorted_key = key[order]
    first = np.searchsorted(sorted_key, np.arange(parts * types))
    new = np.empty(len(key), dtype=np.int64)
    new[order] = start[sorted_key] + np.arange(len(key)) - first[sorted_key]
    return new, offsets, ranges


@dataclass(eq=False)
class Relabelled:
    book: PartitionBook
    new_nids: np.ndarray  # of this share's nodes
    new_src: np.ndarray  # of this share's edges (emptied once the shuffle has sent them)
    new_dst: np.ndarray
    new_eids: np.ndarray


def id_type(meta: ChunkedMeta) -> type[np.signedinteger]:
    """int32 where every node and edge id fits (half the bytes of the E-long arrays and
    of the edge rows shuffled), else int64; the files hold int64 either way."""
    return np.int32 if max(meta.num_nodes, meta.num_edges) < 1 << 31 else np.int64


def relabel_share(comm: Comm, share: Share, part: np.ndarray, parts: int) -> Relabelled:
    meta = share.meta
    ntypes = share.node_types()
    new_nids, noffsets, nranges = _number(comm, part, ntypes, len(meta.node_types), parts)
    new_nids = new_nids.astype(id_type(meta))
    del ntypes
    # asked a round at a time (the endpoints may be memory-mapped), as int32 where ids fit
    new_src = comm.fetch(share.node_bounds, share.chunk.src, new_nids)
    new_dst = comm.fetch(share.node_bounds, share.chunk.dst, new_nids)
    owner = owners(noffsets, new_dst)
    new_eids, eoffsets, eranges = _number(
        comm, owner, share.edge_types(), len(meta.edge_types), parts
    )
    new_eids = new_eids.astype(id_type(meta))
    book = PartitionBook(
        num_parts=parts,
        node_types=meta.node_types,
        edge_types=meta.edge_types,
        node_offsets=noffsets,
        edge_offsets=eoffsets,
        node_ranges_all=nranges,
        edge_ranges_all=eranges,
    )
    return Relabelled(book, new_nids, new_src, new_dst, new_eids)


def measure_share(
    comm: Comm, rl: Relabelled, part: np.ndarray, train: np.ndarray | None
) -> Quality:
    """Edge cut and balance over all ranks (as :func:`graphrun.partition.quality.measure`)."""
    book = rl.book
    local_cut = np.count_nonzero(
        owners(book.node_offsets, rl.new_src) != owners(book.node_offsets, rl.new_dst)
    )
    trains = np.bincount(part[train], minlength=book.num_parts) if train is not None else None
    sums = comm.allreduce_sum(
        np.concatenate(
            [[local_cut], trains if trains is not None else np.zeros(book.num_parts)]
        ).astype(np.int64)
    )
    has_train = comm.allreduce_sum(np.array([train is not None and train.any()], np.int64))[0]
    edges = np.diff(book.edge_offsets)
    return Quality(
        edge_cut=int(sums[0]) / book.num_edges if book.num_edges else 0.0,
        node_balance=max_over_mean(np.diff(book.node_offsets)),
        edge_balance=max_over_mean(edges),
        train_balance=max_over_mean(sums[1:]) if has_train else None,
        num_cut_edges=int(sums[0]),
    )


@dataclass(frozen=True, eq=False)
class Received:
    """What rank ``p`` holds after the shuffle: its owned nodes and their in-edges."""

    orig_nids: np.ndarray  # original id of every owned node, by new id
    orig_eids: np.ndarray  # original id of every owned edge, by new id
    edges: np.ndarray  # [e, 3] (dst, src, eid) new ids (int32 where they fit), CSC order
    node_feats: dict[str, dict[str, np.ndarray]]
    edge_feats: dict[str, dict[str, np.ndarray]]


def _send_rows(comm: Comm, dest: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``rows`` to rank ``dest`` (stable inside a destination); all received, in rank
    order. In rounds of at most ``comm.round_bytes`` sent, each round's rows gathered from
    ``rows`` (memory-mapped: let go of after each) and placed in the result as they
    arrive, so no sorted copy of the rows and no second copy of what arrives is held."""
    order, cuts = rank_order(dest, comm.world)
    counts = np.diff(cuts)
    every = comm.allgather(counts)  # [from, to]: the same rounds on every rank
    mine = every[:, comm.rank]
    out = np.empty((int(mine.sum()), *rows.shape[1:]), dtype=rows.dtype)
    starts = np.cumsum(mine) - mine
    row_bytes = max(int(np.prod(rows.shape[1:], dtype=np.int64)) * rows.dtype.itemsize, 1)
    step = comm.step(row_bytes * comm.world)
    rounds = -(-int(every.max()) // step) if every.size else 0
    for k in range(max(rounds, 1)):  # one round at least: empty rows still meet
        lo, hi = np.minimum(k * step, counts), np.minimum((k + 1) * step, counts)
        sends = [
            np.asarray(rows[order[cuts[q] + lo[q] : cuts[q] + hi[q]]]) for q in range(comm.world)
        ]
        release(rows)
        for q, got in enumerate(comm.exchange(sends)):
            at = int(starts[q]) + k * step
            out[at : at + len(got)] = got
    return out


def _send_features(
    comm: Comm,
    dest: np.ndarray,
    first: int,
    type_offsets: np.ndarray,
    keys: Sequence[str],
    data: dict[str, dict[str, np.ndarray]],
) -> dict[str, dict[str, np.ndarray]]:
    """Every feature row of the chunk's nodes (or edges) ``first .. first+len(dest)-1``
    to rank ``dest[i]``; type ``keys[t]`` holds the global ids of ``type_offsets[t] ..
    type_offsets[t+1]-1`` and its rows in ``data[keys[t]]``."""
    end = first + len(dest)
    out = {}
    for t, key in enumerate(keys):
        lo, hi = max(first, int(type_offsets[t])), min(end, int(type_offsets[t + 1]))
        rows = dest[lo - first : max(lo, hi) - first]
        out[key] = {name: _send_rows(comm, rows, arr) for name, arr in data[key].items()}
    return out


def shuffle_share(comm: Comm, share: Share, rl: Relabelled, part: np.ndarray) -> Received:
    meta, chunk, book = share.meta, share.chunk, rl.book
    a, b = chunk.nodes
    c, e = chunk.edges
    ids = rl.new_nids.dtype
    nodes = comm.exchange_rows(part, rl.new_nids, np.arange(a, b, dtype=ids))
    orig_nids = nodes[np.argsort(nodes[:, 0]), 1].astype(np.int64)
    del nodes
    node_feats = _send_features(comm, part, a, meta.node_type_offsets, meta.node_types, chunk.ndata)
    owner = owners(book.node_offsets, rl.new_dst)
    orig = np.arange(c, e, dtype=ids)
    edges = comm.exchange_rows(owner, rl.new_dst, rl.new_src, rl.new_eids, orig)
    del orig
    # sent: the endpoints are not read again, and the sort below is the shuffle's peak
    rl.new_src = rl.new_dst = np.empty(0, dtype=np.int64)
    elo = int(book.edge_offsets[comm.rank])
    orig_eids = np.empty(len(edges), dtype=np.int64)
    orig_eids[edges[:, 2] - elo] = edges[:, 3]
    # CSC order: by destination, then edge id (one int64 key: both are small here)
    span = int(book.edge_offsets[comm.rank + 1]) - elo + 1
    key = (edges[:, 0] - book.node_offsets[comm.rank]).astype(np.int64) * span + (edges[:, 2] - elo)
    edges = edges[np.argsort(key), :3]
    del key
    ekeys = [etype_key(et) for et in meta.edge_types]
    edge_feats = _send_features(comm, owner, c, meta.edge_type_offsets, ekeys, chunk.edata)
    return Received(orig_nids, orig_eids, edges, node_feats, edge_feats)


@dataclass(frozen=True, eq=False)
class Structure:
    nodes: np.ndarray
    indptr: np.ndarray
    edges: np.ndarray  # [e_local, 3] (dst, src, eid) in CSC order


def _segments(indptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    offs = np.cumsum(counts) - counts
    return np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(starts - offs, counts)


def local_structure(comm: Comm, book: PartitionBook, got: Received, halo_hops: int) -> Structure:
    """Inner nodes with their in-edges, then halo nodes hop by hop (collective: every
    rank runs the same ``halo_hops - 1`` in-edge requests)."""
    a, b = book.owned_nodes(comm.rank)
    inner_ptr = np.zeros(b - a + 1, dtype=np.int64)
    np.cumsum(np.bincount(got.edges[:, 0] - a, minlength=b - a), out=inner_ptr[1:])
    node_chunks = [np.arange(a, b, dtype=np.int64)]
    count_chunks = [np.diff(inner_ptr)]
    edge_chunks = [got.edges]
    num_nodes = int(book.node_offsets[-1])
    seen = np.zeros(num_nodes, dtype=bool)
    seen[a:b] = True
    frontier = got.edges[:, 1]
    for hop in range(1, halo_hops + 1):
        cand = unique(frontier, num_nodes)
        fresh = cand[~seen[cand]]
        seen[fresh] = True
        node_chunks.append(fresh)
        if hop < halo_hops:  # these halo rows carry their in-edges
            asks = comm.exchange(by_rank(owners(book.node_offsets, fresh), comm.world, fresh))
            answers = [got.edges[_segments(inner_ptr, q[:, 0] - a)] for q in asks]
            fetched = np.concatenate(comm.exchange(answers))
            edge_chunks.append(fetched)
            rows = np.searchsorted(fresh, fetched[:, 0])
            count_chunks.append(np.bincount(rows, minlength=len(fresh)))
            frontier = fetched[:, 1]
        else:
            count_chunks.append(np.zeros(len(fresh), dtype=np.int64))
    counts = np.concatenate(count_chunks)
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return Structure(np.concatenate(node_chunks), indptr, np.concatenate(edge_chunks))


def write_part(
    tmp: Path, comm: Comm, share: Share, rl: Relabelled, got: Received, st: Structure
) -> dict[str, int | str]:
    """``tmp/part-p/`` and ``tmp/mapping/part-p/``; returns the ``parts[p]`` config entry."""
    p, meta, book = comm.rank, share.meta, rl.book
    d = tmp / f"part-{p}"
    d.mkdir()
    np.save(d / "nodes.npy", st.nodes)
    np.save(d / "indptr.npy", st.indptr)
    np.save(d / "indices.npy", st.edges[:, 1].astype(np.int64))
    np.save(d / "eids.npy", st.edges[:, 2].astype(np.int64))
    if meta.is_hetero:
        etypes = book.eid_to_per_type(st.edges[:, 2].astype(np.int64))[0]
        np.save(d / "etypes.npy", etypes.astype(np.int32))
    for kind, feats in (("node", got.node_feats), ("edge", got.edge_feats)):
        for key, group in feats.items():
            for name, arr in group.items():
                (d / kind / key).mkdir(parents=True, exist_ok=True)
                np.save(d / kind / key / f"{name}.npy", arr)
    m = tmp / MAPPING_DIR / f"part-{p}"
    m.mkdir(parents=True)
    np.save(m / "orig_nids.npy", got.orig_nids)
    np.save(m / "orig_eids.npy", got.orig_eids)
    np.save(m / "new_nids.npy", rl.new_nids.astype(np.int64))
    np.save(m / "new_eids.npy", rl.new_eids.astype(np.int64))
    for ntype, ids in share.chunk.ids.items():
        (m / "ids").mkdir(exist_ok=True)
        np.save(m / "ids" / f"{ntype}.npy", np.ascontiguousarray(ids), allow_pickle=False)
    lo, hi = book.owned_nodes(p)
    elo, ehi = book.owned_edges(p)
    return {
        "dir": d.name,
        "num_inner_nodes": hi - lo,
        "num_local_nodes": len(st.nodes),
        "num_inner_edges": ehi - elo,
        "num_local_edges": len(st.edges),
    }
