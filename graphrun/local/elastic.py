"""The launcher's side of elastic trainers (``runtime.elastic``, docs/elastic.md).

A machine is *lost* when its worker process ends (killed with every role it ran, or
its host gone) while the job trains. With ``runtime.elastic`` and at least
``minMachines`` machines left, the launcher says so (:func:`machine_lost_event`: which
machine, when, which replicas serve its partitions, which machines' trainers go on)
and waits for the others; the surviving trainers re-form their group by themselves
(:mod:`graphrun.train.elastic`). Below ``minMachines`` the loss fails the attempt, and
the job restarts as without elastic.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Sequence
from typing import Any

import psutil

from graphrun.machine.launch import MachineLaunch
from graphrun.names import RoleName

# the states of a machine whose loss the others survive: its trainers started
SURVIVABLE = ("training", "done")


def can_go_on(machines: int, lost: int, min_machines: int | None) -> bool:
    """Whether ``machines - lost`` machines may go on without the lost ones."""
    return min_machines is not None and machines - lost >= min_machines


def machine_lost_event(
    machine: str, launches: Sequence[MachineLaunch], exit_code: int | None, lost: Sequence[str]
) -> dict[str, Any]:
    """The ``machine_lost`` event: which partitions' replicas take over (and where), and
    the machines whose trainers go on (``lost``: every machine lost so far)."""
    primaries = {
        RoleName.parse(r.role).index
        for m in launches
        if m.machine == machine
        for r in m.of_kind("store")
        if RoleName.parse(r.role).replica == 0 and RoleName.parse(r.role).sub == 0
    }
    replicas = {
        f"partition {RoleName.parse(r.role).index}": f"{r.role} on {m.machine}"
        for m in launches
        if m.machine not in lost
        for r in m.of_kind("store")
        if RoleName.parse(r.role).replica > 0 and RoleName.parse(r.role).index in primaries
    }
    trainers = sorted(m.machine for m in launches if m.of_kind("trainer") and m.machine not in lost)
    return {
        "event": "machine_lost",
        "machine": machine,
        "exit_code": exit_code,
        "time": round(time.time(), 3),
        "took_over": {"partitions": dict(sorted(replicas.items())), "trainers": trainers},
    }


def worker_pids(machine: str) -> list[int]:
    """The ``graphrun worker`` of a local job's ``machine`` (a descendant of this process)."""
    plan = f"{machine}.json"
    found = []
    for c in psutil.Process().children(recursive=True):
        try:
            argv = c.cmdline()
        except psutil.Error:
            continue
        if "worker" in argv and any(a.endswith(f"/launch/{plan}") for a in argv):
            found.append(c.pid)
    return found


def kill_machine(machine: str) -> list[int]:
    """SIGKILL every process of a local job's ``machine``: its ``graphrun worker`` (a
    descendant of this process) and everything the worker started. All are stopped
    (SIGSTOP) first, so none sees the others die and reacts (a worker reporting its
    roles' deaths, a trainer told to checkpoint); returns the pids killed."""
    workers = [psutil.Process(pid) for pid in worker_pids(machine)]
    procs = []
    for w in workers:
        with contextlib.suppress(psutil.Error):
            procs += [w, *w.children(recursive=True)]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGSTOP)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    return [p.pid for p in procs]
