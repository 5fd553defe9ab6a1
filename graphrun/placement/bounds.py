"""Lower bounds on the makespan of a placed job, valid for every flow-scheduling policy.

* **port**: the busiest NIC port: its bytes divided by its bandwidth — refined with
  release dates: the flows that cannot start before ``h`` (their head, from the chain
  bound below) need ``h + bytes / bandwidth + least tail`` for every ``h``;
* **compute**: the busiest task's total compute time (a task computes one step at a time);
* **chain**: the longest path through the DAG, every flow at the bandwidth of the
  slower of its two ports (no flow can go faster, whatever else happens);
* **energetic**: the chain and port bounds again, with heads and tails that also
  count port work. A compute step cannot start before every flow it depends on has
  ended, and the flows of one port through which it depends cannot end before
  ``h + bytes(head >= h) / bandwidth`` for every ``h`` (release dates on one port).
  So a step's head is the larger of its predecessors' ends and that port bound over
  its ancestor flows, and heads propagate forward; tails likewise backwards over
  descendant flows. At the widest fan-out steps (the prefetch gates, broadcasts;
  :data:`CONES` per pass) the bound over the step's cone also adds, for a subset of
  its flows on one port, the shortest of their longest paths to the step:
  ``min head + bytes / bandwidth + min path``. This is what sees the prefetch window:
  sampling of iteration ``i`` waits for the end of iteration ``i - prefetch - 1``,
  which waits for every earlier byte on the busiest port and the training and
  synchronisation after the last of them, so the window's coupling of iterations
  adds to the port work instead of overlapping with it.

The bound of a placement is the largest of the four.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphrun.placement.dag import FLOW, Dag
from graphrun.placement.workload import Workload


@dataclass(frozen=True)
class Bounds:
    port: float
    compute: float
    chain: float
    energetic: float = 0.0

    @property
    def value(self) -> float:
        return max(self.port, self.compute, self.chain, self.energetic)


def _durations(dag: Dag) -> list[float]:
    cap = dag.port_capacity
    return [
        dag.size[v] / min(cap[dag.src_port[v]], cap[dag.dst_port[v]])
        if dag.kind[v] == FLOW
        else dag.duration[v]
        for v in range(dag.num_nodes)
    ]


def heads_and_tails(dag: Dag) -> tuple[list[float], list[float]]:
    """Earliest start of every node, and the longest path after it ends (node ids are
    a topological order: the builder only accepts dependencies on earlier nodes)."""
    d = _durations(dag)
    n = dag.num_nodes
    head = [0.0] * n
    for v in range(n):
        f = head[v] + d[v]
        for w in dag.succ[v]:
            if f > head[w]:
                head[w] = f
    tail = [0.0] * n
    for v in range(n - 1, -1, -1):
        for w in dag.succ[v]:
            t = d[w] + tail[w]
            if t > tail[v]:
                tail[v] = t
    return head, tail


def port_bound(dag: Dag, head_tail: tuple[list[float], list[float]] | None = None) -> float:
    """Busiest port with release dates: for every port and every threshold ``h``, the
    flows through it that cannot start before ``h`` need ``h + bytes / bandwidth`` plus
    the least tail among them (the classic single-machine head/tail bound). Valid heads
    and tails may be given (default: :func:`heads_and_tails`)."""
    flows = dag.flows()
    if not flows:
        return 0.0
    head, tail = head_tail or heads_and_tails(dag)
    on_port: dict[int, list[int]] = {}
    for v in flows:
        on_port.setdefault(dag.src_port[v], []).append(v)
        on_port.setdefault(dag.dst_port[v], []).append(v)
    best = 0.0
    for p, vs in on_port.items():
        vs.sort(key=lambda v: -head[v])
        work, least_tail = 0.0, math.inf
        for v in vs:
            work += dag.size[v]
            least_tail = min(least_tail, tail[v])
            best = max(best, head[v] + work / dag.port_capacity[p] + least_tail)
    return best


def chain_bound(dag: Dag) -> float:
    d = _durations(dag)
    head, _ = heads_and_tails(dag)
    return max((h + x for h, x in zip(head, d, strict=True)), default=0.0)


def _port_release(start: np.ndarray, size: np.ndarray, port: np.ndarray, cap: np.ndarray) -> float:
    """``max over ports p and h of h + bytes(flows on p starting >= h) / cap_p``: the
    earliest time by which all the given flows (starts ``start``) can have ended."""
    best = 0.0
    order = np.argsort(-start, kind="stable")
    start, size, port = start[order], size[order], port[order]
    for p in np.unique(port):
        on = port == p
        done = start[on] + np.cumsum(size[on]) / cap[p]
        best = max(best, float(done.max()))
    return best


FAN = 3  # a step with this many successors (a gate, a broadcast) gets the cone bound,
CONES = 150  # at most this many per pass, the widest first (fewer: still a valid bound)
WINDOW = 4000  # nodes looked back from it (fewer flows: still a valid bound)


def _sequence_bound(head: np.ndarray, size: np.ndarray, dist: np.ndarray, cap: float) -> float:
    """Flows (head, bytes, distance to the step) on one port: for a subset ``S``,
    ``min head + bytes(S) / cap + min distance``; subsets cut by head, then by distance."""
    best = 0.0
    for key in (head, dist):
        order = np.argsort(-key, kind="stable")
        low_h = np.minimum.accumulate(head[order])
        low_d = np.minimum.accumulate(dist[order])
        best = max(best, float((low_h + np.cumsum(size[order]) / cap + low_d).max()))
    return best


def _cone_bound(
    dag: Dag, d: list[float], at: list[float], v: int, done: list[int], after: list[list[int]]
) -> float:
    """The earliest start of ``v`` from the flows of its cone (the last ``WINDOW``
    nodes processed), each with the longest path from its end to ``v``'s start."""
    dist = {v: 0.0}
    for u in reversed(done[-WINDOW:]):
        best = -1.0
        for w in after[u]:
            if w in dist:
                best = max(best, d[w] + dist[w] if w != v else 0.0)
        if best >= 0.0:
            dist[u] = best
    fs = [f for f in dist if dag.kind[f] == FLOW]
    if not fs:
        return 0.0
    head = np.asarray([at[f] for f in fs] * 2)
    size = np.asarray([dag.size[f] for f in fs] * 2)
    gap = np.asarray([dist[f] for f in fs] * 2)
    port = np.asarray([dag.src_port[f] for f in fs] + [dag.dst_port[f] for f in fs])
    cap = dag.port_capacity
    return max(
        _sequence_bound(head[on], size[on], gap[on], cap[p])
        for p in np.unique(port)
        if (on := port == p).any()
    )


