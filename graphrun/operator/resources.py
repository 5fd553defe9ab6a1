"""The resources of each worker pod when a GraphJob carries a placement plan.

Worker pod ``i`` runs the roles of plan machine ``i``, so pods of different machines
ask for different resources. The ``resources`` of a worker's graphrun container are
built in three layers, each overriding the one before it per resource name:

1. the worker template's (``spec.replicaSpecs.worker.template``), as without a plan;
2. what the plan assumes: the ``demands`` of the roles the pod runs
   (``spec.placement.plan.demands``, written by ``graphrun plan``), added up, as
   requests of ``cpu`` (cores) and ``memory`` (GB, as ``M``/``G`` quantities) and, for
   GPUs, requests and limits of :data:`GPU` (Kubernetes does not overcommit them);
3. ``spec.placement.resources.<machine>``: requests and limits as written.

Without a plan the template's resources are used, plus ``runtime.gpusPerMachine``
GPUs (:func:`with_gpus`). Refused, one line naming the field: a request above its
limit; a cpu, memory or GPU request above the plan machine's
``spec.placement.plan.capacity``; a fraction of a GPU; ``resources`` for a machine that
gets no pod.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from graphrun.errors import SpecError
from graphrun.job.spec import GraphJob, resolve_placement
from graphrun.operator import layout as L
from graphrun.placement.job import RESOURCES, Demand

GPU = "nvidia.com/gpu"
KINDS = ("requests", "limits")
# resource name on Kubernetes -> (Demand field, bytes or units per Demand unit)
CAPACITY = {"cpu": ("cpu", 1), "memory": ("memory_gb", 10**9), GPU: ("gpus", 1)}


@dataclass
class _Layered:
    """requests/limits with, for each entry, the field it came from (for errors)."""

    values: dict[str, dict[str, Any]] = field(default_factory=lambda: {k: {} for k in KINDS})
    origin: dict[tuple[str, str], str] = field(default_factory=dict)

    def put(self, kind: str, name: str, value: Any, where: str) -> None:
        self.values[kind][name] = value
        self.origin[kind, name] = where

    def amount(self, kind: str, name: str) -> Decimal:
        value = self.values[kind][name]
        try:
            return parse_quantity(value)
        except (ValueError, TypeError) as exc:
            raise SpecError(
                f"{self.origin[kind, name]}: {value!r} is not a Kubernetes quantity"
            ) from exc


def cpu_quantity(cores: float) -> str:
    milli = math.ceil(cores * 1000 - 1e-6)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def memory_quantity(gb: float) -> str:
    mb = math.ceil(gb * 1000 - 1e-6)
    return f"{mb // 1000}G" if mb % 1000 == 0 else f"{mb}M"


def worker_resources(
    job: GraphJob,
    index: int,
    template: dict[str, Any] | None,
    where: str,
    demands: list[Demand] | None,
) -> dict[str, Any] | None:
    """The ``resources`` of worker ``index``'s graphrun container: ``template`` (the
    worker template's, found at field ``where``) with the plan's layers on top (see the
    module docstring; ``demands`` is :func:`machine_demands`); None when there are none.
    Raises SpecError for what is refused."""
    plan = job.spec.placement.plan
    if plan is None:
        return with_gpus(job, copy.deepcopy(template) if template is not None else None, where)
    machine = plan.machines[index]
    out = _Layered()
    base = copy.deepcopy(template or {})
    for kind in KINDS:
        for name, value in (base.get(kind) or {}).items():
            out.put(kind, name, value, f"{where}.{kind}.{name}")
    if demands is not None:
        _from_demand(out, demands[index], f"spec.placement.plan.demands (roles on {machine})")
    given = (job.spec.placement.resources or {}).get(machine)
    if given is not None:
        for kind in KINDS:
            for name, value in getattr(given, kind).items():
                out.put(kind, name, value, f"spec.placement.resources.{machine}.{kind}.{name}")
    _check(out, machine, plan.capacity.get(machine) if plan.capacity else None)
    resources = {**base, **{k: v for k, v in out.values.items() if v}}
    for kind in KINDS:
        if not out.values[kind]:
            resources.pop(kind, None)
    return resources or None


def with_gpus(job: GraphJob, resources: dict[str, Any] | None, where: str) -> dict[str, Any] | None:
    """``resources`` asking for the machine's ``runtime.gpusPerMachine`` GPUs (requests
    and limits of :data:`GPU`; Kubernetes does not overcommit them). A template that
    names another GPU count is refused in one line."""
    gpus = job.spec.runtime.machine_gpus
    if gpus <= 0:
        return resources
    out = resources or {}
    for kind in KINDS:
        given = (out.get(kind) or {}).get(GPU)
        if given is not None and str(given) != str(gpus):
            raise SpecError(
                f"{where}.{kind}.{GPU}: {given} disagrees with spec.runtime.gpusPerMachine ({gpus})"
            )
        out.setdefault(kind, {})[GPU] = str(gpus)
    return out


def machine_demands(job: GraphJob) -> list[Demand] | None:
    """Per job machine, the plan's demands of the roles its worker runs, added up; None
    without a plan or when the plan records no demands. (A plan's parameter servers
    count with ``training.sync: ps``; a job without them refuses a plan that places
    them.)"""
    plan = job.spec.placement.plan
    if plan is None or plan.demands is None:
        return None
    index = {m: i for i, m in enumerate(job.spec.machine_names)}
    totals = [dict.fromkeys(RESOURCES, 0.0) for _ in index]
    for role, machine in resolve_placement(job).items():
        demand = plan.demand_of(role)
        if demand is not None:
            for res in RESOURCES:
                totals[index[machine]][res] += getattr(demand, res)
    return [Demand(**t) for t in totals]


def _from_demand(out: _Layered, demand: Demand, where: str) -> None:
    if demand.cpu > 0:
        out.put("requests", "cpu", cpu_quantity(demand.cpu), where)
    if demand.memory_gb > 0:
        out.put("requests", "memory", memory_quantity(demand.memory_gb), where)
    if demand.gpus > 0:
        if demand.gpus != int(demand.gpus):
            raise SpecError(f"{where}: {demand.gpus:g} GPUs; Kubernetes gives whole GPUs ({GPU})")
        for kind in KINDS:
            out.put(kind, GPU, str(int(demand.gpus)), where)


def _check(out: _Layered, machine: str, capacity: Demand | None) -> None:
    requests, limits = out.values["requests"], out.values["limits"]
    for name in requests:
        if name in limits and out.amount("requests", name) > out.amount("limits", name):
            raise SpecError(
                f"{out.origin['limits', name]}: {limits[name]} is below the "
                f"{requests[name]} request of plan machine {machine} (from "
                f"{out.origin['requests', name]}); raise the limit or set "
                f"spec.placement.resources.{machine}"
            )
    if capacity is None:
        return
    for name, (res, unit) in CAPACITY.items():
        if name not in requests:
            continue
        have = getattr(capacity, res)
        if out.amount("requests", name) > Decimal(repr(have)) * unit:
            raise SpecError(
                f"{out.origin['requests', name]}: {requests[name]} of {name} is more than "
                f"plan machine {machine} has (spec.placement.plan.capacity.{machine}.{res}: "
                f"{have:g})"
            )


def check_machines(job: GraphJob) -> None:
    """``spec.placement.resources`` names only machines that get a worker pod."""
    plan, given = job.spec.placement.plan, job.spec.placement.resources
    if plan is None or not given:
        return
    with_pod = {plan.machines[i] for i in L.worker_indices(job)}
    for machine in given:
        if machine not in with_pod:
            raise SpecError(
                f"spec.placement.resources.{machine}: the plan gives {machine} no store server "
                "and no trainer, so it has no worker pod"
            )
