"""Streaming placement of new nodes (issue 42, item 3): LDG and Fennel, pure numpy.

A node that joins a live graph is placed once, when it arrives, from what is known
then: the partitions of its already-placed neighbours and the partitions' sizes. Nodes
of one batch are placed one after the other in batch order, so a node also counts the
batch's earlier nodes among its neighbours (``within``). Two scores (Stanton and
Kliot's LDG, KDD 2012; Tsourakakis et al.'s Fennel, WSDM 2014), for a node with
``c[p]`` placed neighbours on partition ``p`` of size ``s[p]``:

* ``ldg``:    ``c[p] * (1 - s[p] / capacity)``
* ``fennel``: ``c[p] - alpha * gamma * s[p] ** (gamma - 1)``
  (:func:`fennel_alpha`: ``alpha = sqrt(P) * m / n ** 1.5`` for n nodes and m edges)

The highest score wins; ties go to the smaller partition, then the lower index, so the
placement is deterministic. **Capacity rule**: a partition holding ``capacity`` nodes
takes no more (:func:`capacity_for`: ``ceil((1 + slack) * n / P)`` for ``n`` nodes after
the batch), so no partition ends above it whatever the order of arrival; a batch that
cannot fit is refused before any node is placed.

:func:`measure_streamed` is the measure the issue asks for: stream a graph's nodes in an
order onto P partitions (optionally after partitioning a first share of them from
scratch, as a live store grows from its base) and compare the edge cut with partitioning
the final graph from scratch (:func:`graphrun.partition.assign`, METIS by default):
``streamed_cut_ratio = streamed cut / scratch cut``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.graph import Graph
from graphrun.partition.metis import symmetric_csr
from graphrun.partition.partitioner import METHODS as SCRATCH_METHODS
from graphrun.partition.partitioner import assign as scratch_assign
from graphrun.partition.quality import cut_edges, max_over_mean

METHODS = ("ldg", "fennel")
ORDERS = ("random", "id")
DEFAULT_SLACK = 0.05
DEFAULT_GAMMA = 1.5
BLOCK = 4096  # nodes whose neighbour counts are held at once (BLOCK x P floats)


@dataclass(frozen=True, eq=False)
class Neighbours:
    """For each of ``n`` new nodes a list of integers, as CSR: node ``i``'s are
    ``items[indptr[i]:indptr[i + 1]]`` (partition ids, or batch indices for ``within``)."""

    indptr: np.ndarray
    items: np.ndarray

    @property
    def n(self) -> int:
        return len(self.indptr) - 1

    @classmethod
    def from_pairs(cls, node: np.ndarray, item: np.ndarray, n: int) -> Neighbours:
        """From ``(node, item)`` pairs, ``node`` in ``[0, n)``, in any order."""
        node = np.asarray(node, dtype=np.int64)
        item = np.asarray(item, dtype=np.int64)
        if node.shape != item.shape or node.ndim != 1:
            raise ArgumentError(
                f"pairs: node {node.shape} and item {item.shape} must be 1-d, equal"
            )
        if len(node) and (node.min() < 0 or node.max() >= n):
            raise ArgumentError(f"pairs: node ids must be in [0, {n})")
        order = np.argsort(node, kind="stable")
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(node, minlength=n), out=indptr[1:])
        return cls(indptr, item[order])

    @classmethod
    def from_lists(cls, lists: list[np.ndarray]) -> Neighbours:
        """From one array per node."""
        indptr = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in lists], out=indptr[1:])
        items = np.concatenate(lists).astype(np.int64) if lists else np.zeros(0, np.int64)
        return cls(indptr, items)

    @classmethod
    def empty(cls, n: int) -> Neighbours:
        return cls(np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))


def capacity_for(sizes: np.ndarray, new: int, slack: float = DEFAULT_SLACK) -> int:
    """The capacity rule: ``ceil((1 + slack) * n / P)``, ``n`` the nodes after the batch."""
    if not (math.isfinite(slack) and slack >= 0):
        raise ArgumentError(f"slack: expected a finite number >= 0, got {slack!r}")
    total = int(np.sum(sizes)) + int(new)
    return max(1, math.ceil((1 + slack) * total / max(len(sizes), 1)))


def fennel_alpha(num_nodes: int, num_edges: int, parts: int, gamma: float = DEFAULT_GAMMA) -> float:
    """Fennel's balance weight for a graph expected to reach ``num_nodes`` and ``num_edges``."""
    return math.sqrt(parts) * num_edges / max(num_nodes, 1) ** gamma


