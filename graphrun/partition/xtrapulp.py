"""Distributed label propagation with balance constraints, after XtraPuLP.

Follows G. M. Slota, S. Rajamanickam, K. Devine, K. Madduri, "Partitioning
Trillion-edge Graphs in Minutes", IPDPS 2017 (XtraPuLP): every rank owns a block of
vertices (the nodes of its chunks) with their adjacency and keeps the labels of the
*ghosts* (neighbours owned elsewhere) current by one exchange per iteration. Each
outer round runs

1. *balance* iterations: a vertex ``v`` moves to the part ``p`` maximising
   ``C(v, p) * W(p)``, ``C`` the number of edges to ``p``'s vertices and ``W(p) =
   max(limit / size(p) - 1, 0)`` (XtraPuLP's weighting; with several criteria the
   mean over the criteria of the per-criterion weights), so under-full parts pull;
2. a *repair* pass where a criterion is still out of balance (vertices cheapest to
   move leave the most overloaded part; the cost model of
   :func:`graphrun.partition.balance.rebalance`, each rank shedding its share);
3. *refinement* iterations: a vertex moves to the part holding most of its
   neighbours when that cuts fewer edges and the part has room.

As in XtraPuLP, ranks share a part's remaining room in each iteration (sizes are
all-reduced after each one): here in proportion to what each rank asks for, so ranks
deciding at once never overfill a part together. Being vectorised, a whole rank decides at once
(XtraPuLP's threads do, too); to damp neighbours swapping places, only a random half
of the willing vertices move in a refinement iteration.

Departures from the paper: the multi-constraint balance (nodes, training nodes,
owned edges = in-degree, the criteria of :mod:`graphrun.partition.balance`) is
enforced at once instead of in a vertex phase then an edge phase, the best balanced
assignment over the rounds is kept, and there are two initialisations besides the
paper's random one: ``block`` (contiguous id ranges) and ``local`` — each rank cuts
its own chunk's induced subgraph into blocks with KaMinPar (3x faster than METIS there,
cuts within 5%), the small graph of blocks is gathered on rank 0 and partitioned with
METIS, and label propagation refines from there (the multilevel idea of ParHIP,
Meyerhenke, Sanders, Schulz, "Parallel Graph Partitioning for Complex Networks", IPDPS
2015, with one level).
``benchmarks/README.md`` compares them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from graphrun.errors import ArgumentError
from graphrun.graph.graph import release
from graphrun.names import owners
from graphrun.partition import balance
from graphrun.partition.arrays import PIECE, by_rank, group_ranks, stable_argsort
from graphrun.partition.kaminpar import kaminpar_assign

if TYPE_CHECKING:  # torch: only a rank imports it, not the launcher
    from graphrun.partition.comm import Comm

INITS = ("local", "hash", "block")


@dataclass(frozen=True, eq=False)
class LocalGraph:
    """One rank's vertices ``[lo, hi)``, their undirected adjacency and their ghosts.

    ``cols`` are local indices: ``< n`` an owned vertex, ``n + g`` the ghost
    ``ghosts[g]``; ``weights`` the number of edges between the two (either direction,
    self loops dropped), so the weight cut is the edge cut. ``send[q]`` are the owned
    vertices rank ``q`` holds as ghosts, in the order of its ghost list.
    """

    lo: int
    hi: int
    indptr: np.ndarray
    cols: np.ndarray
    weights: np.ndarray  # float32
    ghosts: np.ndarray
    send: list[np.ndarray]

    @property
    def n(self) -> int:
        return self.hi - self.lo


def _ends(src: np.ndarray, dst: np.ndarray, lo: int, hi: int, ids: type) -> tuple[np.ndarray, ...]:
    """Edges ``lo .. hi-1`` (``src``/``dst`` may be memory-mapped: let go of after the
    slice) as ``ids``, self loops dropped."""
    s, d = np.asarray(src[lo:hi]), np.asarray(dst[lo:hi])
    release(src)
    release(dst)
    keep = s != d
    return s[keep].astype(ids), d[keep].astype(ids)


def _pairs(comm: Comm, bounds: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``[m, 2]`` (mine, other): every edge of this rank's chunk sent to the owners of
    both ends, in rounds (:meth:`Comm.send_rows`), into one array: the edges received
    as out-edges, then as in-edges, each in rank order."""
    ids = np.int32 if int(bounds[-1]) < 1 << 31 else np.int64  # half the rows sent and held
    n, step = len(src), comm.step(2 * np.dtype(ids).itemsize)
    sent = np.zeros((2, comm.world), dtype=np.int64)
    for lo in range(0, n, step):
        for j, end in enumerate(_ends(src, dst, lo, lo + step, ids)):
            sent[j] += np.bincount(owners(bounds, end), minlength=comm.world)
    got = comm.allgather(sent)[:, :, comm.rank]  # [from, out/in]
    at = np.concatenate([[0], np.cumsum(got.T.reshape(-1))[:-1]]).reshape(2, -1)
    pairs = np.empty((int(got.sum()), 2), dtype=ids)
    for j in range(2):  # out-edges (src, dst) to src's owner, then (dst, src) to dst's

        def piece(lo: int, hi: int, j: int = j) -> tuple[np.ndarray, np.ndarray]:
            ends = _ends(src, dst, lo, hi, ids)
            mine, other = ends[j], ends[1 - j]
            return owners(bounds, mine), np.stack([mine, other], axis=1)

        def sink(q: int, rows: np.ndarray, j: int = j) -> None:
            pairs[at[j, q] : at[j, q] + len(rows)] = rows
            at[j, q] += len(rows)

        comm.send_rows(n, piece, sink, 2 * np.dtype(ids).itemsize)
    return pairs


