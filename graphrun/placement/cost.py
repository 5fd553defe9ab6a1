"""Scoring placements: capacity violation, expected traffic, and the cached cost evaluator.

``cost(x) = simulated makespan(x) * (1 + lam * violation(x))`` where ``violation`` sums,
over machines and resources, the overload relative to the capacity (a resource a
machine lacks counts as capacity 1). A placement is feasible when violation is 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from graphrun.errors import SpecError
from graphrun.names import RoleName, home_partition
from graphrun.placement import _kernel
from graphrun.placement.bounds import chain_bound
from graphrun.placement.cluster import Cluster
from graphrun.placement.job import RESOURCES, Job
from graphrun.placement.oes import Policy, simulate_arrays
from graphrun.placement.workload import (
    Scenario,
    Template,
    make_template,
    to_dag,
    traffic_matrix,
)

Placement = tuple[int, ...]


def demand_matrix(job: Job) -> np.ndarray:
    return np.array([t.demand for t in job.tasks], dtype=float).reshape(-1, len(RESOURCES))


def capacity_matrix(cluster: Cluster) -> np.ndarray:
    return np.array([cluster.capacity(r) for r in RESOURCES], dtype=float).T


def violation(cluster: Cluster, job: Job, placement: Sequence[int]) -> float:
    x = np.asarray(placement, dtype=np.int64)
    return float(_kernel.overload(demand_matrix(job), x, capacity_matrix(cluster)))


def check_feasible(cluster: Cluster, job: Job) -> None:
    """Raise SpecError when some task fits on no machine or the job exceeds the cluster."""
    dem, cap = demand_matrix(job), capacity_matrix(cluster)
    for k, res in enumerate(RESOURCES):
        for t, task in enumerate(job.tasks):
            if dem[t, k] > cap[:, k].max():
                raise SpecError(
                    f"{job.source}: demands.{task.kind}.{res}: {dem[t, k]:g} fits on no machine "
                    f"(largest {res} is {cap[:, k].max():g}) for {task.role}"
                )
        if dem[:, k].sum() > cap[:, k].sum():
            raise SpecError(
                f"{job.source}: demands: total {res} {dem[:, k].sum():g} exceeds the cluster's "
                f"{cap[:, k].sum():g}"
            )


def expected_traffic(job: Job) -> np.ndarray:
    """Symmetric (tasks, tasks) matrix of mean bytes exchanged per iteration."""
    spec, prof = job.spec, job.profile
    idx = {t.role: i for i, t in enumerate(job.tasks)}
    tr = np.zeros((len(job.tasks), len(job.tasks)))
    ns = spec.samplers_per_trainer

    def add(a: RoleName, b: RoleName, v: float) -> None:
        tr[idx[a], idx[b]] += v
        tr[idx[b], idx[a]] += v

    for r in range(spec.trainers):
        own = home_partition(r, spec.trainers, spec.partitions)
        trainer = RoleName.trainer(r)
        samplers = [RoleName.sampler(r, w) for w in range(ns)] or [trainer]
        for q in range(spec.partitions):
            kind = "own" if q == own else "other"
            add(RoleName.store(q), trainer, prof[f"feature_{kind}"].mean)
            for s in samplers:
                add(RoleName.store(q), s, prof[f"structure_{kind}"].mean / len(samplers))
        for s in samplers:
            if s != trainer:
                add(s, trainer, prof["batch_bytes"].mean / len(samplers))
        grad = prof["grad_bytes"].mean
        if spec.sync == "ps":
            for j in range(spec.parameter_servers):
                add(trainer, RoleName.ps(j), 2 * grad / spec.parameter_servers)
        elif spec.trainers > 1:
            ring = 2 * (spec.trainers - 1) / spec.trainers * grad
            add(trainer, RoleName.trainer((r + 1) % spec.trainers), ring / 2)
    return tr


def _key(placement: Sequence[int]) -> Placement:
    """The cache key: a tuple of Python ints (tuples from the search pass through)."""
    if type(placement) is tuple:
        return placement
    return tuple(map(int, placement))


@dataclass
class Evaluator:
    """Scores placements of one job on one cluster, on one fixed :class:`Scenario`."""

    cluster: Cluster
    scenario: Scenario
    policy: Policy = Policy.PRIORITY
    lam: float = 10.0
    simulations: int = 0
    _cache: dict[Placement, float] = field(default_factory=dict, repr=False)
    _viol: dict[Placement, float] = field(default_factory=dict, repr=False)
    _floor: float | None = field(default=None, repr=False)
    _traffic: np.ndarray | None = field(default=None, repr=False)
    _template: Template | None = field(default=None, repr=False)
    _demand: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    _bw: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def job(self) -> Job:
        return self.scenario.job

    def makespan(self, placement: Sequence[int]) -> float:
        key = _key(placement)
        got = self._cache.get(key)
        if got is None:
            got = simulate_arrays(self._template_().place(self.cluster, key), self.policy)[0]
            self.simulations += 1
            self._cache[key] = got
        return got

    def _template_(self) -> Template:
        if self._template is None:
            self._template = make_template(self.scenario)
        return self._template

    def violation(self, placement: Sequence[int]) -> float:
        key = _key(placement)
        got = self._viol.get(key)
        if got is None:
            if self._demand is None:
                self._demand = demand_matrix(self.job), capacity_matrix(self.cluster)
            x = np.asarray(key, dtype=np.int64)
            got = self._viol[key] = float(_kernel.overload(self._demand[0], x, self._demand[1]))
        return got

    def floor(self) -> float:
        """A makespan no placement can beat: the compute-only critical path (every task
        on one machine, all flows free, capacities ignored, every step as fast as the
        fastest machine runs it alone)."""
        if self._floor is None:
            tpl = self._template_()
            zeros = (0,) * len(self.job.tasks)
            self._floor = chain_bound(
                to_dag(tpl.place(self.cluster, zeros, tpl.best_slowdown(self.cluster)))
            )
        return self._floor

    def port_floor(self, placement: Sequence[int]) -> float:
        """Busiest port's bytes / bandwidth, from the task traffic matrix (no DAG)."""
        if self._traffic is None or self._bw is None:
            self._traffic = traffic_matrix(self.scenario)
            self._bw = np.asarray(self.cluster.egress), np.asarray(self.cluster.ingress)
        x = np.asarray(placement, dtype=np.int64)
        return float(_kernel.port_load(self._traffic, x, self._bw[0], self._bw[1]))

    def cost_floor(self, placement: Sequence[int]) -> float:
        """A lower bound on :meth:`cost` that needs no simulation: the larger of the
        compute-only critical path and the busiest port, times the violation factor."""
        ms = max(self.floor(), self.port_floor(placement))
        return ms * (1.0 + self.lam * self.violation(placement))

    def cost(self, placement: Sequence[int]) -> float:
        return self.makespan(placement) * (1.0 + self.lam * self.violation(placement))
