"""The ``GraphJob`` spec: one YAML file drives the local backend and the Kubernetes operator.

::

    apiVersion: graphrun.io/v1alpha1
    kind: GraphJob
    metadata: {name: sage}
    spec:
      graph:     {dataset: data/products}     # or {generator: {name: community, params: {...}}}
      partition: {method: metis, parts: 2, balanceTrain: true, haloHops: 1, output: parts/}
      runtime:   {machines: 2, storeServersPerMachine: 1, trainersPerMachine: 1,
                  samplerWorkersPerTrainer: 0, hosts: local}
      training:  {task: node-classification, epochs: 10, batchSize: 1000, fanouts: [25, 10]}
                 # or {entryPoint: "mypkg.train:main", args: [...]}
                 # or {script: train.py, args: [...]}
      placement: {}                                     # co-located (default), or
                                                        # {assignments: {"trainer:0": m1, ...}}
                                                        # or {planFile: plan.yaml}
                                                        # or {plan: {machines: [...],
                                                        #     assignments: {...}}} (inline)
      runPolicy: {backoffLimit: 0, activeDeadlineSeconds: 3600, cleanPodPolicy: Running}
      # Kubernetes only (the local backend ignores them):
      image: ghcr.io/graphrun/graphrun:0.1.0
      sharedVolume: {claimName: graphrun-data, mountPath: /data}
      replicaSpecs: {partitioner: {template: {...}}, worker: {template: {...}}}

YAML keys are camelCase; Python attributes are snake_case. Every model forbids unknown
keys, so a typo is an error naming the field. :func:`load_job` turns every problem into
one :class:`~graphrun.errors.SpecError` line: ``job.yaml: spec.runtime.trainersPerMachine:
Input should be greater than 0``. :func:`graphjob_json_schema` exports the JSON Schema
(the operator's CRD schema is generated from it).

Roles (see ``job_roles``) follow the shared naming: ``store:<part>`` (main store server of a
partition), ``store:<part>:<b>`` (its backup b >= 1), ``trainer:<rank>``,
``sampler:<rank>:<w>``, ``ps:<j>`` (parameter server j, ``training.sync: ps``).
Machines are named ``m0``, ``m1``, ... unless
``runtime.machineNames`` says otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from graphrun.errors import SpecError
from graphrun.job.gpus import gpu_defaults
from graphrun.names import RoleName
from graphrun.placement._io import parse_yaml, read_yaml
from graphrun.placement.plan import PlacementPlan, load_plan
from graphrun.train.names import model_name

API_VERSION = "graphrun.io/v1alpha1"
KIND = "GraphJob"
PLAN_KIND = "PlacementPlan"

# A DNS-1123 label (machine names, node-label values).
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A job's name: a DNS-1035 label (a letter first), because the operator names a Service
# after it (``<name>-workers``) and Service names must be DNS-1035 labels; at most 40
# characters, so every child name (``<name>-partitioner``, ``<name>-worker-1023``) stays a
# legal label of at most 63.
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
JOB_NAME_MAX = 40
# A Kubernetes label key: an optional DNS-subdomain prefix and '/', then a name.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
ENTRY_POINT_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
ROLE_PATTERN = re.compile(r"^(store:\d+(:\d+|:r([1-9]\d*)?)?|trainer:\d+|sampler:\d+:\d+|ps:\d+)$")

# Upper bounds of the counts a spec gives. Each sizes memory (model layers, a mini-batch,
# a number of processes, ...) or a loop; they are far above what a job needs and far
# below what would make an allocator fail minutes into the job with a traceback: a
# value above one is refused up front, naming the field (``hidden: 1e10`` was an
# allocator traceback from every trainer).
MAX_MACHINES = 1024
MAX_PARTS = 4096
MAX_TRAINERS = 4096  # machines x trainersPerMachine
MAX_ROLES = 16384  # store servers + trainers + sampler workers of a job
MAX_EPOCHS = 1_000_000
MAX_BATCH_SIZE = 1 << 20  # seeds per mini-batch and trainer
MAX_FANOUT = 100_000  # neighbours per seed and layer
MAX_LAYERS = 16  # len(fanouts): one model layer each
MAX_EDGE_TYPES = 4096  # keys of fanoutsPerEtype
MAX_HIDDEN = 1 << 16  # hidden channels
MAX_EMBEDDING_DIM = 1 << 14  # learnable embedding width, per node
MAX_NEGATIVES = 1024  # negative samples per positive edge
MAX_EVAL_NEGATIVES = 100_000
MAX_EDGE_COUNT = 1 << 40  # edgesPerEpoch, evalSubset
MAX_ARGS = 4096  # entry point / script arguments
MAX_SEED = 2**63 - 1
MAX_RESTARTS = 1000  # runPolicy.backoffLimit
MAX_SECONDS = 366 * 24 * 3600  # every duration of a run policy: a year

PRESERVE = {"x-kubernetes-preserve-unknown-fields": True}
FreeForm = Annotated[dict[str, Any], Field(json_schema_extra=PRESERVE)]
Scalar = Annotated[int | float | str | bool, Field(json_schema_extra=PRESERVE)]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,  # `lr: .inf` trained to NaN and succeeded
    )


# --- metadata ---------------------------------------------------------------------------


class Metadata(BaseModel):
    """The object's metadata. Kubernetes adds fields of its own (uid, ...): they are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str = Field(min_length=1, max_length=JOB_NAME_MAX, pattern=JOB_NAME_PATTERN)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


