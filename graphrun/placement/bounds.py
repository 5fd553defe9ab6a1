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
  descendant flows. This is what sees the prefetch window: sampling of iteration
  ``i`` waits for the end of iteration ``i - prefetch - 1``, which waits for every
  byte of the earlier iterations on the busiest port, so the window's coupling of
  iterations adds to the port work instead of overlapping with it.

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


def _energetic_pass(dag: Dag, d: list[float], nodes: range, preds: list[list[int]]) -> list[float]:
    """Heads (``nodes`` ascending, ``preds`` = predecessors) or tails (descending,
    ``preds`` = successors): the longest path, raised at every compute step to the
    port release bound of the flows it (transitively) waits for."""
    flows = dag.flows()
    bit = {v: i for i, v in enumerate(flows)}
    size = np.asarray([dag.size[v] for v in flows] * 2)  # a flow uses two ports
    port = np.asarray([dag.src_port[v] for v in flows] + [dag.dst_port[v] for v in flows])
    cap = np.asarray(dag.port_capacity)
    nbytes = (len(flows) + 7) // 8 or 1
    reach = [0] * dag.num_nodes  # bitset over flows: the flows v waits for
    at = [0.0] * dag.num_nodes  # head (or tail) of v
    for v in nodes:
        r, h = 0, 0.0
        for u in preds[v]:
            r |= reach[u] | (1 << bit[u] if u in bit else 0)
            h = max(h, at[u] + d[u])
        if r and dag.kind[v] != FLOW:
            bits = np.frombuffer(r.to_bytes(nbytes, "little"), dtype=np.uint8)
            idx = np.flatnonzero(np.unpackbits(bits, bitorder="little")[: len(flows)])
            idx = np.concatenate([idx, idx + len(flows)])
            start = np.asarray([at[flows[i % len(flows)]] for i in idx])
            h = max(h, _port_release(start, size[idx], port[idx], cap))
        reach[v], at[v] = r, h
    return at


def energetic_heads_and_tails(dag: Dag) -> tuple[list[float], list[float]]:
    """Heads and tails that also count port work (see the module docstring)."""
    d = _durations(dag)
    n = dag.num_nodes
    pred: list[list[int]] = [[] for _ in range(n)]
    for v in range(n):
        for w in dag.succ[v]:
            pred[w].append(v)
    head = _energetic_pass(dag, d, range(n), pred)
    tail = _energetic_pass(dag, d, range(n - 1, -1, -1), [list(s) for s in dag.succ])
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
