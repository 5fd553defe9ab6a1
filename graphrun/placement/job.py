"""The job model: the tasks of a distributed GNN training job and their resource demands.

Native placement-job file (YAML), what ``graphrun plan`` reads::

    apiVersion: graphrun.io/v1alpha1
    kind: PlacementJob
    name: products
    partitions: 4               # one graph store task per partition: store:<p>
    trainers: 4                 # trainer:<r> trains on partition r * partitions // trainers
    samplers_per_trainer: 2     # sampler:<r>:<w>, worker w samples every w-th batch
    sync: ps                    # ps (parameter servers ps:<i>) or allreduce (ring)
    parameter_servers: 2        # only with sync: ps
    staleness: 0                # only with sync: ps: 0 synchronous; k >= 1 asynchronous,
                                # a trainer at most k steps ahead of the slowest
    prefetch: 1                 # batches sampled/fetched ahead of training
    iterations: 8               # iterations simulated to score a placement
    features_cached: false      # every trainer's feature cache holds every partition's
                                # node features: no placement moves features
    profile: products           # built-in profile name, or a profile JSON path
                                # (relative to this file), see graphrun.placement.profile
    demands:                    # per task kind; omitted resources are 0
      store:   {cpu: 2, memory_gb: 60}
      sampler: {cpu: 2, memory_gb: 4}
      trainer: {cpu: 4, memory_gb: 16, gpus: 1}
      ps:      {cpu: 1, memory_gb: 4}

Every count has an upper bound (``MAX_*`` below), checked when the file is read: the
simulator's memory grows with tasks x iterations (about 2 KB per task and iteration)
and its time faster (22 tasks: 100 iterations take 15 s before the search starts, 1000
over two minutes); ``iterations: 1000000000`` was an 18 GB allocation killed by the
kernel.

Role names follow the shared convention (``store:<p>``, ``trainer:<r>``,
``sampler:<r>:<w>``, ``ps:<i>``); they are the keys of a placement plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from graphrun.errors import SpecError
from graphrun.names import MAX_TRAINERS, RoleName
from graphrun.placement._io import read_yaml, validate
from graphrun.placement.profile import Profile, resolve_profile

# Upper bounds of a placement job's counts (see the module docstring).
MAX_PARTITIONS = 4096
MAX_SAMPLERS_PER_TRAINER = 64
MAX_PARAMETER_SERVERS = 1024
MAX_PREFETCH = 64
MAX_STALENESS = 1000
MAX_ITERATIONS = 1000
MAX_TASKS = 16384
MAX_TASK_ITERATIONS = 50_000  # tasks x iterations simulated per placement scored
# Demands and capacities: a core count, GB and a GPU count no machine comes near.
MAX_CPU = 1e5
MAX_MEMORY_GB = 1e7
MAX_GPUS = 1e4

RESOURCES = ("cpu", "memory_gb", "gpus")
KINDS = ("store", "trainer", "sampler", "ps")


class Demand(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    cpu: Annotated[float, Field(ge=0, le=MAX_CPU, description="CPU cores")] = 0
    memory_gb: Annotated[float, Field(ge=0, le=MAX_MEMORY_GB, description="memory, GB")] = 0
    gpus: Annotated[float, Field(ge=0, le=MAX_GPUS, description="GPUs")] = 0


class Demands(BaseModel):
    model_config = ConfigDict(extra="forbid")
    store: Demand = Demand(cpu=2, memory_gb=60)
    sampler: Demand = Demand(cpu=2, memory_gb=4)
    trainer: Demand = Demand(cpu=4, memory_gb=16, gpus=1)
    ps: Demand = Demand(cpu=1, memory_gb=4)


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    apiVersion: Literal["graphrun.io/v1alpha1"] = "graphrun.io/v1alpha1"
    kind: Literal["PlacementJob"] = "PlacementJob"
    name: str = "job"
    partitions: int = Field(ge=1, le=MAX_PARTITIONS)
    trainers: int = Field(ge=1, le=MAX_TRAINERS)
    samplers_per_trainer: Annotated[int, Field(ge=0, le=MAX_SAMPLERS_PER_TRAINER)] = 1
    sync: Literal["ps", "allreduce"] = "ps"
    parameter_servers: Annotated[int, Field(ge=0, le=MAX_PARAMETER_SERVERS)] = 1
    staleness: Annotated[int, Field(ge=0, le=MAX_STALENESS)] = 0
    prefetch: Annotated[int, Field(ge=0, le=MAX_PREFETCH)] = 1
    iterations: Annotated[int, Field(ge=1, le=MAX_ITERATIONS)] = 8
    features_cached: bool = False
    profile: str = "products"
    demands: Demands = Demands()

    @model_validator(mode="after")
    def _ps(self) -> JobSpec:
        if self.sync == "ps" and self.parameter_servers < 1:
            raise ValueError("parameter_servers must be >= 1 with sync: ps")
        if self.staleness and self.sync != "ps":
            raise ValueError("staleness: only parameter servers (sync: ps) train asynchronously")
        check_size(self.num_tasks, self.iterations)
        return self

    @property
    def num_tasks(self) -> int:
        ps = self.parameter_servers if self.sync == "ps" else 0
        return self.partitions + self.trainers * (1 + self.samplers_per_trainer) + ps


def check_size(tasks: int, iterations: int) -> None:
    """Refuse a job too big to simulate (ValueError naming the field)."""
    if tasks > MAX_TASKS:
        raise ValueError(
            f"trainers: {tasks} tasks (stores, trainers, samplers, parameter servers), "
            f"more than {MAX_TASKS}"
        )
    if tasks * iterations > MAX_TASK_ITERATIONS:
        raise ValueError(
            f"iterations: {iterations} iterations of {tasks} tasks are more than "
            f"{MAX_TASK_ITERATIONS} task-iterations to simulate per placement; at most "
            f"{max(1, MAX_TASK_ITERATIONS // tasks)} for this job"
        )


@dataclass(frozen=True)
class Task:
    role: RoleName  # store:<p> | trainer:<r> | sampler:<r>:<w> | ps:<i>
    demand: tuple[float, float, float]  # in RESOURCES order

    @property
    def kind(self) -> str:  # store | trainer | sampler | ps
        return self.role.kind

    @property
    def index(self) -> int:  # p, r, or i
        return self.role.index

    @property
    def worker(self) -> int:  # w for samplers, else 0
        return self.role.sub if self.role.kind == "sampler" else 0


@dataclass(frozen=True)
class Job:
    """A placement job: tasks in a fixed order plus the profile that scores placements."""

    spec: JobSpec
    profile: Profile
    tasks: tuple[Task, ...]
    source: str = "job"  # the file it came from, for error messages

    @property
    def roles(self) -> tuple[RoleName, ...]:
        return tuple(t.role for t in self.tasks)

    def index(self, role: RoleName) -> int:
        return self.roles.index(role)

    def with_demands(self, demands: dict[str, Demand]) -> Job:
        """This job with the tasks of each kind in ``demands`` demanding that instead."""
        tasks = tuple(
            replace(t, demand=_triple(demands[t.kind])) if t.kind in demands else t
            for t in self.tasks
        )
        return replace(self, tasks=tasks)


def _triple(x: Demand) -> tuple[float, float, float]:
    return (x.cpu, x.memory_gb, x.gpus)


def _tasks(spec: JobSpec) -> tuple[Task, ...]:
    d = spec.demands
    names = [(RoleName.store(p), d.store) for p in range(spec.partitions)]
    names += [(RoleName.trainer(r), d.trainer) for r in range(spec.trainers)]
    names += [
        (RoleName.sampler(r, w), d.sampler)
        for r in range(spec.trainers)
        for w in range(spec.samplers_per_trainer)
    ]
    if spec.sync == "ps":
        names += [(RoleName.ps(i), d.ps) for i in range(spec.parameter_servers)]
    return tuple(Task(n, _triple(x)) for n, x in names)


def job_from_spec(spec: JobSpec, profile: Profile, source: str = "job") -> Job:
    return Job(spec=spec, profile=profile, tasks=_tasks(spec), source=source)


def job_from_dict(data: Any, where: str = "job", base: Path | None = None) -> Job:
    spec = validate(JobSpec, data, where)
    try:
        profile = resolve_profile(spec.profile, base)
    except SpecError as exc:
        raise SpecError(f"{where}: profile: {exc}") from exc
    return job_from_spec(spec, profile, where)


def load_job(path: str | Path) -> Job:
    """Read a native placement-job YAML file (see the module docstring)."""
    path = Path(path)
    return job_from_dict(read_yaml(path), str(path), base=path.parent)
