"""The simulated schedule of one placement: what ran on each machine and each link, when.

:func:`schedule` simulates a placed :class:`~graphrun.placement.workload.Template` (the
same arrays ETP scores) and names every node that does work:

* a :class:`TaskRun` per compute step of a task — ``sample``, ``train``, a store's
  ``serve`` (its reply) and ``serve-charge`` (the same CPU seconds charged to its
  machine's cores), a parameter server's ``update`` — on the machine of that task;
* a :class:`FlowRun` per flow that crosses the network — ``structure`` and ``feature``
  from the stores (merged per machine), ``batch``, ``gradient``, ``parameters``,
  ``allreduce`` — on the link from its sender's machine to its receiver's.

Each runs from the moment it may start (its last predecessor finished) to its end: a
flow may wait for bandwidth and a CPU step for cores in between. Free steps (inside
a machine, zero bytes, synchronisation points) are left out. ``graphrun plan`` writes
the schedules of its plan and of co-location beside the plan file (:func:`write_schedules`,
``<plan>.schedule.json``)::

    {"format": "graphrun-schedule", "version": 1,
     "schedules": [{"label": "plan", "machines": ["m0", "m1"], "iterations": 8,
                    "makespan": 1.23, "placement": {"store:0": "m0", ...},
                    "tasks": [{"role": "trainer:0", "machine": "m0", "stage": "train",
                               "iteration": 0, "start": 0.01, "end": 0.05}, ...],
                    "flows": [{"src": "m0", "dst": "m1", "src_role": "store:0",
                               "dst_role": "trainer:1", "stage": "feature",
                               "iteration": 0, "bytes": 1.5e6, "start": 0.0,
                               "end": 0.02}, ...]}, ...]}

The drawing lives above placement (``graphrun.report``): this module has no plotting.
A report reads the file without the simulator (numba: 0.3 CPU-s to import), which
:func:`schedule` imports when it runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from graphrun.errors import ArgumentError, SpecError
from graphrun.files import write_atomic
from graphrun.names import RoleName
from graphrun.wire import Header, check_header, convert_json, to_builtins

if TYPE_CHECKING:
    from graphrun.placement.cluster import Cluster
    from graphrun.placement.oes import Policy
    from graphrun.placement.workload import Scenario, Template

FORMAT = "graphrun-schedule"
VERSION = 1


class TaskRun(msgspec.Struct, frozen=True):
    role: RoleName
    machine: str
    stage: str
    iteration: int
    start: float
    end: float


class FlowRun(msgspec.Struct, frozen=True):
    src: str  # machine names
    dst: str
    src_role: RoleName
    dst_role: RoleName
    stage: str
    iteration: int
    bytes: float
    start: float
    end: float


class Schedule(msgspec.Struct, frozen=True):
    label: str  # "plan", "co-location", ...
    machines: tuple[str, ...]
    iterations: int
    makespan: float  # simulated seconds for ``iterations`` iterations
    placement: dict[RoleName, str]  # role -> machine
    tasks: tuple[TaskRun, ...]
    flows: tuple[FlowRun, ...]

    @property
    def iteration_s(self) -> float:
        return self.makespan / max(self.iterations, 1)

    def links(self) -> list[tuple[str, str]]:
        """The links that carry a flow, in machine order."""
        order = {m: i for i, m in enumerate(self.machines)}
        pairs = {(f.src, f.dst) for f in self.flows}
        return sorted(pairs, key=lambda p: (order[p[0]], order[p[1]]))


class ScheduleFile(Header):
    """The file :func:`write_schedules` writes (see the module docstring)."""

    schedules: list[Schedule]


def schedule(
    cluster: Cluster,
    scenario: Scenario,
    placement: Sequence[int],
    label: str = "plan",
    policy: Policy | str = "priority",
    template: Template | None = None,
) -> Schedule:
    """Simulate ``placement`` (machine index per task) and name its tasks and flows."""
    from graphrun.placement.oes import simulate_times
    from graphrun.placement.workload import STAGES, make_template

    tpl = template if template is not None else make_template(scenario)
    if tpl.owner is None or tpl.stage is None:
        raise ArgumentError("schedule: the template has no owners (make it with make_template)")
    x = np.asarray(placement, dtype=np.int64)
    a = tpl.place(cluster, x.tolist())
    start, finish = simulate_times(a, policy)
    roles = scenario.job.roles
    names = cluster.names
    network = tpl.src_task >= 0
    # a CPU step's work is its duration, or its CPU seconds when it became a fluid
    work = a.duration + np.where(network, 0.0, a.size)
    stage = [STAGES[int(i)] for i in tpl.stage.tolist()]
    it = tpl.iteration.astype(np.int64).tolist()
    tasks = []
    for v in np.flatnonzero((tpl.owner >= 0) & (work > 0)).tolist():
        t = int(tpl.owner[v])
        run = TaskRun(roles[t], names[x[t]], stage[v], it[v], float(start[v]), float(finish[v]))
        tasks.append(run)
    flows = []
    for v in np.flatnonzero(network & (a.size > 0)).tolist():
        s, d = int(tpl.src_task[v]), int(tpl.dst_task[v])
        ends = (float(start[v]), float(finish[v]))
        link = (names[x[s]], names[x[d]], roles[s], roles[d])
        flows.append(FlowRun(*link, stage[v], it[v], float(a.size[v]), *ends))
    return Schedule(
        label=label,
        machines=tuple(names),
        iterations=scenario.iterations,
        makespan=float(finish.max(initial=0.0)),
        placement={roles[t]: names[m] for t, m in enumerate(x.tolist())},
        tasks=tuple(tasks),
        flows=tuple(flows),
    )


def schedule_file(plan_file: Path) -> Path:
    """Where ``graphrun plan`` writes the schedules of ``plan_file``."""
    plan_file = Path(plan_file)
    return plan_file.with_name(plan_file.stem + ".schedule.json")


def write_schedules(path: Path, schedules: Sequence[Schedule]) -> Path:
    data = to_builtins(ScheduleFile(FORMAT, VERSION, list(schedules)))
    write_atomic(Path(path), json.dumps(data) + "\n")
    return Path(path)


def read_schedules(path: Path) -> list[Schedule]:
    """The schedules of a file :func:`write_schedules` wrote; SpecError naming the file
    and field otherwise."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the schedule ({exc})") from None
    return parse_schedules(text, str(path))


def parse_schedules(text: bytes | str, path: str) -> list[Schedule]:
    """The schedules of a schedule file's content; SpecError naming ``path`` and the
    field when it is not one (nested too deep to decode, too)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        why = "nested too deep" if isinstance(exc, RecursionError) else exc
        raise SpecError(f"{path}: cannot read the schedule ({why})") from None
    check_header(data, str(path), FORMAT, VERSION)
    return convert_json(ScheduleFile, data, str(path)).schedules  # RoleName keys
