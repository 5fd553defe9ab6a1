"""One call from (cluster, job) to a plan: IFS, then ETP, compared with co-location.

The chain starts from the better of IFS and co-location (when co-location fits), so
the plan ``graphrun plan`` writes is never slower in simulation than co-location.

This is what ``graphrun plan`` runs; the benchmark composes the same pieces itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphrun.placement.baselines import colocation
from graphrun.placement.bounds import Bounds, lower_bounds
from graphrun.placement.cluster import Cluster
from graphrun.placement.cost import Evaluator, Placement, check_feasible
from graphrun.placement.job import Demand, Job
from graphrun.placement.oes import Policy
from graphrun.placement.plan import PlacementPlan, make_plan
from graphrun.placement.search import TEMPERING, Progress, SearchResult, etp, ifs
from graphrun.placement.workload import build_workload, make_scenario


@dataclass(frozen=True)
class PlanOutcome:
    plan: PlacementPlan
    placement: Placement
    makespan: float  # simulated seconds for job.spec.iterations iterations
    ifs_makespan: float
    colocation_makespan: float | None  # None when co-location does not fit
    bounds: Bounds  # lower bounds of the chosen placement
    search: SearchResult


@dataclass(frozen=True)
class PlanOptions:
    seed: int = 0
    max_seconds: float | None = 30.0
    max_steps: int | None = None
    beta: float = 200.0
    tempering: tuple[float, ...] = TEMPERING  # replica exchange betas; () for one chain
    lam: float = 10.0
    policy: Policy = Policy.PRIORITY
    progress: Progress | None = None  # told where the search stands every few seconds


def optimize(cluster: Cluster, job: Job, options: PlanOptions = PlanOptions()) -> PlanOutcome:
    """IFS then ETP within the budget of ``options``; the best feasible placement as a plan."""
    check_feasible(cluster, job)
    ev = Evaluator(cluster, make_scenario(job, options.seed), options.policy, options.lam)
    first = ifs(ev)
    co = colocation(cluster, job)
    # Both are simulated before the search's clock starts (the first simulation also
    # compiles the simulator: it used to eat a short budget whole, leaving 0 steps), and
    # the chain starts from the better one, so a plan is never worse than co-location.
    ifs_makespan = ev.makespan(first)
    co_makespan = ev.makespan(co) if ev.violation(co) == 0 else None
    start = co if co_makespan is not None and co_makespan < ifs_makespan else first
    result = etp(
        ev,
        start,
        beta=options.beta,
        tempering=options.tempering,
        seed=options.seed,
        max_seconds=options.max_seconds,
        max_steps=options.max_steps,
        progress=options.progress,
    )
    capacity = {
        m: Demand(cpu=cluster.cpu[i], memory_gb=cluster.memory_gb[i], gpus=cluster.gpus[i])
        for i, m in enumerate(cluster.names)
    }
    demands = {
        str(t.role): Demand(cpu=t.demand[0], memory_gb=t.demand[1], gpus=t.demand[2])
        for t in job.tasks
    }
    return PlanOutcome(
        plan=make_plan(
            cluster.names, job.roles, result.placement, capacity=capacity, demands=demands
        ),
        placement=result.placement,
        makespan=result.makespan,
        ifs_makespan=ifs_makespan,
        colocation_makespan=co_makespan,
        bounds=lower_bounds(build_workload(cluster, ev.scenario, result.placement)),
        search=result,
    )
