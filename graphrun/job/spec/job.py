"""The GraphJob document: metadata, the Kubernetes-only fields, the spec that holds
every section, and loading (one :class:`~graphrun.errors.SpecError` line per problem)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from graphrun.errors import SpecError
from graphrun.job.spec.base import (
    API_VERSION,
    JOB_NAME_MAX,
    JOB_NAME_PATTERN,
    KIND,
    MAX_ROLES,
    MAX_TRAINERS,
    FreeForm,
    SpecModel,
)
from graphrun.job.spec.data import GraphSource, PartitionSpec
from graphrun.job.spec.placement import PlacementSpec
from graphrun.job.spec.policy import RunPolicy
from graphrun.job.spec.runtime import RuntimeSpec
from graphrun.job.spec.training import TrainingSpec
from graphrun.placement._io import parse_yaml, read_yaml


class Metadata(BaseModel):
    """The object's metadata. Kubernetes adds fields of its own (uid, ...): they are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str = Field(
        min_length=1, max_length=JOB_NAME_MAX, pattern=JOB_NAME_PATTERN,
        description="the job's name (a DNS-1035 label: its objects and run directory are "
        "named after it)",
    )  # fmt: skip
    namespace: str | None = Field(default=None, description="Kubernetes: the job's namespace")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Kubernetes labels (kueue.x-k8s.io/queue-name queues the job with Kueue)",
    )
    annotations: dict[str, str] = Field(default_factory=dict, description="Kubernetes annotations")


class LiveSpec(SpecModel):
    """Training on a live graph: a store that takes writes while the job runs
    (docs/live.md)."""

    follow: Literal["head", "epoch", "pinned"] = Field(
        default="epoch",
        description="which version of the graph the trainers read: the head before every "
        "batch, the head at each epoch's start (new nodes with train_mask true join the "
        "seeds then, as in head), or the version the job started on",
    )
    log_dir: str | None = Field(
        default=None, min_length=1, max_length=1024, pattern=r"^[^\x00]*$",
        description="where the job's own store servers keep their write-ahead logs "
        "(graphrun serve --live-dir), a directory per partition under it: "
        "<logDir>/<partition> (relative to the job file's directory; on Kubernetes to "
        "the shared volume, a PersistentVolume, which it must be on); default "
        "runs/<job>/live. Not with graph.store: a running store is given its own",
    )  # fmt: skip


# --- Kubernetes only --------------------------------------------------------------------


class ReplicaSpec(SpecModel):
    """A free-form PodTemplateSpec; the operator adds graphrun's command, config and volume."""

    template: FreeForm = Field(
        default_factory=dict,
        description="a PodTemplateSpec (metadata, spec): resources, node selectors, "
        "tolerations, sidecars ...",
    )


class ReplicaSpecs(SpecModel):
    """Kubernetes: the pod templates of the job's pods, by replica."""

    partitioner: ReplicaSpec | None = None
    worker: ReplicaSpec | None = None
    launcher: ReplicaSpec | None = None


class SharedVolume(SpecModel):
    """A volume every pod mounts (e.g. a ReadWriteMany PVC): datasets and partitions."""

    claim_name: str = Field(
        min_length=1, max_length=253, description="the PersistentVolumeClaim in the job's namespace"
    )
    mount_path: str = Field(
        default="/data", pattern=r"^/",
        description="where every pod mounts it; relative paths in the spec are relative to it",
    )  # fmt: skip


# --- the job ----------------------------------------------------------------------------


