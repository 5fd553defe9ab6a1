"""The spec's training section: a built-in task with its hyper-parameters, or a user
entry point or script."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from graphrun.errors import ArgumentError
from graphrun.job.spec.base import (
    ENTRY_POINT_PATTERN,
    MAX_ARGS,
    MAX_BATCH_SIZE,
    MAX_EDGE_COUNT,
    MAX_EDGE_TYPES,
    MAX_EMBEDDING_DIM,
    MAX_EPOCHS,
    MAX_EVAL_NEGATIVES,
    MAX_FANOUT,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_NEGATIVES,
    MAX_SEED,
    SpecModel,
)
from graphrun.train.config import DEFAULTS as D
from graphrun.train.config import Evaluation, Fanouts, TrainPrecision
from graphrun.train.names import Task, model_name

Fanout = Annotated[
    int, Field(ge=-1, le=MAX_FANOUT, description="neighbours per layer; -1 takes all")
]


class TrainingSpec(SpecModel):
    """A built-in task with hyper-parameters, or a user entry point / script with arguments."""

    task: Task | None = Field(
        default=None, description="a built-in task (or give entryPoint or script instead)"
    )
    entry_point: str | None = Field(
        default=None, pattern=ENTRY_POINT_PATTERN, description="module:function"
    )
    script: str | None = Field(
        default=None,
        min_length=1,
        description="a Python file run as trainer (relative to the job file)",
    )
    args: list[str] = Field(
        default_factory=list, max_length=MAX_ARGS,
        description="arguments of the entry point or script",
    )  # fmt: skip

    model: str | None = Field(
        default=D.model,
        description="node-classification: sage (default), gcn, gat; hetero-node-classification: "
        "rgcn (default), hetero-sage; link-prediction: sage. Free for entry points and scripts",
    )
    epochs: int = Field(default=D.epochs, gt=0, le=MAX_EPOCHS, description="training epochs")
    batch_size: int = Field(
        default=D.batch_size, gt=0, le=MAX_BATCH_SIZE,
        description="seed nodes (or edges) per mini-batch, per trainer",
    )  # fmt: skip
    fanouts: list[Fanout] = Field(
        default_factory=lambda: list(D.fanouts.layers),
        min_length=1,
        max_length=MAX_LAYERS,
        description="neighbours sampled per layer, first layer first",
    )
    fanouts_per_etype: dict[str, list[Fanout]] | None = Field(
        default=None, max_length=MAX_EDGE_TYPES,
        description='per edge type ("src:rel:dst") fanouts on heterogeneous graphs',
    )  # fmt: skip
    hidden: int = Field(
        default=D.hidden, gt=0, le=MAX_HIDDEN, description="hidden channels of the model"
    )
    lr: float = Field(default=D.lr, gt=0, description="learning rate of the dense parameters")
    dropout: float = Field(default=D.dropout, ge=0, lt=1, description="dropout rate of the model")
    weight_decay: float = Field(
        default=D.weight_decay, ge=0, description="L2 weight decay of the dense parameters"
    )
    negative_samples: int = Field(
        default=D.negative_samples, gt=0, le=MAX_NEGATIVES, description="link prediction"
    )
    edges_per_epoch: int | None = Field(
        default=D.edges_per_epoch, gt=0, le=MAX_EDGE_COUNT,
        description="link prediction: positive edges per epoch, all trainers together "
        "(default: every training edge)",
    )  # fmt: skip
    val_edges: float = Field(
        default=D.val_edges, ge=0, lt=1,
        description="link prediction: fraction of edges held out for validation (never in "
        "message passing)",
    )  # fmt: skip
    test_edges: float = Field(
        default=D.test_edges, ge=0, lt=1, description="link prediction: fraction held out for test"
    )
    eval_negatives: int = Field(
        default=D.eval_negatives, gt=0, le=MAX_EVAL_NEGATIVES,
        description="link prediction: negatives each held-out edge is ranked against "
        "(AUC, MRR, hits@10)",
    )  # fmt: skip
    embedding_dim: int | None = Field(
        default=D.embedding_dim, gt=0, le=MAX_EMBEDDING_DIM, description="learnable node embeddings"
    )
    sparse_lr: float = Field(
        default=D.sparse_lr,
        gt=0,
        description="learning rate of the sparse optimizer (node embeddings)",
    )
    target_node_type: str | None = Field(
        default=D.target_node_type, description="node type to classify on heterogeneous graphs"
    )
    num_bases: int | None = Field(
        default=D.num_bases, ge=1, le=1024,
        description="rgcn: the relation weights of each layer from this many shared bases "
        "(basis decomposition; at most one per relation); default: a weight per relation",
    )  # fmt: skip
    feature: str = Field(default=D.feature, description="node feature name")
    label: str = Field(default=D.label, description="node label name")
    eval_every: int = Field(
        default=D.eval_every, gt=0, le=MAX_EPOCHS, description="evaluate every N epochs"
    )
    evaluation: Evaluation = Field(
        default=D.evaluation,
        description="layerwise: every layer once over whole neighbourhoods (GraphSAGE and "
        "GAT on homogeneous graphs); sampled: the training fanouts; auto: layerwise where "
        "the model supports it",
    )
    precision: TrainPrecision = Field(
        default=D.precision,
        description="GraphSAGE's dense layers: bf16 runs their matrix products in bf16 "
        "(parameters, optimizer, aggregation and loss stay fp32); auto: bf16 where the CPU "
        "multiplies bf16 natively (AMX or AVX-512 BF16), else fp32",
    )
    eval_subset: int | None = Field(
        default=D.eval_subset, gt=0, le=MAX_EDGE_COUNT,
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
    seed: int = Field(
        default=D.seed, ge=0, le=MAX_SEED,
        description="seed of the model's initialisation, the shuffles and the sampling",
    )  # fmt: skip
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
        try:
            self.normalized_fanouts  # noqa: B018  (its one check)
        except ArgumentError as exc:
            raise ValueError(str(exc)) from None
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

    @property
    def normalized_fanouts(self) -> Fanouts:
        """``fanouts`` and ``fanoutsPerEtype`` as the one value the trainer takes."""
        return Fanouts.of(self.fanouts, self.fanouts_per_etype)

    def _kinds(self) -> dict[str, str | None]:
        return {"task": self.task, "entryPoint": self.entry_point, "script": self.script}

    @model_validator(mode="after")
    def _bases_for_rgcn(self) -> TrainingSpec:
        if self.num_bases is not None and self.task is not None:
            model = model_name(self.task, self.model)
            if model != "rgcn":
                raise ValueError(f"numBases: only the rgcn model has bases ({self.task}: {model})")
        return self
