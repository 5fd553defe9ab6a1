"""What a trainer is told: one frozen :class:`TrainConfig`, built at the edge (the job's
trainer entry point) from the job spec, the hosts file and the command line.

The hyper-parameters' defaults are defined here, once: the job spec's ``training``
section (:class:`graphrun.job.spec.TrainingSpec`, which adds their bounds and
descriptions) takes each field's default from :data:`DEFAULTS`, and the trainer's entry
point copies every field the two share from the spec
(:func:`graphrun.machine.trainer.train_config`). No torch here: the spec (and the
operator) import this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from graphrun.errors import ArgumentError
from graphrun.names import Endpoint, etype_key
from graphrun.train.names import TASKS, AggrPath, Task

if TYPE_CHECKING:
    from graphrun.sampling.edgesplit import EdgeSplit

Evaluation = Literal["auto", "layerwise", "sampled"]  # graphrun.train.inference
EVALUATIONS: tuple[Evaluation, ...] = get_args(Evaluation)
# auto: bf16 where the CPU multiplies it natively (graphrun.train.models.resolve_precision)
TrainPrecision = Literal["auto", "fp32", "bf16"]


@dataclass(frozen=True)
class ElasticConfig:
    """``runtime.elastic`` as a trainer takes it (:mod:`graphrun.train.elastic`)."""

    min_machines: int
    timeout_s: float = 60.0  # a collective's wait for a peer before it counts as lost
    settle_s: float = 3.0  # how long the survivors gather before the new group is fixed
    # machine -> "host:port" of a store server there: a re-forming trainer that reaches
    # too few of the others' is the one cut off (graphrun.errors.CutOff)
    probes: tuple[tuple[str, Endpoint], ...] = ()


@dataclass(frozen=True)
class Fanouts:
    """``training.fanouts`` and ``training.fanoutsPerEtype`` as one value, made and
    checked once when the spec is read (:meth:`of`): per layer its fanout (-1: every
    neighbour; the spec bounds each), and per edge type ``"src:rel:dst"`` its own fanout
    on every layer. What the samplers take is :meth:`for_graph`."""

    layers: tuple[int, ...]
    per_etype: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        if not self.layers:
            raise ArgumentError("fanouts: empty (one fanout per layer)")
        for etype, fan in self.per_etype:
            if len(fan) != len(self.layers):
                raise ArgumentError(
                    f"fanoutsPerEtype.{etype}: has {len(fan)} layers, fanouts has "
                    f"{len(self.layers)}"
                )

    @classmethod
    def of(
        cls, layers: Sequence[int], per_etype: Mapping[str, Sequence[int]] | None = None
    ) -> Fanouts:
        return cls(tuple(layers), tuple((k, tuple(v)) for k, v in (per_etype or {}).items()))

    def __len__(self) -> int:
        return len(self.layers)

    def for_graph(self, edge_types: Sequence[tuple[str, str, str]]) -> list[Any]:
        """As the samplers take them: one int per layer, or per layer a dict
        ``"src:rel:dst" -> fanout`` (an edge type's own fanouts overriding the layer's);
        an edge type the graph lacks is one line naming it."""
        if not self.per_etype:
            return list(self.layers)
        keys = [etype_key(et) for et in edge_types]
        own = dict(self.per_etype)
        for k in own:
            if k not in keys:
                raise ArgumentError(f"fanoutsPerEtype: the graph has no edge type {k!r}")
        return [{k: own.get(k, self.layers)[i] for k in keys} for i in range(len(self.layers))]


@dataclass(frozen=True)
class TrainConfig:
    task: Task | None = "node-classification"
    entry_point: str | None = None  # "module:function", called with a TrainContext
    args: tuple[str, ...] = ()
    model: str | None = None
    epochs: int = 10
    batch_size: int = 1000
    fanouts: Fanouts = Fanouts((25, 10))
    hidden: int = 128
    lr: float = 0.003
    dropout: float = 0.5
    weight_decay: float = 0.0
    negative_samples: int = 1
    embedding_dim: int | None = None
    sparse_lr: float = 0.01
    target_node_type: str | None = None
    num_bases: int | None = None  # rgcn: bases of the relation weights (None: one per relation)
    feature: str = "feat"
    label: str = "label"
    eval_every: int = 1
    evaluation: Evaluation = "auto"
    eval_subset: int | None = None  # seeds per trainer in evaluations before the last
    seed: int = 0
    aggr_path: AggrPath = "csr"
    precision: TrainPrecision = "auto"
    gpu_cache_mb: int | None = None  # GPU feature cache (None: a share of free memory)
    feed: str = "auto"  # "cpu": CPU trainers take the device path too (its CPU transfer)
    checkpoint_dir: Path | None = None
    resume: bool = False
    metrics_file: Path | None = None
    profile_file: Path | None = None
    tensorboard_dir: Path | None = None  # trainer 0 writes TensorBoard scalars there
    machines: tuple[str, ...] = ()  # the machine of each rank (metrics and TensorBoard)
    edges_per_epoch: int | None = None  # link prediction: positives per epoch (default: all)
    val_edges: float = 0.05  # link prediction: fraction of edges held out for validation
    test_edges: float = 0.05  # ... and for test
    eval_negatives: int = 50  # link prediction: negatives each held-out positive ranks against
    extra: dict[str, str] = field(default_factory=dict)
    elastic: ElasticConfig | None = None  # go on without a lost machine (train.elastic)

    def __post_init__(self) -> None:
        if (self.task is None) == (self.entry_point is None):
            raise ArgumentError("TrainConfig: give exactly one of task, entry_point")
        if self.task is not None and self.task not in TASKS:
            raise ArgumentError(f"task: {self.task!r} is not one of {', '.join(TASKS)}")
        if self.epochs < 1 or self.batch_size < 1:
            raise ArgumentError("TrainConfig: epochs and batch_size must be positive")
        if self.evaluation not in EVALUATIONS:
            raise ArgumentError(
                f"evaluation: {self.evaluation!r} is not one of {', '.join(EVALUATIONS)}"
            )
        if self.eval_subset is not None and self.eval_subset < 1:
            raise ArgumentError(f"eval_subset: expected >= 1, got {self.eval_subset}")
        if self.task == "link-prediction":
            self.edge_split  # noqa: B018  (validates the fractions)
            if self.eval_negatives < 1:
                raise ArgumentError(f"eval_negatives: expected >= 1, got {self.eval_negatives}")

    @property
    def edge_split(self) -> EdgeSplit:
        from graphrun.sampling.edgesplit import EdgeSplit  # torch: not for the spec

        return EdgeSplit(self.val_edges, self.test_edges, self.seed)


#: The trainer's defaults, which the job spec's training section takes for its own.
DEFAULTS = TrainConfig()
