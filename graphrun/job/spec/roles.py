"""A job's roles and the machines they run on: :func:`job_roles` (co-located by
default) and :func:`resolve_placement` (assignments or a plan applied, checked)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from graphrun.errors import SpecError
from graphrun.job.spec.job import GraphJob, GraphJobSpec
from graphrun.names import RoleName
from graphrun.placement.plan import PlacementPlan, load_plan


@dataclass(frozen=True)
class Role:
    """One process of a job and the machine it runs on (by default: co-located)."""

    id: RoleName
    machine: str

    @property
    def name(self) -> str:
        return str(self.id)

    @property
    def kind(self) -> str:
        return self.id.kind

    @property
    def part(self) -> int | None:
        return self.id.index if self.id.kind == "store" else None

    @property
    def backup(self) -> int | None:
        return self.id.sub if self.id.kind == "store" else None

    @property
    def rank(self) -> int | None:
        return self.id.index if self.id.kind in ("trainer", "sampler") else None

    @property
    def worker(self) -> int | None:
        return self.id.sub if self.id.kind == "sampler" else None


def replica_machine(machines: list[str], primary: str, k: int = 1) -> str:
    """The default machine of replica ``k`` of a partition whose primary is on
    ``primary``: the ``k``-th machine after it, in the job's machine order (a plan may
    assign it elsewhere, never beside its primary)."""
    return machines[(machines.index(primary) + k) % len(machines)]


def job_roles(spec: GraphJobSpec) -> list[Role]:
    """Every role of the job, with its co-located default machine, in start order:
    store servers (partition order, main before backups), the partitions' replicas
    (``runtime.replicas``: on the next machine), parameter servers (``ps:j`` on machine
    ``j % machines``), then trainers with their samplers. Partition k's stores default to
    machine ``k % machines``."""
    names = spec.machine_names
    r = spec.runtime
    roles: list[Role] = []
    for part in range(spec.num_parts if spec.graph.store is None else 0):  # else: not ours
        m = names[part % len(names)]
        for b in range(r.store_servers_per_machine):
            roles.append(Role(RoleName.store(part, b), m))
    for part in range(spec.num_parts if spec.graph.store is None else 0):
        for k in range(1, r.replicas):
            m = replica_machine(names, names[part % len(names)], k)
            roles.append(Role(RoleName.store(part, replica=k), m))
    for j in range(spec.num_ps):
        roles.append(Role(RoleName.ps(j), names[j % len(names)]))
    for rank in range(spec.num_trainers):
        m = names[rank // r.trainers_per_machine]
        roles.append(Role(RoleName.trainer(rank), m))
        for w in range(r.sampler_workers_per_trainer):
            roles.append(Role(RoleName.sampler(rank, w), m))
    return roles


def resolve_placement(job: GraphJob, base_dir: str | Path = ".") -> dict[RoleName, str]:
    """Role -> machine name for every role of the job (co-located by default).

    Explicit assignments (inline, from an inline ``placement.plan`` or from
    ``placement.planFile``, relative to ``base_dir``) override the default; they must
    name roles of this job and machines it has. A plan's machines map to the job's
    machines by position."""
    spec = job.spec
    placement = {role.id: role.machine for role in job_roles(spec)}
    machines = spec.machine_names
    where = "spec.placement.assignments."
    explicit = spec.placement.by_role
    if spec.placement.plan_file is not None:
        plan_path = Path(base_dir) / spec.placement.plan_file
        explicit = plan_assignments(load_plan(plan_path), machines, f"{plan_path}: ")
        where = f"{plan_path}: assignments."
    elif spec.placement.plan is not None:
        explicit = plan_assignments(spec.placement.plan, machines, "spec.placement.plan.")
        where = "spec.placement.plan.assignments."
    assigned: dict[RoleName, str] = {}
    for role, machine in (explicit or {}).items():
        if role not in placement and role.kind == "ps":
            raise SpecError(
                f"{where}{role}: the plan places a parameter server; run it with "
                "training.sync: ps and runtime.parameterServers (the plan's count)"
            )
        if role not in placement:
            raise SpecError(f"{where}{role}: the job has no such role")
        if machine not in machines:
            raise SpecError(
                f"{where}{role}: unknown machine {machine!r} (machines: {', '.join(machines)})"
            )
        placement[role] = assigned[role] = machine
    _backups_beside_their_main(spec, placement, assigned, where)
    _replicas_away_from_their_primary(spec, placement, assigned, where)
    _samplers_beside_their_trainer(spec, placement, assigned, where)
    return placement


def _samplers_beside_their_trainer(
    spec: GraphJobSpec, placement: dict[RoleName, str], explicit: dict[RoleName, str], where: str
) -> None:
    """Sampler workers run in their trainer's process tree (its data loader starts them),
    so they run on the trainer's machine: they follow it unless assigned, and a plan that
    puts one elsewhere is refused rather than silently not followed."""
    _follow_anchor(
        spec, placement, explicit, where,
        lambda role: RoleName.trainer(role.id.index) if role.kind == "sampler" else None,
        "sampler workers run on their trainer's machine ({anchor} is on {machine}); "
        "running them elsewhere is not supported yet",
    )  # fmt: skip


def _replicas_away_from_their_primary(
    spec: GraphJobSpec, placement: dict[RoleName, str], explicit: dict[RoleName, str], where: str
) -> None:
    """A replica is there to outlive its primary's machine: when the primary is placed
    and the replica is not, it moves to the machine after the primary's; assigned
    beside its primary (or beside another copy of its partition), it is refused."""
    for role in job_roles(spec):
        if role.kind != "store" or not role.id.replica:
            continue
        primary = placement[RoleName.store(role.id.index)]
        if role.id not in explicit:
            placement[role.id] = replica_machine(spec.machine_names, primary, role.id.replica)
        copies = [
            placement[RoleName.store(role.id.index, replica=k)] for k in range(role.id.replica)
        ]
        if placement[role.id] in copies:
            raise SpecError(
                f"{where}{role.name}: a replica must run on another machine than the other "
                f"copies of partition {role.part} ({', '.join(copies)})"
            )


def _backups_beside_their_main(
    spec: GraphJobSpec, placement: dict[RoleName, str], explicit: dict[RoleName, str], where: str
) -> None:
    """A backup store server maps its main server's shared memory, so it runs on the
    main's machine: it follows its main unless assigned, and must not be assigned away."""
    _follow_anchor(
        spec, placement, explicit, where,
        lambda role: RoleName.store(role.id.index) if role.backup else None,  # store:P:b
        "a backup store server runs on its main server's machine ({anchor} is on {machine}): "
        "it shares its memory",
    )  # fmt: skip