# --- graph ------------------------------------------------------------------------------


#: upper bounds of the generator's sizes (``graphrun generate`` flags, camelCase)
GENERATOR_BOUNDS: dict[str, float] = {
    "nodes": 1 << 32, "avgDegree": 100_000, "featDim": 1 << 16, "classes": 1 << 20,
    "chunks": MAX_PARTS,
}  # fmt: skip


class GeneratorSpec(_Model):
    """A synthetic graph made by ``graphrun generate <name>`` with these parameters."""

    name: Literal["community", "academic"]
    params: dict[str, Scalar] = Field(
        default_factory=dict,
        description="generator flags, e.g. {nodes: 100000, avgDegree: 20, seed: 0}",
    )

    @model_validator(mode="after")
    def _bounded(self) -> GeneratorSpec:
        for key, bound in GENERATOR_BOUNDS.items():
            v = self.params.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and v > bound:
                raise ValueError(f"params.{key}: {v:g} is more than {bound:g}")
        return self


STORE_ADDRESS_PATTERN = r"^tcp://[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}$"


class StoreRef(_Model):
    """A running store (``graphrun serve``) the job uses instead of partitioning and
    serving the graph itself. It is shared: the job never stops it. Its key comes from a
    file (``graphrun run``) or a Secret holding ``job.key`` (the operator)."""

    addresses: list[Annotated[str, Field(pattern=STORE_ADDRESS_PATTERN)]] = Field(
        min_length=1,
        description="the main server of every partition, partition order (tcp://host:port)",
    )
    key_file: str | None = Field(
        default=None, min_length=1,
        description="graphrun run: the store's key file (relative to the job file)",
    )  # fmt: skip
    key_secret: str | None = Field(
        default=None, min_length=1, max_length=253,
        description="Kubernetes: a Secret in the job's namespace holding the store's job.key",
    )  # fmt: skip

    @model_validator(mode="after")
    def _a_key(self) -> StoreRef:
        if self.key_file is None and self.key_secret is None:
            raise ValueError("give keyFile (graphrun run) or keySecret (Kubernetes)")
        return self


