"""Balance of nodes, training nodes and edges across partitions.

pymetis gives METIS one balance constraint only (it fixes ``ncon = 1``), so the
three criteria are combined and then repaired:

1. :func:`combined_weights` gives every node the vertex weight
   ``S * (1 + train * N / T + in_degree * N / E)`` (the terms present only for the
   criteria asked for), so each criterion carries the same total weight and METIS
   balances their sum.
2. :func:`rebalance` then looks at each criterion on its own (nodes, training nodes,
   owned edges = in-degree, since an edge belongs to its destination's partition)
   and, while some part exceeds ``(1 + tolerance)`` times the mean, moves nodes from
   the most overloaded part to parts with room. The cheapest nodes go first: cost =
   (edges the move would cut + the other criteria it drags along, in average-node
   units times the mean degree) per unit of the overloaded criterion moved; so
   boundary nodes with many neighbours in the receiver, and for edge balance
   high-degree non-training nodes, are preferred. Every round is a few vectorised
   passes; the number of rounds is bounded and the most balanced state is kept.
   Balance is bought with edge cut: the pass reports what it reached.

The balance actually reached is measured by :mod:`graphrun.partition.quality` and
stored in ``partition.json``; it is reported, never assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WEIGHT_SCALE = 8
DEFAULT_TOLERANCE = 0.05


def criteria(
    num_nodes: int,
    in_degree: np.ndarray,
    train_mask: np.ndarray | None,
    balance_train: bool,
    balance_edges: bool,
) -> np.ndarray:
    """float64 [N, K]: one column per balanced criterion (nodes first)."""
    cols = [np.ones(num_nodes)]
    if balance_train and train_mask is not None and train_mask.any():
        cols.append(train_mask.astype(np.float64))
    if balance_edges and in_degree.sum() > 0:
        cols.append(in_degree.astype(np.float64))
    return np.stack(cols, axis=1)


def combined_weights(crit: np.ndarray) -> np.ndarray:
    """int64 METIS vertex weights: every criterion scaled to the same total, summed."""
    totals = crit.sum(axis=0)
    scale = np.where(totals > 0, crit.shape[0] / np.maximum(totals, 1e-12), 0.0)
    w = np.rint(WEIGHT_SCALE * (crit @ scale))
    return np.maximum(w, 1).astype(np.int64)


def part_loads(part: np.ndarray, crit: np.ndarray, num_parts: int) -> np.ndarray:
    """float64 [P, K]: the load of every part for every criterion."""
    return np.stack(
        [np.bincount(part, weights=crit[:, k], minlength=num_parts) for k in range(crit.shape[1])],
        axis=1,
    )


def _neighbour_counts(
    nodes: np.ndarray, part: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray, num_parts: int
) -> np.ndarray:
    """int64 [len(nodes), P]: how many neighbours of each node lie in each part."""
    starts, ends = xadj[nodes], xadj[nodes + 1]
    deg = ends - starts
    total = int(deg.sum())
    row = np.repeat(np.arange(len(nodes), dtype=np.int64), deg)
    pos = np.arange(total, dtype=np.int64) + np.repeat(starts - (np.cumsum(deg) - deg), deg)
    key = row * num_parts + part[adjncy[pos]]
    return np.bincount(key, minlength=len(nodes) * num_parts).reshape(len(nodes), num_parts)


def rebalance(
    part: np.ndarray,
    crit: np.ndarray,
    xadj: np.ndarray,
    adjncy: np.ndarray,
    num_parts: int,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    max_rounds: int = 64,
    seed: int = 0,
) -> np.ndarray:
    """Move nodes until every criterion is within ``1 + tolerance`` of its mean.

    Returns the most balanced assignment seen (the worst max/mean over criteria).
    """
    part = part.copy()
    rng = np.random.default_rng(seed)
    graph = _Adjacency(xadj, adjncy, num_parts)
    target = 1.0 + tolerance / 2
    totals = crit.sum(axis=0)
    per_node = np.where(totals > 0, totals / max(len(part), 1), 1.0)
    best, best_worst = part.copy(), np.inf
    for _ in range(max_rounds):
        loads = part_loads(part, crit, num_parts)
        mean = loads.sum(axis=0) / num_parts
        ratio = loads / np.where(mean > 0, mean, 1.0)
        worst = float(ratio.max())
        if worst < best_worst:
            best, best_worst = part.copy(), worst
        if worst <= 1.0 + tolerance:
            break
        p, k = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        room = mean[k] * target - loads[:, k]
        receivers = np.flatnonzero(room > 0)
        if len(receivers) == 0:
            break
        others = (np.delete(crit, k, axis=1) / np.delete(per_node, k)).sum(axis=1)
        step = _Step(int(p), int(k), mean[k] * target, loads[:, k], receivers)
        if not _move(part, crit[:, k], crit[:, k] / per_node[k], others, graph, step, rng):
            break
    return best


@dataclass(frozen=True)
class _Step:
    source: int  # the overloaded part
    k: int  # the criterion
    limit: float  # load every part should end at or below
    loads: np.ndarray  # [P] current loads of criterion k
    receivers: np.ndarray  # parts below the limit


@dataclass(frozen=True)
class _Adjacency:
    xadj: np.ndarray
    adjncy: np.ndarray
    num_parts: int

    @property
    def mean_degree(self) -> float:
        return len(self.adjncy) / max(len(self.xadj) - 1, 1)


POOL = 1 << 17


def _move(
    part: np.ndarray,
    w_all: np.ndarray,
    benefit: np.ndarray,
    others: np.ndarray,
    graph: _Adjacency,
    step: _Step,
    rng: np.random.Generator,
) -> bool:
    """One round: move nodes out of ``step.source`` into receivers with room.

    A node's cost is the number of cut edges its move adds plus the other criteria it
    drags along (in units of an average node, weighted by the mean degree), per unit
    of criterion ``k`` it moves; the cheapest nodes go first.
    """
    p = step.source
    excess = step.loads[p] - step.limit
    cand = np.flatnonzero((part == p) & (w_all > 0))
    if len(cand) == 0 or excess <= 0:
        return False
    dbar = graph.mean_degree
    if len(cand) > POOL:  # keep the cheapest by an upper bound of the cost (all edges cut)
        deg = graph.xadj[cand + 1] - graph.xadj[cand]
        bound = (deg + dbar * others[cand]) / benefit[cand]
        cand = np.sort(cand[np.argpartition(bound, POOL)[:POOL]])
    counts = _neighbour_counts(cand, part, graph.xadj, graph.adjncy, graph.num_parts)
    cap = {int(q): float(step.limit - step.loads[q]) for q in step.receivers}
    moved = False
    for _ in range(len(cap)):  # each pass fills or closes at least one receiver
        lightest = float(w_all[cand].min()) if len(cand) else np.inf
        open_q = np.array([q for q, c in cap.items() if c >= lightest], dtype=np.int64)
        if len(open_q) == 0 or excess <= 0:
            break
        to_recv = counts[:, open_q]
        best = open_q[np.argmax(to_recv, axis=1)]
        gain = to_recv.max(axis=1) - counts[:, p]
        cost = (np.maximum(-gain, 0) + dbar * others[cand]) / benefit[cand]
        order = np.argsort(cost + 1e-9 * rng.random(len(cand)), kind="stable")
        w = w_all[cand[order]]
        want = np.cumsum(w) - w < excess
        taken = np.zeros(len(cand), dtype=bool)
        for q in open_q:
            sel = want & (best[order] == q)
            take = sel & (np.cumsum(np.where(sel, w, 0.0)) <= cap[int(q)])
            idx = order[take]
            part[cand[idx]] = q
            taken[idx] = True
            amount = float(w[take].sum())
            cap[int(q)] -= amount
            excess -= amount
            moved = moved or len(idx) > 0
            if (sel & ~take).any():  # full: its other candidates try the next-best part
                cap[int(q)] = 0.0
        cand, counts = cand[~taken], counts[~taken]
    return moved


def random_assign(
    num_nodes: int,
    num_parts: int,
    *,
    train_mask: np.ndarray | None = None,
    in_degree: np.ndarray | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Balanced random assignment.

    Nodes are dealt round-robin in a random order, so part sizes differ by at most
    one. With ``train_mask``, training and other nodes are dealt separately (both
    balanced). With ``in_degree``, nodes are dealt in decreasing degree order (ties
    random) in a snake order, which balances owned edges too.
    """
    rng = np.random.default_rng(seed)
    part = np.empty(num_nodes, dtype=np.int64)
    groups = [np.arange(num_nodes)]
    if train_mask is not None:
        groups = [np.flatnonzero(train_mask), np.flatnonzero(~train_mask)]
    load = np.zeros(num_parts)
    for nodes in groups:
        order = rng.permutation(nodes)
        slot = np.arange(len(order)) % num_parts
        if in_degree is not None:
            order = order[np.argsort(-in_degree[order], kind="stable")]
            rnd = np.arange(len(order)) // num_parts
            slot = np.where(rnd % 2 == 0, slot, num_parts - 1 - slot)
        # the slots that get one node more go to the parts that have fewer so far
        # (by degree when edges are balanced, else by count)
        weight = None if in_degree is None else in_degree[order].astype(np.float64)
        per_slot = np.bincount(slot, weights=weight, minlength=num_parts)
        mapping = np.empty(num_parts, dtype=np.int64)
        mapping[np.argsort(-per_slot, kind="stable")] = np.argsort(load, kind="stable")
        part[order] = mapping[slot]
        load += np.bincount(part[order], weights=weight, minlength=num_parts)
    return part