class GraphJobSpec(SpecModel):
    graph: GraphSource
    partition: PartitionSpec = Field(default_factory=PartitionSpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    training: TrainingSpec
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    image: str | None = Field(
        default=None, description="graphrun image of the pods (Kubernetes; default: the operator's)"
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="the pods' imagePullPolicy (Kubernetes; default: the operator's)"
    )
    shared_volume: SharedVolume | None = Field(
        default=None,
        description="the volume that carries datasets, partitions and checkpoints to every pod",
    )
    replica_specs: ReplicaSpecs = Field(default_factory=ReplicaSpecs)
    live: LiveSpec | None = Field(
        default=None,
        description="follow a live graph (a store that takes writes: docs/live.md); "
        "homogeneous graphs",
    )
    managed_by: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="the controller that runs this job (Kubernetes; immutable): unset or "
        "graphrun.io/graphrun-operator, this operator; another (e.g. "
        "kueue.x-k8s.io/multikueue), the graphrun operator leaves the job alone",
    )

    @model_validator(mode="after")
    def _consistent(self) -> GraphJobSpec:
        r = self.runtime
        if self.num_trainers > MAX_TRAINERS:
            raise ValueError(
                f"runtime.trainersPerMachine: {r.machines} machines x {r.trainers_per_machine} "
                f"trainers is {self.num_trainers} trainers, more than {MAX_TRAINERS}"
            )
        roles = self.num_parts * r.store_servers_per_machine + self.num_trainers * (
            1 + r.sampler_workers_per_trainer
        )
        if roles > MAX_ROLES:
            raise ValueError(
                f"runtime: {roles} processes (store servers, trainers and sampler workers), "
                f"more than {MAX_ROLES}"
            )
        self._live()
        if self.graph.store is not None:
            n = len(self.graph.store.addresses)
            if self.partition.parts not in (None, n):
                raise ValueError(
                    f"partition.parts: {self.partition.parts}, but graph.store has {n} partitions"
                )
            return self
        self._elastic_training()
        if self.runtime.parameter_servers is not None and self.training.sync != "ps":
            raise ValueError(
                "runtime.parameterServers: only used with training.sync: ps (allreduce has none)"
            )
        parts = self.partition.parts
        if self.partition.mode == "distributed" and parts not in (None, self.runtime.machines):
            raise ValueError(
                f"partition.parts: {parts} must equal runtime.machines "
                f"({self.runtime.machines}) in mode 'distributed': each machine partitions "
                "and keeps one part"
            )
        if parts is not None and parts != self.runtime.machines and self._co_located():
            raise ValueError(
                f"partition.parts: {parts} must equal runtime.machines "
                f"({self.runtime.machines}) when placement is co-located"
            )
        return self

    def _live(self) -> None:
        if self.live is None:
            return
        if self.live.log_dir is not None and self.graph.store is not None:
            raise ValueError("live.logDir: the job's own store servers log there; a running "
                             "store (graph.store) is started with --live-dir itself")  # fmt: skip

    def _elastic_training(self) -> None:
        if self.runtime.elastic is None:
            return
        t = self.training
        if t.task is None or t.task == "link-prediction":
            raise ValueError(
                "runtime.elastic: only for training.task node-classification or "
                "hetero-node-classification (the loop re-splits the epoch's seed nodes)"
            )
        if t.sync != "allreduce":
            raise ValueError("runtime.elastic: only with training.sync: allreduce")

    def _co_located(self) -> bool:
        p = self.placement
        return p.assignments is None and p.plan_file is None and p.plan is None

    @property
    def num_parts(self) -> int:
        if self.graph.store is not None:
            return len(self.graph.store.addresses)
        return self.partition.parts or self.runtime.machines

    @property
    def num_ps(self) -> int:
        """Parameter servers: ``runtime.parameterServers`` (default 1) with ``sync: ps``."""
        if self.training.sync != "ps":
            return 0
        return self.runtime.parameter_servers or 1

    @property
    def num_trainers(self) -> int:
        return self.runtime.machines * self.runtime.trainers_per_machine

    @property
    def machine_names(self) -> list[str]:
        r = self.runtime
        return list(r.machine_names) if r.machine_names else [f"m{i}" for i in range(r.machines)]


class GraphJob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: Literal["graphrun.io/v1alpha1"] = Field(
        alias="apiVersion", description="the API version of GraphJobs"
    )
    kind: Literal["GraphJob"] = Field(description="the kind")
    metadata: Metadata
    spec: GraphJobSpec

    @property
    def name(self) -> str:
        return self.metadata.name

    def partition_dir(self) -> str:
        return self.spec.partition.output or f"{self.metadata.name}-parts"

    def to_dict(self) -> dict[str, Any]:
        """The job as YAML/JSON data (camelCase keys, defaults left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True) | {
            "apiVersion": API_VERSION,
            "kind": KIND,
        }


# --- loading ----------------------------------------------------------------------------


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or "[" in str(part):
            continue  # pydantic's internal validator names
        else:
            out += f".{part}" if out else str(part)
    return out


_SUBPATH = re.compile(r"^[A-Za-z][\w.\[\]:-]*: ")


def format_validation_error(source: str, exc: ValidationError) -> str:
    """One line: ``source: path.to.field: what was expected; other.field: ...``.

    A model validator names the field it rejects by starting its message with the
    field's path relative to the model (``"partition.parts: ..."``)."""
    items = []
    for err in exc.errors(include_url=False):
        msg = str(err["msg"]).removeprefix("Value error, ")
        where = _loc(tuple(err["loc"]))
        if where and _SUBPATH.match(msg):
            items.append(f"{where}.{msg}")
        else:
            items.append(f"{where}: {msg}" if where else msg)
    return f"{source}: " + "; ".join(items)


def parse_job(data: Any, source: str = "<job>") -> GraphJob:
    """Validate already-parsed YAML/JSON data (e.g. a custom resource) into a GraphJob."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping with apiVersion, kind, metadata, spec")
    try:
        return GraphJob.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(source, exc)) from None


def load_job(path: str | Path) -> GraphJob:
    """Load and validate a GraphJob YAML file."""
    return parse_job(read_yaml(path, "job spec"), source=str(path))


def loads_job(text: str, source: str = "<job>") -> GraphJob:
    return parse_job(parse_yaml(text, source), source)


def graphjob_json_schema() -> dict[str, Any]:
    """The JSON Schema of a GraphJob document (camelCase keys, as written in YAML)."""
    return GraphJob.model_json_schema(by_alias=True, mode="validation")
