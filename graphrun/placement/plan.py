"""The placement plan file: which machine runs each role of a job.

Written by ``graphrun plan``, read by the job spec, the launcher and the operator::

    apiVersion: graphrun.io/v1alpha1
    kind: PlacementPlan
    machines: [m0, m1, m2, m3]      # every machine the plan may use
    assignments:                    # role name -> machine name
      store:0: m0
      trainer:0: m1
      sampler:0:0: m1
      ps:0: m0
    capacity:                       # optional: each machine's resources (the cluster file's)
      m0: {cpu: 32, memory_gb: 256, gpus: 0}
    demands:                        # optional: what each assigned role needs
      store:0: {cpu: 2, memory_gb: 60}
      trainer:0: {cpu: 4, memory_gb: 16}

``graphrun plan`` writes ``capacity`` and ``demands`` (cores, GB of memory, GPUs), so a
plan says what it assumes; the operator turns the demands of a machine's roles into its
worker pod's resource requests. When both are given, the roles on a machine must fit
its capacity: a plan that overfills a machine is refused naming ``capacity.<machine>``.

Role names: ``store:<p>`` (main store server of partition p), ``store:<p>:<b>`` (its
backup b >= 1), ``trainer:<r>``, ``sampler:<r>:<w>``, ``ps:<i>``. Every assigned
machine must be listed in ``machines``. :func:`load_plan` checks the file against the
machines and roles a caller knows, so a plan naming an unknown machine or role is
rejected with one line naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from graphrun.errors import SpecError
from graphrun.names import PLACED, ROLE_GRAMMAR, RoleName
from graphrun.placement._io import read_yaml, validate, write_file
from graphrun.placement.cluster import MAX_MACHINES
from graphrun.placement.job import MAX_TASKS, RESOURCES, Demand


class PlacementPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    apiVersion: Literal["graphrun.io/v1alpha1"] = Field(
        default="graphrun.io/v1alpha1", description="the API version of placement plans"
    )
    kind: Literal["PlacementPlan"] = Field(default="PlacementPlan", description="the kind")
    machines: list[str] = Field(
        min_length=1, max_length=MAX_MACHINES,
        description="the plan's machines, in the job's machine order (node names on "
        "Kubernetes, or values of placement.nodeLabel)",
    )  # fmt: skip
    assignments: dict[str, str] = Field(
        max_length=MAX_TASKS, description="role (store:0, trainer:1, ...) -> plan machine"
    )
    capacity: dict[str, Demand] | None = Field(
        default=None, description="machine -> its cpu (cores), memory_gb and gpus"
    )
    demands: dict[str, Demand] | None = Field(
        default=None, description="role -> the cpu (cores), memory_gb and gpus it needs"
    )
    # the assignments by role, read once with the plan (the file's keys stay its text)
    _by_role: dict[RoleName, str] = PrivateAttr(default_factory=dict)

    @field_validator("machines")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        seen = set()
        for name in v:
            if not name:
                raise ValueError("a machine name is empty")
            if name in seen:
                raise ValueError(f"machine {name!r} is listed twice")
            seen.add(name)
        return v

    @model_validator(mode="after")
    def _known(self) -> PlacementPlan:
        by_role = {}
        for text, machine in self.assignments.items():
            role = placed_role(text)
            if role is None:
                raise ValueError(
                    f"assignments.{text}: {text!r} is not a role name ({ROLE_GRAMMAR})"
                )
            if machine not in self.machines:
                raise ValueError(f"assignments.{text}: machine {machine!r} is not in machines")
            by_role[role] = machine
        self._by_role = by_role
        for machine in self.capacity or {}:
            if machine not in self.machines:
                raise ValueError(f"capacity.{machine}: not in machines")
        for name in self.demands or {}:
            if name not in self.assignments:
                raise ValueError(f"demands.{name}: not in assignments")
        self._fits()
        return self

    def _fits(self) -> None:
        """The roles on every machine with a capacity ask at most that capacity."""
        if not self.capacity or not self.demands:
            return
        for machine, cap in self.capacity.items():
            roles = [r for r in self.roles_on(machine) if r in self.demands]
            total = self.demand_on(machine)
            for res in RESOURCES:
                need, have = getattr(total, res), getattr(cap, res)
                if need > have * (1 + 1e-9) + 1e-9:
                    raise ValueError(
                        f"capacity.{machine}.{res}: the roles on {machine} "
                        f"({', '.join(roles)}) need {need:g}, the machine has {have:g}"
                    )

    def demand_on(self, machine: str) -> Demand | None:
        """The summed demands of the roles the plan puts on ``machine``; None when the
        plan records no demands."""
        if self.demands is None:
            return None
        roles = [r for r in self.roles_on(machine) if r in self.demands]
        return Demand(
            **{res: sum(getattr(self.demands[r], res) for r in roles) for res in RESOURCES}
        )

    @property
    def by_role(self) -> dict[RoleName, str]:
        """Role -> plan machine: the assignments, read once with the plan."""
        return dict(self._by_role)

    def machine_of(self, role: RoleName) -> str | None:
        """The machine the plan gives ``role`` (None: it gives none)."""
        return self._by_role.get(role)

    def demand_of(self, role: RoleName) -> Demand | None:
        """What the plan says ``role`` needs (None: it does not say)."""
        return None if self.demands is None else self.demands.get(str(role))

    def roles_on(self, machine: str) -> list[str]:
        return [r for r, m in self.assignments.items() if m == machine]


def placed_role(text: str) -> RoleName | None:
    """The role an assignment's key (a file's text) names, read once, with its file;
    None when it is no role a placement places."""
    role = RoleName.parse(text) if RoleName.is_valid(text) else None
    return role if role is not None and role.kind in PLACED else None


def plan_from_dict(
    data: Any,
    where: str = "plan",
    *,
    machines: Sequence[str] | None = None,
    roles: Iterable[RoleName] | None = None,
    require_all: bool = False,
) -> PlacementPlan:
    """Validate a plan; with ``machines``/``roles`` also check it names only those."""
    plan = validate(PlacementPlan, data, where)
    if machines is not None:
        known = set(machines)
        for name in plan.machines:
            if name not in known:
                raise SpecError(f"{where}: machines: {name!r} is not a machine of the cluster")
    if roles is not None:
        wanted = list(roles)
        allowed = set(wanted)
        for role in plan.by_role:
            if role not in allowed:
                raise SpecError(f"{where}: assignments.{role}: not a role of this job")
        if require_all:
            for role in wanted:
                if plan.machine_of(role) is None:
                    raise SpecError(f"{where}: assignments.{role}: missing")
    return plan


def load_plan(
    path: str | Path,
    *,
    machines: Sequence[str] | None = None,
    roles: Iterable[RoleName] | None = None,
    require_all: bool = False,
) -> PlacementPlan:
    """Read a plan file (see the module docstring) and check it."""
    return plan_from_dict(
        read_yaml(path), str(path), machines=machines, roles=roles, require_all=require_all
    )


def plan_data(plan: PlacementPlan) -> dict[str, Any]:
    """The plan as YAML data (absent optional fields left out)."""
    return plan.model_dump(exclude_none=True)


def dump_plan(plan: PlacementPlan, comments: Sequence[str] = ()) -> str:
    head = "".join(f"# {line}\n" for line in comments)
    body = yaml.safe_dump(plan_data(plan), sort_keys=False, default_flow_style=False)
    return head + body


def write_plan(plan: PlacementPlan, path: str | Path, comments: Sequence[str] = ()) -> Path:
    """Write the plan atomically (temp file, then rename)."""
    return write_file(path, dump_plan(plan, comments))


def make_plan(
    machine_names: Sequence[str],
    roles: Sequence[RoleName],
    placement: Sequence[int],
    *,
    capacity: Mapping[str, Demand] | None = None,
    demands: Mapping[str, Demand] | None = None,
) -> PlacementPlan:
    """A plan from machine indices per role (``placement[i]`` runs ``roles[i]``), with
    the capacities and demands it assumes when given."""
    if len(roles) != len(placement):
        raise SpecError(f"plan: {len(placement)} machines for {len(roles)} roles")
    return PlacementPlan(
        machines=list(machine_names),
        assignments={str(r): machine_names[m] for r, m in zip(roles, placement, strict=True)},
        capacity=dict(capacity) if capacity is not None else None,
        demands=dict(demands) if demands is not None else None,
    )


def placement_of(
    plan: PlacementPlan, machine_names: Sequence[str], roles: Sequence[RoleName]
) -> tuple[int, ...]:
    """Machine indices per role (the inverse of :func:`make_plan`); every role must be assigned."""
    index = {m: i for i, m in enumerate(machine_names)}
    out = []
    for role in roles:
        m = plan.machine_of(role)
        if m is None:
            raise SpecError(f"plan: assignments.{role}: missing")
        if m not in index:
            raise SpecError(f"plan: assignments.{role}: machine {m!r} is not in the cluster")
        out.append(index[m])
    return tuple(out)
