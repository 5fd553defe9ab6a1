"""The spec's runtime section: how many processes of each kind run, on what hosts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from graphrun.job.gpus import gpu_defaults
from graphrun.job.spec.base import MAX_MACHINES, NAME_PATTERN, SpecModel


class ElasticSpec(SpecModel):
    """Trainers that go on without a lost machine (docs/elastic.md)."""

    min_machines: int = Field(
        ge=1,
        le=MAX_MACHINES,
        description="the fewest machines the trainers go on with after losing one; below "
        "it the job restarts from its last checkpoint (runPolicy), as without elastic",
    )
    timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="seconds a trainer waits in a collective for another before it counts "
        "that trainer's machine as lost (a killed machine is noticed at once; a stopped or "
        "cut-off one after this, and as long again for the others to gather): more than "
        "the longest a trainer waits for another (a checkpoint, an uneven evaluation)",
    )
    max_rejoins: int = Field(
        default=2,
        ge=0,
        le=100,
        description="times graphrun run starts a lost machine again, its trainers only, to "
        "join the others at their next epoch boundary (0: never; the operator replaces a "
        "lost pod the same way); its store servers are not started again (their replicas "
        "serve)",
    )


class StoreFeatures(SpecModel):
    """Where the store servers keep the graph's node features (docs/disk-features.md)."""

    storage: Literal["memory", "disk"] = Field(
        default="memory",
        description="memory: copied into shared memory at start; disk: read from the "
        "partition's files (memory-mapped, read-only) through a cache of the rows of the "
        "nodes with the most edges, for tables larger than a machine's memory",
    )
    cache_mb: float = Field(
        default=0.0,
        ge=0,
        le=1 << 30,
        description="with storage disk: MiB of feature rows each store server keeps in memory "
        "(its cache; 0: every pull reads the file)",
    )

    def serve_args(self) -> list[str]:
        """``graphrun serve`` flags for this spec."""
        if self.storage == "memory":
            return []
        return ["--features", self.storage, "--disk-cache-mb", f"{self.cache_mb:g}"]


class RuntimeSpec(SpecModel):
    """How many processes of each kind run, and on what kind of hosts."""

    machines: int = Field(
        default=1,
        gt=0,
        le=MAX_MACHINES,
        description="machines (hosts, or worker pods on Kubernetes)",
    )
    store_servers_per_machine: int = Field(
        default=1, gt=0, le=16, description="main server plus backups, per partition"
    )
    trainers_per_machine: int = Field(
        default=1, gt=0, le=64, description="data-parallel trainer processes per machine"
    )
    sampler_workers_per_trainer: int = Field(
        default=0,
        ge=0,
        le=64,
        description="sampling worker processes of each trainer (0: sample in the trainer)",
    )
    feature_cache_mb: int = Field(
        default=256,
        ge=0,
        le=1 << 20,
        description="MiB of remote node features each trainer (and sampler worker) keeps: "
        "those its mini-batches reach most often (0: no cache)",
    )
    store_features: StoreFeatures = Field(default_factory=StoreFeatures)
    replicas: int = Field(
        default=1,
        ge=1,
        le=2,
        description="servers of every partition on distinct machines: 1 (its home machine "
        "only) or 2 (also a replica on the next machine, loaded from the partition files; "
        "clients fail over to it and every write goes to both; see docs/replication.md)",
    )
    elastic: ElasticSpec | None = Field(
        default=None,
        description="when a machine is lost, the surviving trainers re-form without it and "
        "go on from the step they were at (needs replicas: 2; docs/elastic.md)",
    )
    parameter_servers: int | None = Field(
        default=None, ge=1, le=64,
        description="parameter-server processes (roles ps:0..N-1) holding the dense "
        "parameters when training.sync is ps (default 1 then); sharded by bytes",
    )  # fmt: skip
    hosts: Literal["local", "netns"] = Field(
        default="local",
        description="graphrun run: machines as process groups on this host (local) or one "
        "network namespace each, with its own address (netns; root)",
    )
    machine_names: list[Annotated[str, Field(pattern=NAME_PATTERN, max_length=63)]] | None = Field(
        default=None, description="the machines' names, one each (default m0, m1, ...)"
    )
    gpus_per_machine: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="GPUs of each machine: one trainer per GPU unless trainersPerMachine says "
        "otherwise, each pinned to its GPU, NCCL between them (docs/gpu.md)",
    )
    gpus: int | None = Field(
        default=None,
        gt=0,
        le=8192,
        description="GPUs in all: with gpusPerMachine or machines, the other follows; alone, "
        "the operator splits it into machines x GPUs (docs/gpu.md)",
    )
    gpu_feature_cache_mb: int | None = Field(
        default=None,
        ge=0,
        le=1 << 22,
        description="MiB of node features each GPU trainer keeps on its GPU (default: a "
        "quarter of its free memory)",
    )

    @model_validator(mode="before")
    @classmethod
    def _trainer_per_gpu(cls, data: object) -> object:
        """``gpusPerMachine`` (or ``gpus``) without ``trainersPerMachine``: one trainer per
        GPU; ``gpus`` with ``gpusPerMachine`` sets ``machines``."""
        return gpu_defaults(data)

    @model_validator(mode="after")
    def _names_match(self) -> RuntimeSpec:
        if self.replicas > self.machines:
            raise ValueError(
                f"replicas: {self.replicas} copies of each partition need as many machines "
                f"(machines is {self.machines})"
            )
        if self.elastic is not None:
            if self.elastic.min_machines > self.machines:
                raise ValueError(
                    f"elastic.minMachines: {self.elastic.min_machines} is more than the job's "
                    f"{self.machines} machines"
                )
            if self.replicas < 2:
                raise ValueError(
                    "elastic: needs replicas: 2 (a lost machine's partitions must be served "
                    "by their replicas for the trainers to go on)"
                )
        names = self.machine_names
        if names is not None:
            if len(names) != self.machines:
                raise ValueError(
                    f"machineNames: has {len(names)} names for {self.machines} machines"
                )
            if len(set(names)) != len(names):
                raise ValueError("machineNames: names must be unique")
        return self

    @property
    def machine_gpus(self) -> int:
        """GPUs per machine the job uses (0: CPU trainers)."""
        if self.gpus_per_machine is not None:
            return self.gpus_per_machine
        return self.gpus // self.machines if self.gpus else 0

    @property
    def gpus_field(self) -> str:
        """The field :attr:`machine_gpus` comes from, as the user wrote it (errors name it)."""
        if self.gpus_per_machine is not None or not self.gpus:
            return "runtime.gpusPerMachine"
        if self.machines == 1:
            return "runtime.gpus"
        return f"runtime.gpus: {self.gpus} over {self.machines} machines"