def _by_row(rows: np.ndarray, cols: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)``: the pairs' columns grouped by row (a counting sort, slice by
    slice; ``rows``/``cols`` may be strided views: no full-length copy of them)."""
    indptr = np.zeros(n + 1, dtype=np.int64)
    for lo in range(0, len(rows), PIECE):
        indptr[1:] += np.bincount(rows[lo : lo + PIECE], minlength=n)
    np.cumsum(indptr, out=indptr)
    indices = np.empty(len(rows), dtype=cols.dtype)
    fill = indptr[:-1].copy()
    for lo in range(0, len(rows), PIECE):
        r = rows[lo : lo + PIECE]
        order = stable_argsort(np.ascontiguousarray(r), n)
        key = r[order]
        indices[fill[key] + group_ranks(key)] = cols[lo : lo + PIECE][order]
        fill += np.bincount(r, minlength=n)
    return indptr, indices


def build_local_graph(
    comm: Comm, bounds: np.ndarray, src: np.ndarray, dst: np.ndarray
) -> LocalGraph:
    """Send every edge of this rank's chunk to the owners of both ends; build the rest.
    ``src``/``dst`` may be memory-mapped (read a round at a time)."""
    lo, hi = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    pairs = _pairs(comm, bounds, src, dst)
    rows, cols = pairs[:, 0], pairs[:, 1]
    rows -= lo
    seen = np.zeros(int(bounds[-1]), dtype=bool)  # the ghosts: the columns outside [lo, hi)
    for a in range(0, len(cols), PIECE):
        seen[cols[a : a + PIECE]] = True
    seen[lo:hi] = False
    ghosts = np.flatnonzero(seen)
    del seen
    index = np.full(int(bounds[-1]), -1, dtype=cols.dtype)
    index[lo:hi] = np.arange(hi - lo, dtype=cols.dtype)
    index[ghosts] = (hi - lo) + np.arange(len(ghosts), dtype=cols.dtype)
    for a in range(0, len(cols), PIECE):
        cols[a : a + PIECE] = index[cols[a : a + PIECE]]
    del index
    indptr, indices = _by_row(rows, cols, hi - lo)
    del pairs, rows, cols
    ones = np.ones(len(indices), dtype=np.float32)  # exact: a weight is far below 2**24
    adj = sp.csr_matrix((ones, indices, indptr), shape=(hi - lo, hi - lo + len(ghosts)))
    del ones, indices, indptr
    adj.sum_duplicates()  # sorts every row's columns, then sums repeated pairs
    requests = by_rank(owners(bounds, ghosts), comm.world, ghosts)
    send = [r[:, 0] - lo for r in comm.exchange(requests)]
    return LocalGraph(lo, hi, adj.indptr, adj.indices, adj.data, ghosts, send)


class Propagation:
    """Labels of one rank's vertices and ghosts, and the steps that change them."""

    def __init__(
        self,
        comm: Comm,
        g: LocalGraph,
        crit: np.ndarray,
        parts: int,
        tolerance: float,
        seed: int,
    ) -> None:
        self.comm, self.g, self.parts, self.tolerance = comm, g, parts, tolerance
        self.crit = crit  # [n, K] float64
        self.totals = comm.allreduce_sum(crit.sum(axis=0))
        self.limit = (1.0 + tolerance) * self.totals / parts  # [K]
        self.mean = np.where(self.totals > 0, self.totals / parts, 1.0)  # [K] average part
        self.adj = sp.csr_matrix((g.weights, g.cols, g.indptr), shape=(g.n, g.n + len(g.ghosts)))
        self.rng = np.random.default_rng(seed + 7919 * comm.rank)
        self.labels = np.zeros(g.n + len(g.ghosts), dtype=np.int64)

    # ---- shared state ---------------------------------------------------------------

    def set_owned(self, owned: np.ndarray) -> None:
        self.labels[: self.g.n] = owned
        self.update_ghosts()

    def update_ghosts(self) -> None:
        own = self.labels[: self.g.n]
        got = self.comm.exchange([own[s] for s in self.g.send])
        self.labels[self.g.n :] = np.concatenate(got) if got else []

    def sizes(self) -> np.ndarray:
        """[P, K] global loads of every part."""
        own = self.labels[: self.g.n]
        return self.comm.allreduce_sum(balance.part_loads(own, self.crit, self.parts))

    def counts(self) -> np.ndarray:
        """[n, P]: edges from each owned vertex to each part (a sparse-dense product)."""
        onehot = np.zeros((len(self.labels), self.parts), dtype=np.float32)
        onehot[np.arange(len(self.labels)), self.labels] = 1.0
        return np.asarray(self.adj @ onehot, dtype=np.float64)

    def cut_and_worst(self) -> tuple[int, float]:
        """Edges cut (global, directed, self loops excluded) and the worst load / limit."""
        own = self.labels[: self.g.n]
        c = self.counts()
        local_cut = round(c.sum() - c[np.arange(self.g.n), own].sum())
        cut = int(self.comm.allreduce_sum(np.array([local_cut], dtype=np.int64))[0]) // 2
        return cut, float((self.sizes() / self.mean).max())

    # ---- one iteration --------------------------------------------------------------

    def admit(self, order: np.ndarray, dest: np.ndarray, room: np.ndarray) -> int:
        """Move the vertices ``order`` (best first) to ``dest`` (their target parts) as far
        as the targets' ``room`` ([P, K] in average parts) allows, and return the global
        number moved. The room of a part is split among the ranks in proportion to what
        each asks for (one all-reduce), so ranks deciding at once never overfill it."""
        share = self.crit[order] / self.mean  # [m, K]
        demand = np.zeros((self.parts, self.crit.shape[1]))
        np.add.at(demand, dest, share)
        total = self.comm.allreduce_sum(demand)
        room = np.maximum(room, 0.0)
        with np.errstate(invalid="ignore"):  # inf / inf: no limit
            mine = demand * np.minimum(1.0, np.nan_to_num(room / np.maximum(total, 1e-12), nan=1.0))
        own = self.labels[: self.g.n]
        moved = 0
        for p in np.unique(dest):
            sel = dest == p
            fits = (np.cumsum(share[sel], axis=0) <= mine[p] + 1e-12).all(axis=1)
            take = order[sel][: int(np.argmin(fits)) if not fits.all() else len(fits)]
            own[take] = p
            moved += len(take)
        self.update_ghosts()
        return int(self.comm.allreduce_sum(np.array([moved], dtype=np.int64))[0])

    def step(self, mode: str) -> int:
        """One balance or refinement iteration; returns the vertices moved (globally)."""
        sizes = self.sizes()
        room = (self.limit - sizes) / self.mean  # [P, K]
        c = self.counts()
        own = self.labels[: self.g.n]
        idx = np.arange(self.g.n)
        if mode == "balance":
            w = np.maximum(self.limit / np.maximum(sizes, 1e-12) - 1.0, 0.0)  # [P, K]
            score = c * np.where(self.totals > 0, w, 0.0).mean(axis=1)
        else:  # only parts with room in every criterion the vertex weighs on
            heavy = self.crit > 0  # [n, K]
            fits = (~heavy[:, None, :] | (room > 0)[None, :, :]).all(axis=2)  # [n, P]
            score = np.where(fits, c, -1.0)
            score[idx, own] = c[idx, own]
        best = np.argmax(score, axis=1)
        gain = c[idx, best] - c[idx, own]
        want = (best != own) & (score[idx, best] > score[idx, own])
        if mode == "refine":
            want &= (gain > 0) & (self.rng.random(self.g.n) < 0.5)
        cand = np.flatnonzero(want)
        order = cand[np.argsort(-gain[cand], kind="stable")]
        return self.admit(order, best[order], room)

    def repair(self, max_steps: int = 32) -> int:
        """Move the cheapest vertices out of the most overloaded (part, criterion) until
        every criterion is within the tolerance: :func:`graphrun.partition.balance.rebalance`
        done by every rank on its own vertices, each moving its share of the excess."""
        moved = 0
        weight = self.comm.allreduce_sum(np.array([self.g.weights.sum()], np.float64))[0]
        dbar = weight / max(1.0, float(self.totals[0]))  # mean (weighted) degree
        for _ in range(max_steps):
            sizes = self.sizes()
            ratio = sizes / self.mean
            if ratio.max() <= 1.0 + self.tolerance:
                break
            p, k = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
            # first only moves that push no criterion of a receiver over its limit: two
            # parts over in different criteria (training nodes, edges) otherwise trade
            # the same vertices back and forth; then, as in balance.rebalance, only
            # criterion k limits the receivers (another one pushed over is the next
            # step's most overloaded)
            strict = (self.limit - sizes) / self.mean
            strict[p, k] = 0.0
            if not (strict[:, k] > 0).any():
                break
            relaxed = np.full(sizes.shape, np.inf)
            relaxed[:, k] = strict[:, k]
            step = self._shed(int(p), int(k), sizes, strict, dbar)
            if step == 0:
                step = self._shed(int(p), int(k), sizes, relaxed, dbar)
            moved += step
            if step == 0:
                break
        return moved

    def _shed(self, p: int, k: int, sizes: np.ndarray, room: np.ndarray, dbar: float) -> int:
        """This rank's share of moving part ``p``'s excess of criterion ``k`` out."""
        own = self.labels[: self.g.n]
        cand = np.flatnonzero((own == p) & (self.crit[:, k] > 0))
        target = self.mean[k] * (1.0 + self.tolerance / 2)
        excess = (sizes[p, k] - target) * self.crit[cand, k].sum() / max(sizes[p, k], 1e-12)
        recv = np.flatnonzero(room[:, k] > 0)
        # a receiver takes a vertex only with room in every criterion the vertex weighs on
        weighs = self.crit[cand] > 0  # [m, K]
        has_room = room[recv] > 0  # [R, K]
        fits = np.all(~weighs[:, None, :] | has_room[None, :, :], axis=2)  # [m, R]
        keep = np.any(fits, axis=1)
        cand, fits = cand[keep], fits[keep]
        c = self.counts()[cand]
        q = recv[np.argmax(np.where(fits, c[:, recv], -1.0), axis=1)]
        gain = c[np.arange(len(cand)), q] - c[:, p]
        benefit = self.crit[cand, k] / self.mean[k]
        others = (self.crit[cand] / self.mean).sum(axis=1) - benefit
        cost = (np.maximum(-gain, 0) + dbar * others) / benefit
        order = np.argsort(cost + 1e-9 * self.rng.random(len(cand)), kind="stable")
        w = self.crit[cand[order], k]
        order = order[np.cumsum(w) - w < excess]
        return self.admit(cand[order], q[order], room)


