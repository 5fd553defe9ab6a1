"""A job's model as its trainer built it, with the weights of its checkpoint.

The endpoint answers node-classification jobs on homogeneous graphs (GraphSAGE, GCN,
GAT: :class:`~graphrun.train.tasks.NodeClassification`'s models): the same classes and
arguments the task gives them (``in_dim`` from the store's feature, the classes from its
label, layers from the fanouts, the precision resolved as a CPU trainer resolves it), so
the checkpoint's ``state_dict`` loads strictly and a forward equals the trainer's.
The models (torch) are imported when one is built: a command that refuses its job or
its arguments does so without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from graphrun.errors import ArgumentError
from graphrun.job.spec import GraphJob
from graphrun.train.names import model_name

if TYPE_CHECKING:
    from graphrun.train.models import ByLayer


@dataclass(frozen=True)
class ModelSpec:
    """What the endpoint needs of a job's ``spec.training``."""

    name: str  # sage | gcn | gat
    fanouts: tuple[int, ...]
    hidden: int
    dropout: float
    feature: str
    label: str
    precision: str
    seed: int
    ntype: str | None

    @classmethod
    def of(cls, job: GraphJob) -> ModelSpec:
        t = job.spec.training
        if t.task != "node-classification":
            raise ArgumentError(
                f"spec.training.task: the endpoint answers node-classification jobs, not "
                f"{t.task or t.entry_point or 'a script'}"
            )
        try:
            name = model_name(t.task, t.model)
        except ValueError as exc:
            raise ArgumentError(str(exc)) from None
        if t.fanouts_per_etype:
            raise ArgumentError("spec.training.fanoutsPerEtype: the endpoint needs one graph type")
        return cls(
            name, tuple(t.fanouts), t.hidden, t.dropout, t.feature, t.label, t.precision,
            t.seed, t.target_node_type,
        )  # fmt: skip

    @property
    def layers(self) -> int:
        return len(self.fanouts)


def build_model(spec: ModelSpec, in_dim: int, classes: int) -> ByLayer:
    """The model :class:`~graphrun.train.tasks.NodeClassification` builds (CPU, csr path)."""
    from graphrun.train.models import GAT, GCN, SAGE, resolve_precision

    if spec.name == "gcn":
        return GCN(in_dim, spec.hidden, classes, spec.layers, spec.dropout)
    if spec.name == "gat":
        return GAT(in_dim, spec.hidden, classes, spec.layers, spec.dropout)
    precision = resolve_precision(spec.precision)
    return SAGE(in_dim, spec.hidden, classes, spec.layers, spec.dropout, "csr", precision)


def load_model(spec: ModelSpec, ckpt_dir: Path, in_dim: int, classes: int) -> ByLayer:
    """The model with the weights of ``ckpt_dir``'s checkpoint, in eval mode."""
    from graphrun.train.checkpoint import load_checkpoint

    ckpt = load_checkpoint(ckpt_dir)
    if ckpt is None:
        raise ArgumentError(
            f"--checkpoint: {ckpt_dir} holds no checkpoint.pt (train the job first)"
        )
    model = build_model(spec, in_dim, classes)
    try:
        model.load_state_dict(ckpt.model, strict=True)
    except (RuntimeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise ArgumentError(
            f"{Path(ckpt_dir) / 'checkpoint.pt'}: its weights do not fit the job's "
            f"{spec.name} of {in_dim} inputs, {classes} classes ({first})"
        ) from None
    model.eval()
    return model
