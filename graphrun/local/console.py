"""What a person sees of a running job: its phases, trainer 0's progress and output, and
one line of results per epoch, and what keeps it waiting (sampler workers starting, and
ready with the seconds they took: ``samplers_starting``/``samplers_ready`` events).

Roles write ``[role@machine] text`` lines (JSON events, logger lines with timestamps,
progress); all of them stay in ``RUN/logs/<role>.log`` and the epoch records in
``RUN/metrics.jsonl``. :class:`Console` is the sink ``graphrun run`` and ``graphrun
demo`` give the launcher by default; ``graphrun run --verbose`` shows every raw line.

A traceback is not shown: when one role dies, the others fail after it (gloo's
"Connection reset by peer" in every survivor), and their tracebacks would bury the
cause. The launcher names the role that failed first, its machine, exit code or signal
and its log (``[graphrun] trainer:1 on m1 failed first ...``); every traceback is in the
log of its role.
"""

from __future__ import annotations

import json
import re
import threading
from typing import IO

from graphrun.errors import RunFileError
from graphrun.names import MAIN_TRAINER
from graphrun.record import (
    EpochRecord,
    Event,
    Reformed,
    SamplersReady,
    SamplersStarting,
    parse_epoch,
    parse_event,
    role_event,
)

_ROLE_LINE = re.compile(r"^\[(?P<role>[^@\]]+)@(?P<machine>[^\]]+)\] (?P<text>.*)$")
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+ ")
_PROGRESS = re.compile(r"^epoch \d+: ")
_TRACEBACK = "Traceback (most recent call last):"
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:")  # torch.distributed's copy of an error


def epoch_line(rec: EpochRecord) -> str:
    """``epoch 2: loss 0.1234  train 0.951  val 0.940  test 0.938  (1.23 s, 8,130 seeds/s)``."""
    parts = [f"epoch {rec.epoch}: loss {rec.loss:.4f}"]
    for split in ("train", "val", "test"):
        for metric in ("acc", "auc", "mrr"):
            v = getattr(rec, f"{split}_{metric}", None)
            if v is not None:
                name = split if metric == "acc" else f"{split} {metric}"
                parts.append(f"{name} {v:.3f}")
    tail = [f"{rec.epoch_s:.2f} s"] if rec.epoch_s is not None else []
    if rec.seeds_per_s is not None:
        tail.append(f"{rec.seeds_per_s:,.0f} seeds/s")
    return "  ".join(parts) + (f"  ({', '.join(tail)})" if tail else "")


def announced(event: Event) -> str | None:
    """The line a person sees of one of trainer 0's events (the others are in its log)."""
    if isinstance(event, SamplersStarting):
        return (
            f"starting {event.workers} sampler worker(s) per trainer "
            "(runtime.samplerWorkersPerTrainer): the first epoch waits for them"
        )
    if isinstance(event, SamplersReady):
        return f"sampler workers ready in {event.start_s:.1f} s"
    return None


class Console:
    """A line filter in front of ``out`` (thread-safe: role output pumps write to it)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self._lock = threading.Lock()
        self._partial = ""
        self._failing: set[str] = set()  # roles that printed a traceback: they are ending
        # the trainer shown: trainer 0, until an elastic group re-forms without it (the
        # new rank 0 prints the "reformed" event and the epoch records from then on)
        self.main = str(MAIN_TRAINER)

    def write(self, text: str) -> int:
        with self._lock:
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()
            for line in lines:
                shown = self._filter(line)
                if shown is not None:
                    self.out.write(shown + "\n")
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def _filter(self, line: str) -> str | None:
        m = _ROLE_LINE.match(line)
        if m is not None:
            text = m["text"]
            if text.startswith(_TRACEBACK) or _RANK_PREFIX.match(text):
                self._failing.add(m["role"])
            if m["role"] in self._failing:
                return None  # the rest of a dying role's output: in its log
            got = role_event(line)
            if got is not None and got[0].kind == "trainer" and isinstance(got[2], Reformed):
                self.main = m["role"]
        return self.show(line)

    def show(self, line: str) -> str | None:
        """What of ``line`` a person sees, or None; a role's line keeps its
        ``[role@machine]`` prefix."""
        m = _ROLE_LINE.match(line)
        if m is None:
            return line  # the launcher's own lines ([graphrun] phase ...)
        if m["role"] != self.main:  # the log line's prefix, as written
            return None  # in RUN/logs/<role>.log
        shown = Console._shown(m["text"])
        return None if shown is None else f"[{m['role']}@{m['machine']}] {shown}"

    @staticmethod
    def _shown(text: str) -> str | None:
        event = parse_event(text)
        if event is not None:
            return announced(event)  # the others (joined, first_step, model, ...): no line
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError:
                return text
            try:  # the epoch record, as declared (graphrun.record)
                return epoch_line(parse_epoch(data, "epoch record", RunFileError))
            except RunFileError:
                return None  # other records
        if _LOG_LINE.match(text):
            return None
        return text if _PROGRESS.match(text) or text.strip() else None
