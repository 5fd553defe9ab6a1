"""Baseline placements and the exhaustive optimum (tiny instances only).

* :func:`colocation` — what DistDGL does (and ``graphrun run`` without a plan): machine
  ``p`` hosts the store of partition ``p``, the trainers whose home partition it is
  (:func:`graphrun.names.home_partition`) and their samplers; parameter servers
  round-robin.
* :func:`random_feasible` — tasks in random order, each on a random machine with room.
* :func:`first_fit_decreasing` — tasks by memory demand, each on the first machine with room.
* :func:`exhaustive` — every placement, the feasible one of least makespan.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from graphrun.errors import ArgumentError, SpecError
from graphrun.names import home_partition
from graphrun.placement.cluster import Cluster
from graphrun.placement.cost import Evaluator, Placement, capacity_matrix, demand_matrix
from graphrun.placement.job import Job

MAX_EXHAUSTIVE = 200_000


def colocation(cluster: Cluster, job: Job) -> Placement:
    m, p = cluster.size, job.spec.partitions
    out = []
    for t in job.tasks:
        if t.kind == "store":
            out.append(t.index % m)
        elif t.kind in ("trainer", "sampler"):
            out.append(home_partition(t.index, job.spec.trainers, p) % m)
        else:
            out.append(t.index % m)
    return tuple(out)


def _fits(free: np.ndarray, need: np.ndarray) -> np.ndarray:
    return np.all(free >= need - 1e-9, axis=1)


def random_feasible(
    cluster: Cluster, job: Job, rng: np.random.Generator, tries: int = 100
) -> Placement:
    dem, cap = demand_matrix(job), capacity_matrix(cluster)
    for _ in range(tries):
        free = cap.copy()
        place = [-1] * len(job.tasks)
        for t in rng.permutation(len(job.tasks)):
            ok = np.flatnonzero(_fits(free, dem[t]))
            if ok.size == 0:
                break
            m = int(rng.choice(ok))
            place[t] = m
            free[m] -= dem[t]
        else:
            return tuple(place)
    raise SpecError(f"placement: no random feasible placement found in {tries} tries")


def first_fit_decreasing(cluster: Cluster, job: Job) -> Placement:
    dem, free = demand_matrix(job), capacity_matrix(cluster).copy()
    place = [-1] * len(job.tasks)
    for t in sorted(range(len(job.tasks)), key=lambda t: (-dem[t, 1], -dem[t, 0], t)):
        ok = np.flatnonzero(_fits(free, dem[t]))
        if ok.size == 0:
            raise SpecError(f"placement: first-fit found no room for {job.tasks[t].role}")
        place[t] = int(ok[0])
        free[ok[0]] -= dem[t]
    return tuple(place)


def exhaustive(ev: Evaluator) -> tuple[Placement, float]:
    """The feasible placement of least makespan, by enumeration (``M**T`` placements)."""
    m, n = ev.cluster.size, len(ev.job.tasks)
    if m**n > MAX_EXHAUSTIVE:
        raise ArgumentError(f"exhaustive: {m}**{n} placements is too many")
    best: Placement = ()
    best_ms = math.inf
    for x in itertools.product(range(m), repeat=n):
        if ev.violation(x) == 0:
            ms = ev.makespan(x)
            if ms < best_ms:
                best, best_ms = x, ms
    if not best:
        raise SpecError("placement: no feasible placement exists")
    return best, best_ms
