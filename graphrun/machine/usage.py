"""What a machine's roles used: CPU seconds and peak memory, sampled by the worker.

:class:`RoleUsage` reads every running role's process at most once per ``every_s``
seconds: its CPU seconds (user + system, and those of its reaped children, such as
sampler workers) and its peak resident set (``VmHWM`` of ``/proc/<pid>/status``, the
kernel's own high-water mark, so no peak between two samples is missed). The worker
writes :meth:`RoleUsage.usage` (a :class:`graphrun.record.Usage`, keyed by
:class:`~graphrun.names.RoleName`) into its status file (``usage``)::

    {"roles": {"store:0": {"cpu_s": 3.1, "peak_rss_mb": 412.0}, ...},
     "cpu_s": 9.4, "peak_rss_mb": 1210.0}

A role's CPU seconds are those of its last sample (up to ``every_s`` before it
exited); the machine's ``peak_rss_mb`` adds up its roles' peaks (an upper bound of the
machine's peak: the roles need not peak together, and shared memory counts in each
process that maps it).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import psutil

from graphrun import record as rec
from graphrun.names import RoleName


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set in MiB (``VmHWM``), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError):
        return None
    return None


class RoleUsage:
    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.last = -float("inf")
        self.roles: dict[RoleName, dict[str, float]] = {}

    def sample(self, pids: Mapping[RoleName, int], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        for role, pid in pids.items():
            try:
                t = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            cpu = t.user + t.system + t.children_user + t.children_system
            self.record(role, cpu, peak_rss_mb(pid))

    def record(self, role: RoleName, cpu_s: float, peak_rss_mb: float | None) -> None:
        """What ``role`` used so far (a sample), or in all (known when it ended: a
        warm-started role's); the most seen is kept."""
        mine = self.roles.setdefault(role, {"cpu_s": 0.0, "peak_rss_mb": 0.0})
        mine["cpu_s"] = max(mine["cpu_s"], round(cpu_s, 3))
        if peak_rss_mb is not None:
            mine["peak_rss_mb"] = max(mine["peak_rss_mb"], round(peak_rss_mb, 1))

    def usage(self) -> rec.Usage:
        return rec.Usage(
            roles={r: rec.RoleUsage(**v) for r, v in sorted(self.roles.items())},
            cpu_s=round(sum(v["cpu_s"] for v in self.roles.values()), 3),
            peak_rss_mb=round(sum(v["peak_rss_mb"] for v in self.roles.values()), 1),
        )
