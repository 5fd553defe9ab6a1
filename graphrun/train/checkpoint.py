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
from typing import Any

import torch

from graphrun.errors import ArgumentError
from graphrun.files import write_atomic, write_failed

FORMAT = "graphrun-checkpoint"
VERSION = 2
READ_VERSIONS = (1, 2)
FILE = "checkpoint.pt"


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


def load_checkpoint(ckpt_dir: str | Path) -> Checkpoint | None:
    """The last checkpoint in ``ckpt_dir``, or None if there is none."""
    path = Path(ckpt_dir) / FILE
    if not path.is_file():
        return None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a corrupt file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ArgumentError(f"{path}: not a readable checkpoint ({first})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ArgumentError(f"{path}: field 'format' is not {FORMAT!r}")
    if data.get("version") not in READ_VERSIONS:
        raise ArgumentError(
            f"{path}: field 'version' is {data.get('version')!r}, not one of {READ_VERSIONS}"
        )
    return Checkpoint(
        int(data["epoch"]), data["model"], data["optimizer"], data.get("sparse", {}),
        data.get("metrics", {}), data.get("position"),
    )  # fmt: skip
