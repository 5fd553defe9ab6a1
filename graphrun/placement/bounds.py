"""Lower bounds on the makespan of a placed job, valid for every flow-scheduling policy.

* **port**: the busiest NIC port: its bytes divided by its bandwidth — refined with
  release dates: the flows that cannot start before ``h`` (their head, from the chain
  bound below) need ``h + bytes / bandwidth + least tail`` for every ``h``;
* **compute**: the busiest task's total compute time (a task computes one step at a time);
* **chain**: the longest path through the DAG, every flow at the bandwidth of the
  slower of its two ports (no flow can go faster, whatever else happens).

The bound of a placement is the largest of the three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphrun.placement.dag import FLOW, Dag
from graphrun.placement.workload import Workload


@dataclass(frozen=True)
class Bounds:
    port: float
    compute: float
    chain: float

    @property
    def value(self) -> float:
        return max(self.port, self.compute, self.chain)


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


def port_bound(dag: Dag) -> float:
    """Busiest port with release dates: for every port and every threshold ``h``, the
    flows through it that cannot start before ``h`` need ``h + bytes / bandwidth`` plus
    the least tail among them (the classic single-machine head/tail bound)."""
    flows = dag.flows()
    if not flows:
        return 0.0
    head, tail = heads_and_tails(dag)
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


def lower_bounds(w: Workload | Dag) -> Bounds:
    dag = w.dag if isinstance(w, Workload) else w
    busy = max(w.task_busy, default=0.0) if isinstance(w, Workload) else 0.0
    return Bounds(port=port_bound(dag), compute=busy, chain=chain_bound(dag))
