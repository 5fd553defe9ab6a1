"""Lower bounds on the makespan of a placed job, valid for every flow-scheduling policy.

* **port**: the busiest NIC port's bytes divided by its bandwidth;
* **compute**: the busiest task's total compute time (a task computes one step at a time);
* **chain**: the longest path through the DAG, every flow at the bandwidth of the
  slower of its two ports (no flow can go faster, whatever else happens).

The bound of a placement is the largest of the three.
"""

from __future__ import annotations

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


def port_bound(dag: Dag) -> float:
    if not dag.flows():
        return 0.0
    return float(max(b / c for b, c in zip(dag.port_bytes(), dag.port_capacity, strict=True)))


def chain_bound(dag: Dag) -> float:
    """Longest path; nodes are in topological order by construction (deps precede)."""
    cap = dag.port_capacity
    start = [0.0] * dag.num_nodes
    best = 0.0
    for v in range(dag.num_nodes):
        if dag.kind[v] == FLOW:
            d = dag.size[v] / min(cap[dag.src_port[v]], cap[dag.dst_port[v]])
        else:
            d = dag.duration[v]
        f = start[v] + d
        best = max(best, f)
        for w in dag.succ[v]:
            if f > start[w]:
                start[w] = f
    return best


def lower_bounds(w: Workload | Dag) -> Bounds:
    dag = w.dag if isinstance(w, Workload) else w
    busy = max(w.task_busy, default=0.0) if isinstance(w, Workload) else 0.0
    return Bounds(port=port_bound(dag), compute=busy, chain=chain_bound(dag))