def hash_init(lo: int, hi: int, parts: int, seed: int) -> np.ndarray:
    """A random part per vertex, from its global id and the seed (rank-independent):
    splitmix64 of ``id + seed * golden``, arithmetic modulo 2**64."""
    x = np.arange(lo, hi, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x += np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(31)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(29)
    return (x % np.uint64(parts)).astype(np.int64)


def block_init(lo: int, hi: int, num_nodes: int, parts: int) -> np.ndarray:
    """Contiguous id ranges: global id ``i`` goes to part ``i * P // N``."""
    return (np.arange(lo, hi, dtype=np.int64) * parts) // max(num_nodes, 1)


def _block_pairs(g: LocalGraph, block: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """The pairs of different blocks (``block`` of every vertex, ghosts too) an edge
    joins, as sorted keys ``a * blocks + b``, and the edges' weight between them:
    summed a slice of rows at a time (the pairs are few, the edges many)."""
    keys: list[np.ndarray] = [np.zeros(0, np.int64)]
    weights: list[np.ndarray] = [np.zeros(0)]
    for r0, r1 in _row_slices(g.indptr):
        e0, e1 = int(g.indptr[r0]), int(g.indptr[r1])
        a = np.repeat(block[r0:r1], np.diff(g.indptr[r0 : r1 + 1]))
        b = block[g.cols[e0:e1]]
        cross = a != b
        key, first = np.unique(a[cross] * blocks + b[cross], return_inverse=True)
        keys.append(key)
        weights.append(np.bincount(first.reshape(-1), weights=g.weights[e0:e1][cross]))
    key, first = np.unique(np.concatenate(keys), return_inverse=True)
    weight = np.bincount(first.reshape(-1), weights=np.concatenate(weights), minlength=len(key))
    return key, weight.astype(np.int64)


def _row_slices(indptr: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive row ranges of about ``PIECE`` entries each (a row is never split)."""
    cuts = np.searchsorted(indptr, np.arange(0, int(indptr[-1]), PIECE), side="right") - 1
    cuts = np.unique(np.append(cuts, len(indptr) - 1))
    return list(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True))


def local_init(prop: Propagation, blocks: int, seed: int, threads: int = 0) -> np.ndarray:
    """Cut this rank's induced subgraph into ``blocks`` with KaMinPar on ``threads`` cores
    (0: all), partition the graph of all ranks' blocks on rank 0 with METIS, broadcast
    the blocks' parts."""
    comm, g, parts = prop.comm, prop.g, prop.parts
    # the induced subgraph: the owned columns of the symmetric, sorted adjacency
    inner = sp.csr_matrix((g.weights, g.cols, g.indptr), shape=(g.n, g.n + len(g.ghosts)))
    inner = inner[:, : g.n]
    xadj, adjncy = inner.indptr.astype(np.int64), inner.indices
    del inner
    nb = max(1, min(blocks, g.n))
    if nb > 1:
        block = kaminpar_assign(xadj, adjncy, nb, seed=seed, threads=threads or None)
    else:
        block = np.zeros(g.n, np.int64)
    del xadj, adjncy
    first = comm.allgather(np.array([nb], dtype=np.int64))[:, 0]
    offsets = np.concatenate([[0], np.cumsum(first)])
    prop.set_owned(block + offsets[comm.rank])  # global block ids, ghosts' too
    key, weight = _block_pairs(g, prop.labels, int(offsets[-1]))
    edges = np.stack([key // offsets[-1], key % offsets[-1], weight], axis=1)
    load = np.zeros((nb, prop.crit.shape[1]))
    np.add.at(load, block, prop.crit)
    sends = [np.zeros((0, 3), np.int64) for _ in range(comm.world)]
    sends[0] = edges
    all_edges = np.concatenate(comm.exchange(sends))
    wsends = [np.zeros((0, load.shape[1])) for _ in range(comm.world)]
    wsends[0] = load
    all_load = np.concatenate(comm.exchange(wsends))
    if comm.rank == 0:
        coarse = _coarse_partition(all_edges, all_load, int(offsets[-1]), parts, seed)
    else:
        coarse = np.zeros(0, dtype=np.int64)
    coarse = comm.broadcast(coarse, root=0)
    return coarse[block + offsets[comm.rank]]


def _coarse_partition(
    edges: np.ndarray, load: np.ndarray, n: int, parts: int, seed: int
) -> np.ndarray:
    """METIS on the graph of blocks: edge weights = edges between blocks."""
    import pymetis

    order = np.lexsort((edges[:, 1], edges[:, 0]))
    e = edges[order]
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(e[:, 0], minlength=n), out=xadj[1:])
    vw = balance.combined_weights(load)
    if parts == 1:
        return np.zeros(n, dtype=np.int64)
    dtype = np.dtype(getattr(pymetis, "zero_copy_dtype", lambda: np.int64)())
    _, membership = pymetis.part_graph(
        parts,
        adjacency=pymetis.CSRAdjacency(xadj.astype(dtype), np.ascontiguousarray(e[:, 1], dtype)),
        vweights=vw.astype(dtype),
        eweights=np.ascontiguousarray(e[:, 2], dtype),
        options=pymetis.Options(seed=int(seed)),
    )
    return np.asarray(membership, dtype=np.int64)


@dataclass(frozen=True)
class LPOptions:
    init: str = "local"
    rounds: int = 3
    balance_iters: int = 5
    refine_iters: int = 10
    blocks_per_part: int = 16  # local init: blocks per rank = this * parts
    threads: int = 0  # local init: KaMinPar's threads (0: every core this rank may use)


def propagate(
    comm: Comm,
    g: LocalGraph,
    crit: np.ndarray,
    parts: int,
    num_nodes: int,
    *,
    tolerance: float = balance.DEFAULT_TOLERANCE,
    seed: int = 0,
    opts: LPOptions = LPOptions(),
) -> tuple[np.ndarray, dict[str, float]]:
    """The part of every vertex this rank owns, and a few statistics of the run."""
    if opts.init not in INITS:
        raise ArgumentError(f"init: {opts.init!r} is not one of {', '.join(INITS)}")
    prop = Propagation(comm, g, crit, parts, tolerance, seed)
    if opts.init == "hash":
        init = hash_init(g.lo, g.hi, parts, seed)
    elif opts.init == "block":
        init = block_init(g.lo, g.hi, num_nodes, parts)
    else:
        init = local_init(prop, opts.blocks_per_part * parts, seed, opts.threads)
    prop.set_owned(init)
    init_cut, init_worst = prop.cut_and_worst()
    best = (init_worst > 1 + tolerance + 1e-9, init_cut, init_worst)
    best_labels = prop.labels[: g.n].copy()
    moves = 0
    for _ in range(opts.rounds if parts > 1 else 0):
        for _ in range(opts.balance_iters):
            moves += prop.step("balance")
        moves += prop.repair()
        for _ in range(opts.refine_iters):
            moved = prop.step("refine")
            moves += moved
            if moved == 0:
                break
        cut, worst = prop.cut_and_worst()
        state = (worst > 1 + tolerance + 1e-9, cut, worst)
        if state < best:
            best, best_labels = state, prop.labels[: g.n].copy()
    stats = {"init_cut_edges": init_cut, "cut_edges": best[1], "moves": moves}
    return best_labels, {k: float(v) for k, v in stats.items()}
