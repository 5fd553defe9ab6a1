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
   feature rows go to the rank of their part, each in rounds of bounded bytes
   (:meth:`Comm.send_rows`). Rows arrive in rank order, which is new id order inside
   every (part, type) block; feature rows are written to the part's files as they
   arrive, and each round of edges is put in place by its new edge id. Ids travel
   and are held as int32 where every id fits.
3. **Structure** (:func:`local_structure`): rank ``p`` sorts its edges into the CSC of
   its inner nodes (a stable counting sort by destination of the edges in id order);
   halo nodes are found hop by hop, and for ``halo_hops >= 2`` their in-edges are
   asked of their owners (the same rows and order as the one-machine writer).

Every pass over E-long arrays takes a slice at a time (``PIECE`` entries), so a
rank's peak is what it holds plus a slice, not a multiple of its edges:
``benchmarks/README.md`` has the peaks per phase.
4. **Write** (:func:`write_part`): ``part-p/`` in the format of
   :mod:`graphrun.partition.format`, plus this rank's id-mapping shards
   (``mapping/part-p/``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphrun.graph.chunked import Chunk, ChunkedMeta
from graphrun.graph.graph import release
from graphrun.graph.npyfile import flushed, open_npy
from graphrun.names import etype_key, owners
from graphrun.partition.arrays import (
    PIECE,
    by_rank,
    group_ranks,
    pieces,
    rank_order,
    stable_argsort,
    unique,
)
from graphrun.partition.book import PartitionBook
from graphrun.partition.format import MAPPING_DIR
from graphrun.partition.quality import Quality, max_over_mean

if TYPE_CHECKING:  # torch: only a rank imports it, not the launcher
    from graphrun.partition.comm import Comm


@dataclass(frozen=True, eq=False)
class Share:
    """What rank ``comm.rank`` read: ``chunk`` holds the nodes ``node_bounds[rank] ..``
    and edges ``edge_bounds[rank] ..`` of the dataset ``meta``."""

    meta: ChunkedMeta
    chunk: Chunk
    node_bounds: np.ndarray  # [world+1]
    edge_bounds: np.ndarray  # [world+1]


def _number(
    comm: Comm,
    n: int,
    keys: Callable[[int, int], np.ndarray],
    types: int,
    parts: int,
    dtype: type[np.signedinteger],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """New ids (``dtype``) of ``n`` items ordered by (part, type, rank, position), and
    the book's ``offsets [P+1]`` and ``ranges [T, P+1]``; ``keys(lo, hi)`` is ``part *
    types + type`` of items ``lo .. hi-1``. Slice by slice: an item's id is its block's
    start plus the items of its block before it, counted as the slices go."""
    blocks = parts * types
    counts = np.zeros(blocks, dtype=np.int64)
    for lo in range(0, n, PIECE):
        counts += np.bincount(keys(lo, min(lo + PIECE, n)), minlength=blocks)
    every = comm.allgather(counts.reshape(parts, types))  # [W, P, T]
    total = every.sum(axis=0)
    offsets = np.concatenate([[0], np.cumsum(total.sum(axis=1))]).astype(np.int64)
    ranges = np.zeros((types, parts + 1), dtype=np.int64)
    np.cumsum(total.T, axis=1, out=ranges[:, 1:])
    start = offsets[:-1, None] + np.cumsum(total, axis=1) - total  # [P, T] block starts
    seen = (start + every[: comm.rank].sum(axis=0)).reshape(-1)
    new = np.empty(n, dtype=dtype)
    for lo in range(0, n, PIECE):
        key = keys(lo, min(lo + PIECE, n))
        order = stable_argsort(key, blocks)
        sorted_key = key[order]
        new[lo + order] = seen[sorted_key] + group_ranks(sorted_key)
        seen += np.bincount(key, minlength=blocks)
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
    ids = id_type(meta)
    a, b = share.chunk.nodes
    c, e = share.chunk.edges
    ntypes, etypes = len(meta.node_types), len(meta.edge_types)

    def node_keys(lo: int, hi: int) -> np.ndarray:
        typ = owners(meta.node_type_offsets, np.arange(a + lo, a + hi))
        return part[lo:hi] * ntypes + typ

    new_nids, noffsets, nranges = _number(comm, b - a, node_keys, ntypes, parts, ids)
    # asked a round at a time (the endpoints may be memory-mapped), as int32 where ids fit
    new_src = comm.fetch(share.node_bounds, share.chunk.src, new_nids)
    new_dst = comm.fetch(share.node_bounds, share.chunk.dst, new_nids)

    def edge_keys(lo: int, hi: int) -> np.ndarray:
        typ = owners(meta.edge_type_offsets, np.arange(c + lo, c + hi))
        return owners(noffsets, new_dst[lo:hi]) * etypes + typ

    new_eids, eoffsets, eranges = _number(comm, e - c, edge_keys, etypes, parts, ids)
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
    local_cut = 0
    for lo in range(0, len(rl.new_src), PIECE):
        src, dst = rl.new_src[lo : lo + PIECE], rl.new_dst[lo : lo + PIECE]
        local_cut += int(
            np.count_nonzero(owners(book.node_offsets, src) != owners(book.node_offsets, dst))
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
    """What rank ``p`` holds after the shuffle: its owned nodes and their in-edges (ids
    int32 where they fit); the feature rows are in the part's files already."""

    orig_nids: np.ndarray  # original id of every owned node, by new id
    orig_eids: np.ndarray  # original id of every owned edge, by new id
    indptr: np.ndarray  # [owned + 1]: the in-edges of every owned node
    src: np.ndarray  # new source id of every in-edge, CSC order (destination, edge id)
    eids: np.ndarray  # new id of every in-edge, CSC order


def _send_rows(comm: Comm, dest: np.ndarray, rows: np.ndarray, path: Path) -> None:
    """``rows`` to rank ``dest`` (stable inside a destination); all received written to
    ``path`` (``.npy``), in rank order. In rounds of at most ``comm.round_bytes`` sent,
    each round's rows gathered from ``rows`` (memory-mapped: let go of after each) and
    written as they arrive, so a round's rows are all a rank holds of them."""
    order, cuts = rank_order(dest, comm.world)
    counts = np.diff(cuts)
    every = comm.allgather(counts)  # [from, to]: the same rounds on every rank
    mine = every[:, comm.rank]
    out = open_npy(path, rows.dtype, (int(mine.sum()), *rows.shape[1:]))
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
        flushed(out)


def _send_features(
    comm: Comm,
    dest: np.ndarray,
    first: int,
    type_offsets: np.ndarray,
    keys: Sequence[str],
    data: dict[str, dict[str, np.ndarray]],
    into: Path,
) -> None:
    """Every feature row of the chunk's nodes (or edges) ``first .. first+len(dest)-1``
    to rank ``dest[i]``, written to ``into/KEY/NAME.npy``; type ``keys[t]`` holds the
    global ids of ``type_offsets[t] .. type_offsets[t+1]-1`` and its rows in
    ``data[keys[t]]``."""
    end = first + len(dest)
    for t, key in enumerate(keys):
        lo, hi = max(first, int(type_offsets[t])), min(end, int(type_offsets[t + 1]))
        rows = dest[lo - first : max(lo, hi) - first]
        for name, arr in data[key].items():
            (into / key).mkdir(parents=True, exist_ok=True)
            _send_rows(comm, rows, arr, into / key / f"{name}.npy")


def _receive_edges(
    comm: Comm, book: PartitionBook, rl: Relabelled, first: int, into: Path
) -> list[np.ndarray]:
    """``[dst, src, orig]`` of every edge this rank's part owns, by new edge id: the
    edges of every share sent to the part of their destination in rounds, each round
    put in place as it arrives (no array of all the edge rows on either side), into
    memory-mapped files in ``into`` let go of after each round: while the share's own
    edges are still held, the part's cost the page cache, not the rank's memory."""
    ids = rl.new_dst.dtype
    elo, ehi = book.owned_edges(comm.rank)
    out = [open_npy(into / f"edges-{k}.npy", ids, (ehi - elo,)) for k in ("dst", "src", "orig")]

    def piece(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        dst = rl.new_dst[lo:hi]
        orig = np.arange(first + lo, first + hi, dtype=ids)
        rows = np.stack([dst, rl.new_src[lo:hi], rl.new_eids[lo:hi], orig], axis=1)
        return owners(book.node_offsets, dst), rows

    def sink(q: int, rows: np.ndarray) -> None:
        at = rows[:, 2] - elo
        for col, arr in zip((0, 1, 3), out, strict=True):
            arr[at] = rows[:, col]
            release(arr)  # a shared mapping: the pages stay in the page cache

    comm.send_rows(len(rl.new_dst), piece, sink, 4 * np.dtype(ids).itemsize)
    return out


def _csc(dst: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """``indptr`` of the in-edges of nodes ``a .. b-1`` and the edges (positions in
    ``dst``, which is in edge id order) in CSC order, by destination then edge id: a
    stable counting sort, slice by slice."""
    n = b - a
    indptr = np.zeros(n + 1, dtype=np.int64)
    for lo in range(0, len(dst), PIECE):
        indptr[1:] += np.bincount(dst[lo : lo + PIECE] - a, minlength=n)
        release(dst)  # memory-mapped: one slice held
    np.cumsum(indptr, out=indptr)
    fill = indptr[:-1].copy()
    perm = np.empty(len(dst), dtype=dst.dtype)
    for lo in range(0, len(dst), PIECE):
        row = dst[lo : lo + PIECE] - a
        order = stable_argsort(row, n)
        key = row[order]
        perm[fill[key] + group_ranks(key)] = lo + order
        fill += np.bincount(row, minlength=n)
        release(dst)
    return indptr, perm


def shuffle_share(
    comm: Comm, share: Share, rl: Relabelled, part: np.ndarray, tmp: Path, scratch: Path
) -> Received:
    """Nodes, edges and feature rows to their part's rank; the feature rows are written
    to ``tmp/part-p/`` as they arrive, the part's edges to files in ``scratch`` (this
    rank's own directory, removed before the output is renamed)."""
    meta, chunk, book = share.meta, share.chunk, rl.book
    into = tmp / f"part-{comm.rank}"
    into.mkdir()
    a, b = chunk.nodes
    c = chunk.edges[0]
    ids = rl.new_nids.dtype
    nodes = comm.exchange_rows(part, rl.new_nids, np.arange(a, b, dtype=ids))
    orig_nids = nodes[np.argsort(nodes[:, 0]), 1].astype(np.int64)
    del nodes
    _send_features(
        comm, part, a, meta.node_type_offsets, meta.node_types, chunk.ndata, into / "node"
    )
    has_edata = any(chunk.edata.get(etype_key(et)) for et in meta.edge_types)
    owner = owners(book.node_offsets, rl.new_dst) if has_edata else np.empty(0, np.int64)
    scratch.mkdir(exist_ok=True)
    dst, src, orig_eids = _receive_edges(comm, book, rl, c, scratch)
    # sent: the endpoints are not read again
    rl.new_src = rl.new_dst = np.empty(0, dtype=np.int64)
    lo, hi = book.owned_nodes(comm.rank)
    indptr, perm = _csc(dst, lo, hi)
    del dst
    src = src[perm]  # in memory: the mapped file's pages are let go of
    perm += np.asarray(book.edge_offsets[comm.rank], dtype=perm.dtype)  # in place: no copy
    eids = perm
    del perm
    ekeys = [etype_key(et) for et in meta.edge_types]
    if has_edata:
        _send_features(comm, owner, c, meta.edge_type_offsets, ekeys, chunk.edata, into / "edge")
    return Received(orig_nids, orig_eids, indptr, src, eids)


@dataclass(frozen=True, eq=False)
class Structure:
    nodes: np.ndarray
    indptr: np.ndarray
    src: list[np.ndarray]  # the local edges' sources, CSC order: the inner ones, then hop by hop
    eids: list[np.ndarray]  # and their ids


def _segments(indptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    offs = np.cumsum(counts) - counts
    return np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(starts - offs, counts)


def _in_edges(got: Received, first: int, asked: np.ndarray) -> np.ndarray:
    """``[e, 3]`` (dst, src, eid) in-edges of the owned nodes ``asked``, node by node."""
    rows = asked - first
    seg = _segments(got.indptr, rows)
    dst = np.repeat(asked, got.indptr[rows + 1] - got.indptr[rows]).astype(got.src.dtype)
    return np.stack([dst, got.src[seg], got.eids[seg]], axis=1)


def local_structure(comm: Comm, book: PartitionBook, got: Received, halo_hops: int) -> Structure:
    """Inner nodes with their in-edges, then halo nodes hop by hop (collective: every
    rank runs the same ``halo_hops - 1`` in-edge requests)."""
    a, b = book.owned_nodes(comm.rank)
    node_chunks = [np.arange(a, b, dtype=np.int64)]
    count_chunks = [np.diff(got.indptr)]
    src, eids = [got.src], [got.eids]
    num_nodes = int(book.node_offsets[-1])
    seen = np.zeros(num_nodes, dtype=bool)
    seen[a:b] = True
    frontier = got.src
    for hop in range(1, halo_hops + 1):
        cand = unique(frontier, num_nodes)
        fresh = cand[~seen[cand]]
        seen[fresh] = True
        node_chunks.append(fresh)
        if hop < halo_hops:  # these halo rows carry their in-edges
            asks = comm.exchange(by_rank(owners(book.node_offsets, fresh), comm.world, fresh))
            fetched = np.concatenate(comm.exchange([_in_edges(got, a, q[:, 0]) for q in asks]))
            src.append(fetched[:, 1])
            eids.append(fetched[:, 2])
            rows = np.searchsorted(fresh, fetched[:, 0])
            count_chunks.append(np.bincount(rows, minlength=len(fresh)))
            frontier = fetched[:, 1]
        else:
            count_chunks.append(np.zeros(len(fresh), dtype=np.int64))
    counts = np.concatenate(count_chunks)
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return Structure(np.concatenate(node_chunks), indptr, src, eids)


def _save(path: Path, chunks: list[np.ndarray], dtype: type = np.int64, fn: Any = None) -> None:
    """The ``chunks`` one after another (each slice through ``fn``) to ``path`` as
    ``dtype``, a slice at a time: no whole-length copy in memory."""
    out = open_npy(path, np.dtype(dtype), (sum(len(c) for c in chunks),))
    at = 0
    for chunk in chunks:
        for _, piece in pieces(chunk, PIECE):
            out[at : at + len(piece)] = piece if fn is None else fn(piece)
            at += len(piece)
            flushed(out)


def write_part(
    tmp: Path, comm: Comm, share: Share, rl: Relabelled, got: Received, st: Structure
) -> dict[str, int | str]:
    """``tmp/part-p/`` and ``tmp/mapping/part-p/``; returns the ``parts[p]`` config entry
    (the feature rows are written by :func:`shuffle_share`)."""
    p, meta, book = comm.rank, share.meta, rl.book
    d = tmp / f"part-{p}"
    np.save(d / "nodes.npy", st.nodes)
    np.save(d / "indptr.npy", st.indptr)
    _save(d / "indices.npy", st.src)
    _save(d / "eids.npy", st.eids)
    if meta.is_hetero:
        _save(d / "etypes.npy", st.eids, np.int32,
              lambda x: book.eid_to_per_type(x.astype(np.int64))[0])  # fmt: skip
    m = tmp / MAPPING_DIR / f"part-{p}"
    m.mkdir(parents=True)
    np.save(m / "orig_nids.npy", got.orig_nids)
    _save(m / "orig_eids.npy", [got.orig_eids])
    np.save(m / "new_nids.npy", rl.new_nids.astype(np.int64))
    _save(m / "new_eids.npy", [rl.new_eids])
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
        "num_local_edges": sum(len(x) for x in st.src),
    }
