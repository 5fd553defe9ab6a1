"""The spec's placement section: where roles run (assignments, a plan, resources)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PrivateAttr, model_validator

from graphrun.job.spec.base import LABEL_KEY_PATTERN, PRESERVE, SpecModel
from graphrun.names import ROLE_GRAMMAR, RoleName
from graphrun.placement.plan import PlacementPlan, placed_role

# A Kubernetes resource quantity ("2", "500m", "8Gi", "1.5e9"): what a Pod accepts.
QUANTITY_PATTERN = re.compile(r"^(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?$")
# A resource name: cpu, memory, ephemeral-storage, hugepages-2Mi, nvidia.com/gpu, ...
RESOURCE_NAME = re.compile(LABEL_KEY_PATTERN)


def _quantity(value: Any) -> str:
    text = str(value).strip()
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 2, 500m, 8Gi)")
    if not QUANTITY_PATTERN.match(text):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 2, 500m, 8Gi)")
    return text


# A number or a string in YAML (``cpu: 2``, ``memory: 8Gi``), kept as its string.
Quantity = Annotated[str, BeforeValidator(_quantity), Field(json_schema_extra=PRESERVE)]


class MachineResources(SpecModel):
    """A container's resources as in a Pod, e.g. {requests: {cpu: 4}, limits: {memory: 20Gi}}."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="resource name -> quantity the pod requests"
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="resource name -> quantity the pod may use at most"
    )

    @model_validator(mode="after")
    def _names(self) -> MachineResources:
        for kind in ("requests", "limits"):
            for name in getattr(self, kind):
                if not RESOURCE_NAME.match(name):
                    raise ValueError(
                        f"{kind}: {name!r} is not a resource name (e.g. cpu, memory, "
                        "nvidia.com/gpu)"
                    )
        return self


class PlacementSpec(SpecModel):
    """Where roles run. Empty: co-located (machine k holds partition k's stores, and trainers
    ``k*T .. k*T+T-1`` with their samplers). Give at most one of:

    - ``assignments``: role -> job machine name (``m0``, ...); roles it leaves out keep
      their co-located machine;
    - ``planFile``: a PlacementPlan YAML written by ``graphrun plan`` (relative to the job
      file; the local backend only: the operator cannot read the user's files);
    - ``plan``: the same PlacementPlan inline (what the operator takes).

    A plan's machines map to the job's machines by position (``plan.machines[i]`` is
    machine ``i``); on Kubernetes they are also the nodes the worker pods must run on:
    node names, or the values of the node label ``nodeLabel`` when it is set. The worker
    pod of a plan machine requests what the plan's ``demands`` for that machine's roles
    add up to; ``resources`` (plan machine -> requests/limits) overrides that per machine
    (see graphrun.operator.resources). ``graphrun run`` ignores ``resources``."""

    assignments: dict[str, str] | None = Field(
        default=None, description='role -> machine name, e.g. {"trainer:0": m1}'
    )
    plan_file: str | None = Field(
        default=None,
        min_length=1,
        description="a PlacementPlan YAML (graphrun plan), relative to the job file",
    )
    plan: PlacementPlan | None = Field(
        default=None,
        description="a PlacementPlan inline (graphrun plan): machines and role -> machine",
    )
    node_label: str | None = Field(
        default=None,
        max_length=316,
        pattern=LABEL_KEY_PATTERN,
        description="Kubernetes: plan machines are the values of this node label "
        "(e.g. graphrun.io/machine); default: plan machines are node names",
    )
    resources: dict[str, MachineResources] | None = Field(
        default=None,
        description="Kubernetes: plan machine -> the resources of its worker pod's graphrun "
        "container (override what the plan's demands and the worker template give)",
    )
    # the assignments by role, read once with the spec (the file's keys stay its text)
    _by_role: dict[RoleName, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _one_plan(self) -> PlacementSpec:
        given = [self.assignments, self.plan_file, self.plan]
        if sum(x is not None for x in given) > 1:
            raise ValueError("give at most one of assignments, planFile, plan")
        if self.node_label is not None and self.plan is None and self.plan_file is None:
            raise ValueError("nodeLabel: only used with a plan (its machines are nodes)")
        if self.resources is not None and self.plan is None and self.plan_file is None:
            raise ValueError("resources: only used with a plan (its keys are plan machines)")
        if self.resources is not None and self.plan is not None:
            for machine in self.resources:
                if machine not in self.plan.machines:
                    raise ValueError(
                        f"resources.{machine}: not a machine of the plan "
                        f"(plan.machines: {', '.join(self.plan.machines)})"
                    )
        by_role = {}
        for text, machine in (self.assignments or {}).items():
            role = placed_role(text)
            if role is None:
                raise ValueError(f"assignments: {text!r} is not a role name ({ROLE_GRAMMAR})")
            by_role[role] = machine
        self._by_role = by_role
        return self

    @property
    def by_role(self) -> dict[RoleName, str] | None:
        """Role -> machine: ``assignments``, read once with the spec (None: none given)."""
        return None if self.assignments is None else dict(self._by_role)