def _follow_anchor(
    spec: GraphJobSpec,
    placement: dict[RoleName, str],
    explicit: dict[RoleName, str],
    where: str,
    anchor: Callable[[Role], RoleName | None],
    refusal: str,
) -> None:
    """Every role with an ``anchor`` (the role it must run beside) runs on the anchor's
    machine: it follows the anchor unless assigned, and an assignment elsewhere is
    refused with ``refusal`` (``{anchor}`` and ``{machine}`` filled in)."""
    for role in job_roles(spec):
        if (to := anchor(role)) is None:
            continue
        machine = placement[to]
        if role.id not in explicit:
            placement[role.id] = machine
        elif placement[role.id] != machine:
            raise SpecError(f"{where}{role.name}: " + refusal.format(anchor=to, machine=machine))


def plan_assignments(plan: PlacementPlan, machines: list[str], where: str) -> dict[RoleName, str]:
    """A plan's assignments in the job's machine names (``plan.machines[i]`` is machine i).

    ``where`` prefixes the field in errors (``"plan.yaml: "`` or ``"spec.placement.plan."``)."""
    if len(plan.machines) != len(machines):
        raise SpecError(
            f"{where}machines: plan has {len(plan.machines)} machines, "
            f"the job has {len(machines)} (spec.runtime.machines)"
        )
    rename = dict(zip(plan.machines, machines, strict=True))
    return {role: rename[m] for role, m in plan.by_role.items()}
