"""Lower bounds on the makespan of a placed job, valid for every flow-scheduling policy.

* **port**: the busiest NIC port: its bytes divided by its bandwidth, plus the earliest
  any of its flows can start (head) and the least time that must follow the end of
  any of its flows (tail) — heads and tails from the chain bound below;
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
    flows = dag.flows()
    if not flows:
        return 0.0
    head, tail = heads_and_tails(dag)
    ports = 2 * dag.num_machines
    work = [0.0] * ports
    first = [math.inf] * ports
    last = [math.inf] * ports
    for v in flows:
        for p in (dag.src_port[v], dag.dst_port[v]):
            work[p] += dag.size[v]
            first[p] = min(first[p], head[v])
            last[p] = min(last[p], tail[v])
    return max(
        first[p] + work[p] / dag.port_capacity[p] + last[p] for p in range(ports) if work[p] > 0
    )


def chain_bound(dag: Dag) -> float:
    d = _durations(dag)
    head, _ = heads_and_tails(dag)
    return max((h + x for h, x in zip(head, d, strict=True)), default=0.0)


def lower_bounds(w: Workload | Dag) -> Bounds:
    dag = w.dag if isinstance(w, Workload) else w
    busy = max(w.task_busy, default=0.0) if isinstance(w, Workload) else 0.0
    return Bounds(port=port_bound(dag), compute=busy, chain=chain_bound(dag))