def _energetic_pass(
    dag: Dag, d: list[float], nodes: range, before: list[list[int]], after: list[list[int]]
) -> list[float]:
    """Heads (``nodes`` ascending, ``before`` = predecessors, ``after`` = successors) or
    tails (descending, the lists swapped): the longest path, raised at every compute
    step to the port release bound of the flows it (transitively) waits for, and at
    every fan-out step to the bound of its cone with path lengths to it."""
    flows = dag.flows()
    bit = {v: i for i, v in enumerate(flows)}
    size = np.asarray([dag.size[v] for v in flows] * 2)  # a flow uses two ports
    port = np.asarray([dag.src_port[v] for v in flows] + [dag.dst_port[v] for v in flows])
    cap = np.asarray(dag.port_capacity)
    nbytes = (len(flows) + 7) // 8 or 1
    reach = [0] * dag.num_nodes  # bitset over flows: the flows v waits for
    at = [0.0] * dag.num_nodes  # head (or tail) of v
    fans = [v for v in nodes if dag.kind[v] != FLOW and len(after[v]) >= FAN]
    fans.sort(key=lambda v: -len(after[v]))
    cones = set(fans[:CONES])
    done: list[int] = []
    for v in nodes:
        r, h = 0, 0.0
        for u in before[v]:
            r |= reach[u] | (1 << bit[u] if u in bit else 0)
            h = max(h, at[u] + d[u])
        if r and dag.kind[v] != FLOW:
            bits = np.frombuffer(r.to_bytes(nbytes, "little"), dtype=np.uint8)
            idx = np.flatnonzero(np.unpackbits(bits, bitorder="little")[: len(flows)])
            idx = np.concatenate([idx, idx + len(flows)])
            start = np.asarray([at[flows[i % len(flows)]] for i in idx])
            h = max(h, _port_release(start, size[idx], port[idx], cap))
            if v in cones:
                h = max(h, _cone_bound(dag, d, at, v, done, after))
        reach[v], at[v] = r, h
        done.append(v)
    return at


def energetic_heads_and_tails(dag: Dag) -> tuple[list[float], list[float]]:
    """Heads and tails that also count port work (see the module docstring)."""
    d = _durations(dag)
    n = dag.num_nodes
    pred: list[list[int]] = [[] for _ in range(n)]
    for v in range(n):
        for w in dag.succ[v]:
            pred[w].append(v)
    succ = [list(s) for s in dag.succ]
    head = _energetic_pass(dag, d, range(n), pred, succ)
    tail = _energetic_pass(dag, d, range(n - 1, -1, -1), succ, pred)
    return head, tail


def energetic_bound(dag: Dag) -> float:
    if dag.num_nodes == 0:
        return 0.0
    head, tail = energetic_heads_and_tails(dag)
    d = _durations(dag)
    chain = max(h + x + t for h, x, t in zip(head, d, tail, strict=True))
    return max(chain, port_bound(dag, (head, tail)))


def lower_bounds(w: Workload | Dag) -> Bounds:
    dag = w.dag if isinstance(w, Workload) else w
    busy = max(w.task_busy, default=0.0) if isinstance(w, Workload) else 0.0
    return Bounds(
        port=port_bound(dag),
        compute=busy,
        chain=chain_bound(dag),
        energetic=energetic_bound(dag),
    )