class GraphSource(_Model):
    """Where the graph comes from: a dataset directory, a generator, or a running store."""

    dataset: str | None = Field(
        default=None, min_length=1, description="a dataset directory (graphrun-dataset format)"
    )
    generator: GeneratorSpec | None = None
    store: StoreRef | None = None

    @model_validator(mode="after")
    def _one_source(self) -> GraphSource:
        if sum(x is not None for x in (self.dataset, self.generator, self.store)) != 1:
            raise ValueError("give exactly one of dataset, generator, store")
        return self


# --- partition --------------------------------------------------------------------------


class PartitionSpec(_Model):
    """How the graph is cut. ``parts`` defaults to ``runtime.machines``."""

    mode: Literal["single", "parallel", "distributed"] = Field(
        default="single",
        description="single: one process; parallel: every core of one machine (KaMinPar); "
        "distributed: every machine of the job, one rank each (XtraPuLP-style label "
        "propagation over gloo), reading a chunked dataset",
    )
    method: Literal["metis", "random", "kaminpar"] | None = Field(
        default=None, description="algorithm (default metis; kaminpar in parallel mode)"
    )
    parts: int | None = Field(
        default=None, gt=0, le=MAX_PARTS,
        description="number of partitions (default: runtime.machines)",
    )  # fmt: skip
    balance_train: bool = False
    balance_edges: bool = False
    halo_hops: int = Field(
        default=1, ge=0, le=4, description="hops of halo nodes stored with each partition"
    )
    output: str | None = Field(
        default=None, min_length=1, description="partition directory; default <name>-parts"
    )

    @model_validator(mode="after")
    def _mode_fits(self) -> PartitionSpec:
        if self.mode == "distributed" and self.method is not None:
            raise ValueError(
                f"method: {self.method!r} runs on one machine; mode 'distributed' runs "
                "label propagation on every machine"
            )
        if self.mode == "parallel" and self.method not in (None, "kaminpar"):
            raise ValueError(
                f"method: {self.method!r} runs in one process; mode 'parallel' uses kaminpar"
            )
        return self

    @property
    def algorithm(self) -> str:
        """The method that runs: as given, else kaminpar in parallel mode, xtrapulp in
        distributed mode, else metis."""
        default = {"parallel": "kaminpar", "distributed": "xtrapulp"}.get(self.mode, "metis")
        return self.method or default

    def cli_args(self) -> list[str]:
        """``graphrun partition`` flags for this spec (after DATASET OUT --parts N)."""
        args = ["--mode", self.mode]
        args += [] if self.mode == "distributed" else ["--method", self.algorithm]
        args += ["--halo", str(self.halo_hops)]
        args += ["--balance-train"] if self.balance_train else []
        return args + (["--balance-edges"] if self.balance_edges else [])


# --- runtime ----------------------------------------------------------------------------


class RuntimeSpec(_Model):
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
    replicas: int = Field(
        default=1,
        ge=1,
        le=2,
        description="servers of every partition on distinct machines: 1 (its home machine "
        "only) or 2 (also a replica on the next machine, loaded from the partition files; "
        "clients fail over to it and every write goes to both; see docs/replication.md)",
    )
    parameter_servers: int | None = Field(
        default=None, ge=1, le=64,
        description="parameter-server processes (roles ps:0..N-1) holding the dense "
        "parameters when training.sync is ps (default 1 then); sharded by bytes",
    )  # fmt: skip
    hosts: Literal["local", "netns"] = "local"
    machine_names: list[Annotated[str, Field(pattern=NAME_PATTERN, max_length=63)]] | None = None
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
    def _trainer_per_gpu(cls, data: Any) -> Any:
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


# --- training ---------------------------------------------------------------------------

Task = Literal["node-classification", "hetero-node-classification", "link-prediction"]
Fanout = Annotated[
    int, Field(ge=-1, le=MAX_FANOUT, description="neighbours per layer; -1 takes all")
]