def _check(
    placed: Neighbours, within: Neighbours, sizes: np.ndarray, capacity: int, method: str
) -> None:
    if method not in METHODS:
        raise ArgumentError(f"method: {method!r} is not one of {', '.join(METHODS)}")
    parts = len(sizes)
    if sizes.ndim != 1 or parts < 1 or (sizes < 0).any():
        raise ArgumentError(f"sizes: expected one count >= 0 per partition, got {sizes!r}")
    if not isinstance(capacity, int | np.integer) or capacity < 1:
        raise ArgumentError(f"capacity: expected a positive integer, got {capacity!r}")
    n = placed.n
    for name, nb, hi in (("neighbour_parts", placed, parts), ("within", within, n)):
        p = nb.indptr
        if nb.n != n or p[0] != 0 or p[-1] != len(nb.items) or (np.diff(p) < 0).any():
            raise ArgumentError(f"{name}: not a CSR over the batch's {n} nodes")
        if len(nb.items) and (nb.items.min() < 0 or nb.items.max() >= hi):
            raise ArgumentError(f"{name}: entries must be in [0, {hi})")
    room = int(np.maximum(capacity - sizes, 0).sum())
    if room < n:
        raise ArgumentError(
            f"capacity: {parts} partitions of at most {capacity} nodes have room for {room} "
            f"more, not the batch's {n} (raise the capacity)"
        )


def assign(
    neighbour_parts: Neighbours,
    sizes: np.ndarray,
    capacity: int,
    *,
    within: Neighbours | None = None,
    method: str = "ldg",
    alpha: float = 0.0,
    gamma: float = DEFAULT_GAMMA,
) -> np.ndarray:
    """The partition (int64) of each node of a batch, placed in batch order (see the
    module docstring). ``neighbour_parts``: per new node, its placed neighbours'
    partitions (a neighbour on two edges counts twice); ``within``: per new node, the
    batch indices of its neighbours in the batch (only earlier ones count); ``sizes``:
    nodes per partition now. ``sizes`` is not changed."""
    sizes = np.asarray(sizes, dtype=np.int64)
    within = within if within is not None else Neighbours.empty(neighbour_parts.n)
    _check(neighbour_parts, within, sizes, capacity, method)
    if not (math.isfinite(alpha) and alpha >= 0 and math.isfinite(gamma) and gamma >= 1):
        raise ArgumentError(
            f"alpha, gamma: expected alpha >= 0 and gamma >= 1, got {alpha}, {gamma}"
        )
    load = sizes.astype(np.float64)
    out = np.full(neighbour_parts.n, -1, dtype=np.int64)
    rows = np.repeat(np.arange(within.n), np.diff(within.indptr))
    earlier = within.items < rows  # node rows[k] counts node items[k] once that is placed
    push = Neighbours.from_pairs(within.items[earlier], rows[earlier], within.n)
    score = _Score(method, load, capacity, alpha, gamma)
    for lo in range(0, neighbour_parts.n, BLOCK):
        hi = min(lo + BLOCK, neighbour_parts.n)
        counts = _block_counts(lo, hi, neighbour_parts, within, out, len(sizes))
        for i in range(lo, hi):
            p = score.best(counts[i - lo])
            out[i] = p
            later = push.items[push.indptr[i] : push.indptr[i + 1]]
            later = later[later < hi]
            if len(later):
                np.add.at(counts[:, p], later - lo, 1.0)
    return out


class _Score:
    """Each partition's score for a node's neighbour counts, kept up to date as nodes are
    placed (only the placed node's partition changes)."""

    def __init__(self, method: str, load: np.ndarray, capacity: int, alpha: float, gamma: float):
        self.ldg = method == "ldg"
        self.load, self.capacity, self.alpha, self.gamma = load, capacity, alpha, gamma
        self.weight = np.empty_like(load)  # ldg: times the count; fennel: minus
        self.closed = np.empty_like(load)  # 0, or -inf once full
        for p in range(len(load)):
            self._update(p)

    def _update(self, p: int) -> None:
        x = self.load[p]
        self.weight[p] = 1.0 - x / self.capacity if self.ldg else (
            self.alpha * self.gamma * x ** (self.gamma - 1.0))  # fmt: skip
        self.closed[p] = -np.inf if x >= self.capacity else 0.0

    def best(self, counts: np.ndarray) -> int:
        """The partition a node with these neighbour counts goes to; counted there."""
        s = counts * self.weight if self.ldg else counts - self.weight
        s += self.closed
        p = int(np.argmin(np.where(s == s.max(), self.load, np.inf)))
        self.load[p] += 1
        self._update(p)
        return p


def _block_counts(
    lo: int, hi: int, placed: Neighbours, within: Neighbours, out: np.ndarray, parts: int
) -> np.ndarray:
    """Nodes ``lo..hi``'s neighbours per partition: the placed ones, and those of the
    batch placed before node ``lo``."""
    flat = []
    for nb, of in ((placed, None), (within, out)):
        a, b = nb.indptr[lo], nb.indptr[hi]
        rows = np.repeat(np.arange(hi - lo), np.diff(nb.indptr[lo : hi + 1]))
        part = nb.items[a:b] if of is None else of[nb.items[a:b]]
        flat.append(rows[part >= 0] * parts + part[part >= 0])
    counts = np.bincount(np.concatenate(flat), minlength=(hi - lo) * parts)
    return counts.reshape(hi - lo, parts).astype(np.float64)


