"""Seconds and peak resident memory of each phase of a partitioning run.

Linux keeps a process's high-water mark of resident memory (``VmHWM`` in
``/proc/self/status``); writing ``5`` to ``/proc/self/clear_refs`` resets it to the
current RSS (Linux >= 4.0). :class:`Phases` resets it as a phase starts and reads it
as the phase ends, so each phase reports its own peak: the bytes it held at its
fullest, whatever the phases before it held. The mark counts every resident page of
the process, memory-mapped file pages it touched included.

Where the reset is refused (no ``/proc``, another kernel), each phase reports the peak
since the process started instead (``ru_maxrss``: an upper bound of the phase's own
peak) and :attr:`Phases.per_phase` is False.

The reset also lowers what ``getrusage``/``wait4`` report as the process's peak (it
becomes the peak since the last reset), so :attr:`Phases.peak_mb` is the process's
peak: the largest phase peak, or the mark before the first reset.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field

STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"


def _hwm_mb() -> float | None:
    """``VmHWM`` of this process in MiB, None where /proc does not say."""
    try:
        with open(STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_rss_mb() -> float:
    """Peak RSS of this process in MiB since it started or since the last reset."""
    hwm = _hwm_mb()
    if hwm is not None:
        return hwm
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


@dataclass
class Phases:
    """``start(name)`` ends the running phase (its seconds and peak MiB into
    :attr:`phases`) and starts the next; ``start("")`` only ends it. ``on_start`` is
    called with each phase's name as it starts."""

    on_start: Callable[[str], None] | None = None
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    per_phase: bool = True
    peak_mb: float = 0.0
    name: str = ""
    t: float = 0.0

    def __post_init__(self) -> None:
        self.peak_mb = round(peak_rss_mb(), 1)

    def start(self, name: str) -> None:
        now = time.perf_counter()
        if self.name:
            peak = round(peak_rss_mb(), 1)
            self.peak_mb = max(self.peak_mb, peak)
            self.phases[self.name] = {"seconds": round(now - self.t, 3), "peak_rss_mb": peak}
        if name:
            self.per_phase = _reset_hwm() and self.per_phase
        self.name, self.t = name, time.perf_counter()
        if name and self.on_start is not None:
            self.on_start(name)

    def seconds(self) -> dict[str, float]:
        return {k: v["seconds"] for k, v in self.phases.items()}

    def peaks(self) -> dict[str, float]:
        return {k: v["peak_rss_mb"] for k, v in self.phases.items()}