class TrainingSpec(_Model):
    """A built-in task with hyper-parameters, or a user entry point / script with arguments."""

    task: Task | None = None
    entry_point: str | None = Field(
        default=None, pattern=ENTRY_POINT_PATTERN, description="module:function"
    )
    script: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(
        default_factory=list, max_length=MAX_ARGS,
        description="arguments of the entry point or script",
    )  # fmt: skip

    model: str | None = Field(
        default=None,
        description="node-classification: sage (default), gcn, gat; hetero-node-classification: "
        "rgcn (default), hetero-sage; link-prediction: sage. Free for entry points and scripts",
    )
    epochs: int = Field(default=10, gt=0, le=MAX_EPOCHS, description="training epochs")
    batch_size: int = Field(
        default=1000, gt=0, le=MAX_BATCH_SIZE,
        description="seed nodes (or edges) per mini-batch, per trainer",
    )  # fmt: skip
    fanouts: list[Fanout] = Field(
        default_factory=lambda: [25, 10],
        min_length=1,
        max_length=MAX_LAYERS,
        description="neighbours sampled per layer, first layer first",
    )
    fanouts_per_etype: dict[str, list[Fanout]] | None = Field(
        default=None, max_length=MAX_EDGE_TYPES,
        description='per edge type ("src:rel:dst") fanouts on heterogeneous graphs',
    )  # fmt: skip
    hidden: int = Field(
        default=128, gt=0, le=MAX_HIDDEN, description="hidden channels of the model"
    )
    lr: float = Field(default=0.003, gt=0, description="learning rate of the dense parameters")
    dropout: float = Field(default=0.5, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0)
    negative_samples: int = Field(default=1, gt=0, le=MAX_NEGATIVES, description="link prediction")
    edges_per_epoch: int | None = Field(
        default=None, gt=0, le=MAX_EDGE_COUNT,
        description="link prediction: positive edges per epoch, all trainers together "
        "(default: every training edge)",
    )  # fmt: skip
    val_edges: float = Field(
        default=0.05, ge=0, lt=1,
        description="link prediction: fraction of edges held out for validation (never in "
        "message passing)",
    )  # fmt: skip
    test_edges: float = Field(
        default=0.05, ge=0, lt=1, description="link prediction: fraction held out for test"
    )
    eval_negatives: int = Field(
        default=50, gt=0, le=MAX_EVAL_NEGATIVES,
        description="link prediction: negatives each held-out edge is ranked against "
        "(AUC, MRR, hits@10)",
    )  # fmt: skip
    embedding_dim: int | None = Field(
        default=None, gt=0, le=MAX_EMBEDDING_DIM, description="learnable node embeddings"
    )
    sparse_lr: float = Field(
        default=0.01, gt=0, description="learning rate of the sparse optimizer (node embeddings)"
    )
    target_node_type: str | None = Field(
        default=None, description="node type to classify on heterogeneous graphs"
    )
    num_bases: int | None = Field(
        default=None, ge=1, le=1024,
        description="rgcn: the relation weights of each layer from this many shared bases "
        "(basis decomposition; at most one per relation); default: a weight per relation",
    )  # fmt: skip
    feature: str = Field(default="feat", description="node feature name")
    label: str = Field(default="label", description="node label name")
    eval_every: int = Field(default=1, gt=0, le=MAX_EPOCHS, description="evaluate every N epochs")
    evaluation: Literal["auto", "layerwise", "sampled"] = Field(
        default="auto",
        description="layerwise: every layer once over whole neighbourhoods (GraphSAGE and "
        "GAT on homogeneous graphs); sampled: the training fanouts; auto: layerwise where "
        "the model supports it",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="GraphSAGE's dense layers: bf16 runs their matrix products in bf16 "
        "(parameters, optimizer, aggregation and loss stay fp32); auto: bf16 where the CPU "
        "multiplies bf16 natively (AMX or AVX-512 BF16), else fp32",
    )
    eval_subset: int | None = Field(
        default=None, gt=0, le=MAX_EDGE_COUNT,
        description="evaluations before the last use at most this many val and test seeds "
        "per trainer (sampled), for cheap per-epoch monitoring; the last uses every seed",
    )  # fmt: skip
    checkpoint_dir: str | None = Field(
        default=None, description="checkpoints (default: the run directory)"
    )
    tensorboard: bool = Field(
        default=True,
        description="trainer 0 writes TensorBoard scalars (loss, metrics, step breakdown, "
        "memory) under RUN/tensorboard/",
    )
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    sync: Literal["allreduce", "ps"] = Field(
        default="allreduce",
        description="how dense gradients meet: allreduce (DDP) or ps (parameter servers, "
        "runtime.parameterServers, own the parameters and Adam's state)",
    )
    staleness: int = Field(
        default=0, ge=0, le=1000,
        description="sync ps: 0 waits for every trainer's gradients each step (the result of "
        "allreduce); k >= 1 is asynchronous, a trainer at most k steps ahead of the slowest",
    )  # fmt: skip

    @model_validator(mode="after")
    def _one_kind(self) -> TrainingSpec:
        given = [n for n, v in self._kinds().items() if v is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of task, entryPoint, script")
        if self.fanouts_per_etype:
            for etype, fan in self.fanouts_per_etype.items():
                if len(fan) != len(self.fanouts):
                    raise ValueError(
                        f"fanoutsPerEtype.{etype}: has {len(fan)} layers, fanouts has "
                        f"{len(self.fanouts)}"
                    )
        if self.val_edges + self.test_edges >= 1:
            raise ValueError(
                f"valEdges + testEdges: {self.val_edges} + {self.test_edges} leaves no "
                "training edges"
            )
        if self.task is not None:
            model_name(self.task, self.model)  # "model: 'x' is not a model of <task> (known: ..)"
        if self.staleness and self.sync != "ps":
            raise ValueError("staleness: only parameter servers (sync: ps) train asynchronously")
        return self

    def _kinds(self) -> dict[str, str | None]:
        return {"task": self.task, "entryPoint": self.entry_point, "script": self.script}

    @model_validator(mode="after")
    def _bases_for_rgcn(self) -> TrainingSpec:
        if self.num_bases is not None and self.task is not None:
            model = model_name(self.task, self.model)
            if model != "rgcn":
                raise ValueError(f"numBases: only the rgcn model has bases ({self.task}: {model})")
        return self


# --- placement --------------------------------------------------------------------------


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


class MachineResources(_Model):
    """A container's resources as in a Pod, e.g. {requests: {cpu: 4}, limits: {memory: 20Gi}}."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)

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


class PlacementSpec(_Model):
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
        for role in self.assignments or {}:
            if not ROLE_PATTERN.match(role):
                raise ValueError(f"assignments: {role!r} is not a role name")
        return self


# --- run policy -------------------------------------------------------------------------


class SchedulingPolicy(_Model):
    """Gang scheduling: the operator emits a PodGroup for Volcano or scheduler-plugins, or
    a Workload and its PodGroups (scheduling.k8s.io/v1alpha2, Kubernetes 1.35+)."""

    provider: Literal["volcano", "scheduler-plugins", "workload-api"] = "volcano"
    min_available: int | None = Field(
        default=None, gt=0, le=MAX_ROLES,
        description="pods that must be scheduled together (default: all)",
    )  # fmt: skip
    queue: str | None = Field(default=None, description="Volcano queue")
    priority_class: str | None = None
    schedule_timeout_seconds: int | None = Field(default=None, gt=0, le=MAX_SECONDS)


ReplicaGroup = Literal["partitioner", "worker", "launcher"]
TargetGroup = Literal["worker", "launcher"]


def _all_targets() -> list[TargetGroup]:
    return ["worker", "launcher"]


class SuccessPolicy(_Model):
    """Which role groups' completion means the job succeeded (Kubernetes, as JobSet's)."""

    target_replicas: list[TargetGroup] = Field(
        default_factory=_all_targets,
        min_length=1,
        description="the job succeeds once every pod of these groups succeeded (the "
        "others still running are stopped by cleanPodPolicy); default: the workers and "
        "the launcher, if any",
    )


class FailurePolicy(_Model):
    """Restart budgets per role group (Kubernetes), within backoffLimit."""

    restart_limits: dict[ReplicaGroup, int] = Field(
        default_factory=dict,
        description="restarts a failure of this group may cause (partitioner, worker, "
        "launcher); once spent, its next failure fails the job (RestartLimitExceeded)",
    )

    @model_validator(mode="after")
    def _non_negative(self) -> FailurePolicy:
        for group, n in self.restart_limits.items():
            if not 0 <= n <= MAX_RESTARTS:
                raise ValueError(f"restartLimits.{group}: {n} is not in [0, {MAX_RESTARTS}]")
        return self


class RunPolicy(_Model):
    """What happens on failure, how long a job may run and what is cleaned up."""

    backoff_limit: int = Field(
        default=0, ge=0, le=MAX_RESTARTS, description="restarts from the last checkpoint"
    )
    active_deadline_seconds: int | None = Field(
        default=None, gt=0, le=MAX_SECONDS, description="longest the job may run, from its start"
    )
    clean_pod_policy: Literal["Running", "All", "None"] = Field(
        default="Running",
        description="pods deleted when the job finishes: still running ones, all, or none",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=MAX_SECONDS,
        description="delete the finished job after this long (Kubernetes)",
    )
    suspend: bool = Field(
        default=False,
        description="true: stop every pod and keep the partitions; false again resumes",
    )
    startup_deadline_seconds: int = Field(
        default=600,
        gt=0,
        le=MAX_SECONDS,
        description="longest a pod may stay pending or pulling its image",
    )
    scheduling_policy: SchedulingPolicy | None = None
    success_policy: SuccessPolicy | None = None
    failure_policy: FailurePolicy | None = None


# --- Kubernetes only --------------------------------------------------------------------


class ReplicaSpec(_Model):
    """A free-form PodTemplateSpec; the operator adds graphrun's command, config and volume."""

    template: FreeForm = Field(default_factory=dict)