@dataclass(frozen=True)
class StreamedCut:
    """Edge cuts (counted as :func:`graphrun.partition.quality.cut_edges` does) of a
    streamed placement and of a from-scratch partition of the same graph."""

    streamed_cut: int
    scratch_cut: int
    random_cut: int
    streamed_cut_ratio: float  # streamed / scratch (inf when scratch cuts nothing)
    node_balance: float  # max over mean of the streamed placement
    capacity: int
    streamed_nodes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stream_neighbours(
    xadj: np.ndarray, adjncy: np.ndarray, order: np.ndarray, base: int, base_part: np.ndarray
) -> tuple[Neighbours, Neighbours]:
    """For the nodes ``order[base:]``: their neighbours' partitions among the first
    ``base`` nodes, and their neighbours' indices among the streamed ones."""
    n = len(xadj) - 1
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    rows = np.repeat(np.arange(n), np.diff(xadj))
    row_rank, col_rank = rank[rows], rank[adjncy]
    streamed = row_rank >= base
    row_rank, col_rank = row_rank[streamed] - base, col_rank[streamed]
    k = n - base
    old = col_rank < base
    placed = Neighbours.from_pairs(row_rank[old], base_part[col_rank[old]], k)
    within = Neighbours.from_pairs(row_rank[~old], col_rank[~old] - base, k)
    return placed, within


def measure_streamed(
    graph: Graph,
    parts: int,
    *,
    order: str = "random",
    base_fraction: float = 0.5,
    method: str = "ldg",
    scratch: str = "metis",
    slack: float = DEFAULT_SLACK,
    seed: int = 0,
) -> StreamedCut:
    """Stream ``graph``'s nodes (``order``: a seeded random permutation, or by id) onto
    ``parts`` partitions with ``method`` and compare the edge cut with ``scratch``
    (a :func:`graphrun.partition.assign` method) on the whole graph. With
    ``base_fraction`` > 0 the first share of the order is partitioned from scratch
    first (the base a live store starts from) and only the rest is streamed. The
    capacity is :func:`capacity_for` of the final node count."""
    n = graph.num_nodes
    if order not in ORDERS:
        raise ArgumentError(f"order: {order!r} is not one of {', '.join(ORDERS)}")
    if method not in METHODS or scratch not in SCRATCH_METHODS:
        raise ArgumentError(
            f"method, scratch: {method!r}, {scratch!r} are not a streaming "
            f"({', '.join(METHODS)}) and a scratch ({', '.join(SCRATCH_METHODS)}) method"
        )
    if not 0.0 <= base_fraction < 1.0:
        raise ArgumentError(f"base_fraction: expected a number in [0, 1), got {base_fraction!r}")
    if not isinstance(parts, int) or not 1 <= parts <= n:
        raise ArgumentError(f"parts: expected an integer in [1, {n}], got {parts!r}")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n) if order == "random" else np.arange(n)
    base = int(base_fraction * n)
    if 0 < base < parts:
        raise ArgumentError(f"base_fraction: {base} base nodes cannot fill {parts} partitions")
    xadj, adjncy = symmetric_csr(graph.src, graph.dst, n)
    base_part = np.zeros(0, dtype=np.int64)
    if base:
        keep = np.zeros(n, dtype=bool)
        keep[perm[:base]] = True
        rank = np.empty(n, dtype=np.int64)
        rank[perm] = np.arange(n)
        e = keep[graph.src] & keep[graph.dst]
        sub = Graph(num_nodes=base, src=rank[graph.src[e]], dst=rank[graph.dst[e]])
        base_part = scratch_assign(sub, parts, scratch, seed=seed)
    placed, within = stream_neighbours(xadj, adjncy, perm, base, base_part)
    sizes = np.bincount(base_part, minlength=parts)
    capacity = capacity_for(sizes, n - base, slack)
    alpha = fennel_alpha(n, len(adjncy) // 2, parts) if method == "fennel" else 0.0
    streamed = assign(placed, sizes, capacity, within=within, method=method, alpha=alpha)
    part = np.empty(n, dtype=np.int64)
    part[perm] = np.concatenate([base_part, streamed])
    s_cut = cut_edges(part, graph.src, graph.dst)
    x_cut = cut_edges(scratch_assign(graph, parts, scratch, seed=seed), graph.src, graph.dst)
    r_cut = cut_edges(scratch_assign(graph, parts, "random", seed=seed), graph.src, graph.dst)
    return StreamedCut(
        streamed_cut=s_cut,
        scratch_cut=x_cut,
        random_cut=r_cut,
        streamed_cut_ratio=s_cut / x_cut if x_cut else (1.0 if s_cut == 0 else math.inf),
        node_balance=max_over_mean(np.bincount(part, minlength=parts)),
        capacity=capacity,
        streamed_nodes=n - base,
    )
