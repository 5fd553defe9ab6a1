"""TensorBoard scalars of a training run: what trainer 0 writes under ``RUN/tensorboard/``.

:class:`TensorBoardLog` turns each epoch's metrics record (what
:class:`~graphrun.train.metrics.MetricsLog` writes to ``metrics.jsonl``, from
:func:`graphrun.train.loop.fit` or a user's entry point) into scalars, with the epoch as
the step:

=============================  =====================================================
``loss/train``                 the epoch's mean training loss
``<metric>/<split>``           ``acc/train``, ``acc/val``, ``acc/test``; link
                               prediction: ``auc/*``, ``mrr/*``, ``hits@10/*``
``throughput/seeds_per_s``     seeds per second, all trainers together
``time/epoch_s``, ``time/eval_s``
``step/<part>_s``              seconds per step, the trainers' mean: ``sample``,
                               ``fetch``, ``compute``, ``allreduce`` (within compute)
``cache/hit_rate``             remote feature bytes the feature cache served
``job/world_size``             trainers
``memory/peak_rss_mb/<m>``     the peak RSS of the trainers on machine ``m``, added up
``trainer<r>/<part>_s``        trainer ``r``'s epoch: ``epoch``, ``sample``, ``fetch``,
                               ``compute``, ``allreduce``, ``cpu`` seconds
=============================  =====================================================

``torch.utils.tensorboard`` (and the ``tensorboard`` package) is imported only when the
first record is written, so processes that never write do not load it. Events are
flushed once per epoch and the writer is closed at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphrun.graph.graph import SPLITS

METRICS = ("acc", "auc", "mrr", "hits@10")
STEP_PARTS = ("sample", "fetch", "compute", "allreduce")
TRAINER_PARTS = ("epoch", *STEP_PARTS, "cpu")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard tags and values of one epoch's metrics record."""
    out: dict[str, float] = {}

    def put(tag: str, value: Any) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[tag] = float(value)

    put("loss/train", record.get("loss"))
    for split in SPLITS:
        for metric in METRICS:
            put(f"{metric}/{split}", record.get(f"{split}_{metric}"))
    put("throughput/seeds_per_s", record.get("seeds_per_s"))
    put("time/epoch_s", record.get("epoch_s"))
    put("time/eval_s", record.get("eval_s"))
    for part, value in (record.get("step") or {}).items():
        put(f"step/{part}", value)
    put("cache/hit_rate", record.get("cache_hit_rate"))
    put("job/world_size", record.get("world_size"))
    for t in record.get("trainers") or []:
        for part in TRAINER_PARTS:
            put(f"trainer{t['rank']}/{part}_s", t.get(f"{part}_s"))
    for machine, mb in machine_peaks(record).items():
        put(f"memory/peak_rss_mb/{machine}", mb)
    return out


def machine_peaks(record: dict[str, Any]) -> dict[str, float]:
    """Machine -> the peak RSS (MiB) of its trainers, added up."""
    peaks: dict[str, float] = {}
    for t in record.get("trainers") or []:
        if t.get("peak_rss_mb") is not None:
            m = t.get("machine") or f"trainer{t['rank']}"
            peaks[m] = peaks.get(m, 0.0) + float(t["peak_rss_mb"])
    return peaks


class TensorBoardLog:
    """Event files under ``logdir``, or nothing (``logdir`` None)."""

    def __init__(self, logdir: Path | None) -> None:
        self.logdir = Path(logdir) if logdir is not None else None
        self._writer: Any = None

    def write(self, record: dict[str, Any]) -> None:
        if self.logdir is None:
            return
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(str(self.logdir), flush_secs=3600)
        step = int(record.get("epoch", 0))
        for tag, value in scalars(record).items():
            self._writer.add_scalar(tag, value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