class ReplicaSpecs(_Model):
    partitioner: ReplicaSpec | None = None
    worker: ReplicaSpec | None = None
    launcher: ReplicaSpec | None = None


class SharedVolume(_Model):
    """A volume every pod mounts (e.g. a ReadWriteMany PVC): datasets and partitions."""

    claim_name: str = Field(min_length=1, max_length=253)
    mount_path: str = Field(default="/data", pattern=r"^/")


# --- the job ----------------------------------------------------------------------------


class GraphJobSpec(_Model):
    graph: GraphSource
    partition: PartitionSpec = Field(default_factory=PartitionSpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    training: TrainingSpec
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    image: str | None = Field(
        default=None, description="graphrun image of the pods (Kubernetes; default: the operator's)"
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    shared_volume: SharedVolume | None = Field(
        default=None,
        description="the volume that carries datasets, partitions and checkpoints to every pod",
    )
    replica_specs: ReplicaSpecs = Field(default_factory=ReplicaSpecs)
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
        if self.graph.store is not None:
            n = len(self.graph.store.addresses)
            if self.partition.parts not in (None, n):
                raise ValueError(
                    f"partition.parts: {self.partition.parts}, but graph.store has {n} partitions"
                )
            return self
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

    api_version: Literal["graphrun.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GraphJob"]
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


# --- roles ------------------------------------------------------------------------------


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


def resolve_placement(job: GraphJob, base_dir: str | Path = ".") -> dict[str, str]:
    """Role name -> machine name for every role of the job (co-located by default).

    Explicit assignments (inline, from an inline ``placement.plan`` or from
    ``placement.planFile``, relative to ``base_dir``) override the default; they must
    name roles of this job and machines it has. A plan's machines map to the job's
    machines by position."""
    spec = job.spec
    placement = {role.name: role.machine for role in job_roles(spec)}
    machines = spec.machine_names
    where = "spec.placement.assignments."
    explicit = spec.placement.assignments
    if spec.placement.plan_file is not None:
        plan_path = Path(base_dir) / spec.placement.plan_file
        explicit = plan_assignments(load_plan(plan_path), machines, f"{plan_path}: ")
        where = f"{plan_path}: assignments."
    elif spec.placement.plan is not None:
        explicit = plan_assignments(spec.placement.plan, machines, "spec.placement.plan.")
        where = "spec.placement.plan.assignments."
    for role, machine in (explicit or {}).items():
        if role not in placement and RoleName.parse(role).kind == "ps":
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
        placement[role] = machine
    _backups_beside_their_main(spec, placement, explicit or {}, where)
    _replicas_away_from_their_primary(spec, placement, explicit or {}, where)
    _samplers_beside_their_trainer(spec, placement, explicit or {}, where)
    return placement


def _samplers_beside_their_trainer(
    spec: GraphJobSpec, placement: dict[str, str], explicit: dict[str, str], where: str
) -> None:
    """Sampler workers run in their trainer's process tree (its data loader starts them),
    so they run on the trainer's machine: they follow it unless assigned, and a plan that
    puts one elsewhere is refused rather than silently not followed."""
    for role in job_roles(spec):
        if role.kind != "sampler":
            continue
        trainer_name = str(RoleName.trainer(role.id.index))
        trainer = placement[trainer_name]
        if role.name not in explicit:
            placement[role.name] = trainer
        elif placement[role.name] != trainer:
            raise SpecError(
                f"{where}{role.name}: sampler workers run on their trainer's machine "
                f"({trainer_name} is on {trainer}); running them elsewhere is not "
                "supported yet"
            )


def _replicas_away_from_their_primary(
    spec: GraphJobSpec, placement: dict[str, str], explicit: dict[str, str], where: str
) -> None:
    """A replica is there to outlive its primary's machine: when the primary is placed
    and the replica is not, it moves to the machine after the primary's; assigned
    beside its primary (or beside another copy of its partition), it is refused."""
    for role in job_roles(spec):
        if role.kind != "store" or not role.id.replica:
            continue
        primary = placement[str(RoleName.store(role.id.index))]
        if role.name not in explicit:
            placement[role.name] = replica_machine(spec.machine_names, primary, role.id.replica)
        copies = [
            placement[str(RoleName.store(role.id.index, replica=k))] for k in range(role.id.replica)
        ]
        if placement[role.name] in copies:
            raise SpecError(
                f"{where}{role.name}: a replica must run on another machine than the other "
                f"copies of partition {role.part} ({', '.join(copies)})"
            )


def _backups_beside_their_main(
    spec: GraphJobSpec, placement: dict[str, str], explicit: dict[str, str], where: str
) -> None:
    """A backup store server maps its main server's shared memory, so it runs on the
    main's machine: it follows its main unless assigned, and must not be assigned away."""
    for role in job_roles(spec):
        if role.kind != "store" or not role.backup:
            continue
        main = placement[str(RoleName.store(role.id.index))]
        if role.name not in explicit:
            placement[role.name] = main
        elif placement[role.name] != main:
            raise SpecError(
                f"{where}{role.name}: a backup store server runs on its main server's "
                f"machine (store:{role.part} is on {main}): it shares its memory"
            )


def plan_assignments(plan: PlacementPlan, machines: list[str], where: str) -> dict[str, str]:
    """A plan's assignments in the job's machine names (``plan.machines[i]`` is machine i).

    ``where`` prefixes the field in errors (``"plan.yaml: "`` or ``"spec.placement.plan."``)."""
    if len(plan.machines) != len(machines):
        raise SpecError(
            f"{where}machines: plan has {len(plan.machines)} machines, "
            f"the job has {len(machines)} (spec.runtime.machines)"
        )
    rename = dict(zip(plan.machines, machines, strict=True))
    return {role: rename[m] for role, m in plan.assignments.items()}
