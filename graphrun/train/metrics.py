"""Progress and metrics of a training run.

* :class:`Progress` — rank 0 prints a progress line (batches done, seeds/s) at most
  every ``interval`` seconds; plain lines, so they survive the launcher's log prefix.
* :class:`MetricsLog` — one JSON object per epoch, on stdout (``{"metrics": ...}``)
  and appended to a ``.jsonl`` file; with ``tensorboard_dir``, epoch records (those with
  an ``epoch``) also become TensorBoard scalars (:mod:`graphrun.train.tensorboard`), from
  a built-in task or a user's entry point alike. A run resumed from a checkpoint first
  drops the file's records of the epochs it runs again (:meth:`MetricsLog.rewind`):
  a restart after an epoch's record but before its checkpoint wrote it twice.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import IO, Any

from graphrun.files import write_atomic


class Progress:
    """``trainers``: every trainer takes the same steps with batches of the same size, so
    the job's seeds/s (what the epoch's JSON reports, summed over trainers) is this
    trainer's times ``trainers``."""

    def __init__(
        self, total: int, label: str, enabled: bool = True, interval: float = 2.0,
        out: IO[str] | None = None, trainers: int = 1,
    ) -> None:  # fmt: skip
        self.total, self.label, self.enabled, self.interval = total, label, enabled, interval
        self.trainers = trainers
        self.out = out or sys.stdout
        self.done = 0
        self.seeds = 0
        self.t0 = self.last = time.perf_counter()

    def update(self, seeds: int) -> None:
        self.done += 1
        self.seeds += seeds
        now = time.perf_counter()
        if self.enabled and (now - self.last >= self.interval or self.done == self.total):
            self.last = now
            pct = 100.0 * self.done / max(self.total, 1)
            self.out.write(
                f"{self.label}: {pct:3.0f}% {self.done}/{self.total} batches, "
                f"{self.seeds_per_s:,.0f} seeds/s\n"
            )
            self.out.flush()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def seeds_per_s(self) -> float:
        return self.trainers * self.seeds / max(self.elapsed, 1e-9)


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with NaN and infinities as ``null``: a bare ``NaN`` is not JSON."""
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()
    }


def _epoch_at_least(line: str, start: int) -> bool:
    try:
        epoch = json.loads(line).get("epoch")
    except (ValueError, AttributeError):  # not a record of ours: kept
        return False
    return isinstance(epoch, int) and epoch >= start


class MetricsLog:
    def __init__(
        self, path: Path | None, enabled: bool = True, out: IO[str] | None = None,
        tensorboard_dir: Path | None = None,
    ) -> None:  # fmt: skip
        from graphrun.train.tensorboard import TensorBoardLog

        self.path = Path(path) if path is not None else None
        self.enabled = enabled
        self.out = out or sys.stdout
        self.board = TensorBoardLog(tensorboard_dir if enabled else None)
        if self.path is not None and enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def enable(self) -> None:
        """Write from now on (a trainer that became rank 0 when its group re-formed; the
        TensorBoard scalars stay with the first rank 0)."""
        self.enabled = True
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def rewind(self, start: int) -> int:
        """Drop the ``.jsonl`` file's records of epoch ``start`` and later (a resumed run
        runs them again); returns how many. The file is replaced whole (atomically)."""
        if not self.enabled or self.path is None or not self.path.is_file():
            return 0
        lines = self.path.read_text().splitlines(keepends=True)
        keep = [line for line in lines if not _epoch_at_least(line, start)]
        if len(keep) < len(lines):
            write_atomic(self.path, "".join(keep), mode=self.path.stat().st_mode & 0o777)
        return len(lines) - len(keep)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = json.dumps(_finite(record), sort_keys=False, allow_nan=False)
        self.out.write(line + "\n")
        self.out.flush()
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(line + "\n")
        if isinstance(record.get("epoch"), int):
            self.board.write(_finite(record))

    def close(self) -> None:
        """Flush and close the TensorBoard writer (the JSON lines are written at once)."""
        self.board.close()
