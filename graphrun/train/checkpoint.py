"""Checkpoints: one file per job, rewritten atomically at the end of every epoch and
when the trainers are told to stop mid-epoch.

``CKPT_DIR/checkpoint.pt`` (``torch.save`` of a dict, written to a temporary file
and renamed; mode 0600: the model is the job's, not every local user's)::

    {"format": "graphrun-checkpoint", "version": 2, "epoch": E (last finished),
     "model": state_dict, "optimizer": state_dict (with training.sync ps: the parameter
     servers' parameters and Adam state, graphrun.train.ps.PSOptimizer.state_dict),
     "sparse": {name: state} (DistEmbedding tables and their sparse optimizer),
     "metrics": {...} (the epoch's metrics),
     "position": None | {"epoch": E + 1, "step": S, "rng": [per-trainer RNG state],
                         "sums": float64 [trainers, 4]}}

``position`` (version 2; version 1 files have none and are read as before) is set by a
checkpoint taken mid-epoch (:mod:`graphrun.train.suspend`): ``S`` steps of epoch
``E + 1`` were taken, and the resumed run takes the rest of that epoch first.

Only rank 0 writes; every rank reads on ``--resume``. Loading uses
``weights_only=True`` (no pickle of arbitrary objects).

At an epoch end no RNG state or loader position is needed: every loader derives its
order and each batch's sampling seed from ``(seed, epoch, batch)``, and
:func:`graphrun.train.loop.train_epoch` reseeds torch's generator from
``(seed, epoch, rank)``. A run killed during epoch ``e`` and resumed trains epochs
``e, e+1, ...`` exactly as the uninterrupted run did (tested end to end); one stopped
by SIGTERM resumes at the step it stopped before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import msgspec
import torch

from graphrun.errors import CheckpointError
from graphrun.files import write_atomic, write_failed
from graphrun.names import MAX_TRAINERS
from graphrun.wire import check_header, describe

FORMAT = "graphrun-checkpoint"
VERSION = 2
READ_VERSIONS = (1, 2)
FILE = "checkpoint.pt"
RNG_SHAPE = tuple(torch.get_rng_state().shape)  # torch's CPU generator (uint8)


@dataclass
class Checkpoint:
    epoch: int
    model: dict[str, Any]
    optimizer: dict[str, Any]
    sparse: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    position: dict[str, Any] | None = None  # a mid-epoch stop: graphrun.train.suspend.Position


def save_checkpoint(ckpt_dir: str | Path, ckpt: Checkpoint) -> Path:
    d = Path(ckpt_dir)
    d.mkdir(parents=True, exist_ok=True)
    final = d / FILE
    data = {
        "format": FORMAT, "version": VERSION, "epoch": ckpt.epoch, "model": ckpt.model,
        "optimizer": ckpt.optimizer, "sparse": ckpt.sparse, "metrics": ckpt.metrics,
        "position": ckpt.position,
    }  # fmt: skip
    try:
        return write_atomic(final, lambda f: torch.save(data, f), mode=0o600)
    except OSError as exc:
        raise write_failed(final, exc) from None
    except RuntimeError as exc:  # torch.save on a full disk: "[enforce fail at ...]"
        raise write_failed(final, OSError(str(exc).splitlines()[0])) from None


class PositionFile(msgspec.Struct):
    """``position`` as written (graphrun.train.suspend.Position.to_dict)."""

    epoch: Annotated[int, msgspec.Meta(ge=0)]
    step: Annotated[int, msgspec.Meta(ge=0)]
    rng: Annotated[list[torch.Tensor], msgspec.Meta(min_length=1, max_length=MAX_TRAINERS)]
    sums: torch.Tensor

    def __post_init__(self) -> None:
        for i, state in enumerate(self.rng):
            if state.dtype != torch.uint8 or tuple(state.shape) != RNG_SHAPE:
                raise ValueError(
                    f"rng[{i}] is a {state.dtype} tensor of shape {tuple(state.shape)}, not "
                    f"torch's RNG state (uint8, {RNG_SHAPE})"
                )
        want = (len(self.rng), 4)
        if self.sums.dtype != torch.float64 or tuple(self.sums.shape) != want:
            raise ValueError(f"sums is not a float64 tensor of shape {want} (trainers, 4)")
        if not bool(torch.isfinite(self.sums).all()):
            raise ValueError("sums holds a NaN or an infinity")


class CheckpointFile(msgspec.Struct):
    """What :func:`save_checkpoint` writes, declared: :func:`load_checkpoint` checks a
    file against it whole, so a malformed one is one line naming the field, never a
    trainer's traceback (``epoch: "x"``, no ``model``, ``position.step: -5``)."""

    format: Literal["graphrun-checkpoint"]
    version: Literal[1, 2]
    epoch: Annotated[int, msgspec.Meta(ge=-1)]  # -1: stopped in epoch 0 (a position)
    model: Annotated[dict[str, torch.Tensor], msgspec.Meta(min_length=1)]
    optimizer: dict[str, Any]
    sparse: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    position: PositionFile | None = None

    def __post_init__(self) -> None:
        if self.position is not None and self.position.epoch != self.epoch + 1:
            raise ValueError(
                f"position.epoch is {self.position.epoch}, not the epoch after epoch ({self.epoch})"
            )
        if self.position is None and self.epoch < 0:
            raise ValueError("epoch is -1 without a position")


def _tensor(type_: type, value: object) -> torch.Tensor:
    if type_ is torch.Tensor and isinstance(value, torch.Tensor):
        return value
    raise TypeError(f"expected a tensor, got {type(value).__name__}")


def load_checkpoint(ckpt_dir: str | Path) -> Checkpoint | None:
    """The last checkpoint in ``ckpt_dir``, or None if there is none."""
    path = Path(ckpt_dir) / FILE
    if not path.is_file():
        return None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a corrupt file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint ({first})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a checkpoint (a {type(data).__name__}, not a dict)")
    check_header(data, str(path), FORMAT, READ_VERSIONS, CheckpointError)
    try:
        msgspec.convert(data, CheckpointFile, dec_hook=_tensor)
    except msgspec.ValidationError as exc:
        raise CheckpointError(f"{path}: {describe(exc)}") from None
    return Checkpoint(
        data["epoch"], data["model"], data["optimizer"], data.get("sparse", {}),
        data.get("metrics", {}), data.get("position"),
    )  # fmt: skip


class _Stateful(Protocol):
    def load_state_dict(self, state: Any) -> object: ...


def load_states(ckpt: Checkpoint, where: str, **into: _Stateful) -> None:
    """The checkpoint's states into the objects named by field (``model=``,
    ``optimizer=``); the state of another model (its layers, sizes) or optimizer is one
    line naming the field, not torch's traceback."""
    for name, obj in into.items():
        try:
            obj.load_state_dict(getattr(ckpt, name))
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointError(
                f"{where}: {name}: does not fit this job's {name} ({first})"
            ) from None
