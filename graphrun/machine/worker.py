"""One machine of a job: start its store servers, wait for every partition's, then its trainers.

:func:`run_machine` runs a :class:`~graphrun.machine.launch.MachineLaunch` under a
:class:`~graphrun.machine.process.Supervisor` and reports progress in a status file
(``STATUS_DIR/<machine>.json``, replaced atomically) that the local backend, a
person or a Kubernetes probe can read::

    {"machine": "m0", "state": "starting|serving|training|done|failed|stopped|left",
     "roles": {"store:0": {"pid": 123, "exit_code": null}, ...},
     "failure": {"role": "trainer:0", "machine": "m0", "exit_code": 1, "reason": "..."} | null,
     "usage": {"roles": {"store:0": {"cpu_s": 3.1, "peak_rss_mb": 412.0}, ...}, ...}}

States: ``serving`` — this machine's store servers accept connections;
``training`` — every partition's store servers and every parameter server are up
(a replica standing in for a dead primary: :class:`~graphrun.machine.launch.Servers`)
and the trainers run; ``done`` — this machine's trainers all exited 0. Its store
servers keep serving the other machines until the job's trainers stop them (trainer 0
asks every store to stop once all trainers finished, and the parameter servers of
``training.sync: ps``; a store that then exits 0 ends the worker with exit code 0) or
the worker is told to stop (SIGTERM): then its trainers first, which write an exact
checkpoint (:mod:`graphrun.train.suspend`) while the stores still serve. A machine
without store servers (placement may give a machine only trainers, or no role at all)
ends with exit code 0 once its trainers are done. A store that exits before this machine's
trainers are done, or any role that exits non-zero, fails the machine: every other
role is stopped and the worker returns the failure. So does a role whose process stays
stopped (SIGSTOP) for ``stall_timeout_s`` (:class:`StallWatch`): it is named, rather than
the trainer whose all-reduce would time out minutes later. Whenever it stops, the
worker removes the shared-memory segments its (killed) store servers left; a worker
whose launcher died gets SIGTERM (``PR_SET_PDEATHSIG``) and stops the same way.

In an elastic job, a SIGTERM without the job-wide stop mark is this machine leaving
alone (a pod deleted, evicted, drained: :mod:`graphrun.machine.stopmark`): the worker
kills its roles at once (state ``left``) and the other machines go on without it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from graphrun.errors import JobFailed
from graphrun.machine.launch import MachineLaunch, RoleLaunch, Servers
from graphrun.machine.process import RoleExit, Supervisor
from graphrun.machine.readiness import IsReady, store_is_ready
from graphrun.machine.usage import RoleUsage
from graphrun.names import Endpoint, RoleName
from graphrun.record import (
    MachineLeaving,
    MachineStatus,
    RoleFailure,
    RoleStatus,
    State,
    StoreLost,
    emit,
    write_status,
)
from graphrun.store.shm import clean_stale

SHM_DIR = Path("/dev/shm")


@dataclass(frozen=True)
class MachineResult:
    machine: str
    state: str  # done | stopped | failed | left
    exits: dict[RoleName, int | None]
    failure: JobFailed | None = None


class StatusFile:
    """The machine's status file (:class:`~graphrun.record.MachineStatus`), rewritten
    atomically on every change."""

    def __init__(self, status_dir: Path | None, machine: str) -> None:
        self.path = Path(status_dir) / f"{machine}.json" if status_dir is not None else None
        self.machine = machine
        self.state: State = "starting"
        self.roles: dict[RoleName, RoleStatus] = {}
        self.failure: RoleFailure | None = None
        self.usage = RoleUsage()  # the roles' CPU seconds and peak memory (job.usage)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def update(self, sup: Supervisor[RoleName], state: State | None = None) -> None:
        if state is not None:
            self.state = state
        self.usage.sample(self.running(sup), force=True)
        exits = sup.exits()
        for role, ex in exits.items():
            if ex.usage is not None:
                self.usage.record(role, *ex.usage)
        warm = sup.warm_started()
        self.roles = {
            role: RoleStatus(pid, exits[role].exit_code if role in exits else None, role in warm)
            for role, pid in sup.pids().items()
        }
        self._write()

    def fail(self, sup: Supervisor[RoleName], exc: JobFailed) -> None:
        # a role of this machine's launch, or its worker (a wait that timed out)
        role = exc.role if isinstance(exc.role, RoleName) else RoleName.worker(self.machine)
        self.failure = RoleFailure(role, exc.host, exc.exit_code, exc.reason, time.time())
        self.update(sup, "failed")

    def _write(self) -> None:
        if self.path is None:
            return
        status = MachineStatus(
            self.machine, self.state, self.roles, self.failure, self.usage.usage(), time.time()
        )
        write_status(self.path, status)

    def running(self, sup: Supervisor[RoleName]) -> dict[RoleName, int]:
        live = set(sup.running())
        return {role: pid for role, pid in sup.pids().items() if role in live}


def failure_of(ex: RoleExit[RoleName], kind: str) -> JobFailed | None:
    """The failure a role's exit means, if any: non-zero, or a server that quit."""
    if ex.exit_code != 0:
        return JobFailed(ex.role, ex.machine, ex.exit_code, ex.reason())
    if kind != "trainer":
        return JobFailed(ex.role, ex.machine, 0, f"{kind} exited while the job was running")
    return None


def store_lost(machine: str, role: RoleName, ex: RoleExit[RoleName]) -> None:
    """Say that a replicated store died and the job goes on (its replica serves)."""
    emit(StoreLost(
        role=role, machine=machine, exit_code=ex.exit_code,
        reason=ex.reason(), time=round(time.time(), 3),
        took_over="its replica (clients fail over)",
    ))  # fmt: skip
    clean_stale()  # the dead server's segments (its readers keep their mappings)


class StallWatch:
    """Roles whose process has been stopped (SIGSTOP, SIGTSTP, a debugger) too long.

    A stopped trainer blocks every other trainer in its next all-reduce, and gloo would
    only time out there minutes later, blaming a trainer that is fine; the worker that
    started the stopped process names it instead.
    """

    STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)

    def __init__(self, timeout_s: float, every_s: float = 1.0) -> None:
        self.timeout_s = timeout_s
        self.every_s = every_s
        self.since: dict[RoleName, float] = {}
        self.last = 0.0

    def check(self, sup: Supervisor[RoleName], machine: str) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s:
            return
        self.last = now
        running = set(sup.running())
        for role, pid in sup.pids().items():
            try:
                stopped = role in running and psutil.Process(pid).status() in self.STOPPED
            except psutil.Error:
                stopped = False
            if not stopped:
                self.since.pop(role, None)
                continue
            first = self.since.setdefault(role, now)
            if now - first >= self.timeout_s:
                raise JobFailed(
                    role, machine, None,
                    f"stopped (SIGSTOP) for {now - first:.0f}s: the job cannot go on without it",
                )  # fmt: skip


def all_up(endpoints: Sequence[Endpoint], is_ready: IsReady) -> Callable[[], bool]:
    return lambda: all(is_ready(e) for e in endpoints)


def servers_up(pending: list[Servers], is_ready: IsReady) -> Callable[[], bool]:
    """A check that drops from ``pending`` the servers that are up (:meth:`Servers.up`:
    a replica stands in for a dead primary) and says whether none are left."""

    def check() -> bool:
        pending[:] = [s for s in pending if not s.up(is_ready)]
        return not pending

    return check


def waited_for(pending: Sequence[Servers]) -> str:
    """The servers waited for, for the timeout's reason: ``partition 1: h:p, replica h:q``."""
    return "; ".join(
        f"{s.of}: {', '.join(map(str, s.main))}" + "".join(f", replica {r}" for r in s.replicas)
        for s in pending
    )


def store_waves(launch: MachineLaunch) -> list[list[RoleLaunch]]:
    """Server roles in start order: main servers (``store:<p>``) and parameter servers
    (``ps:<j>``), then backups."""
    stores = launch.of_kind("store")
    mains = [r for r in stores if r.role.sub == 0] + launch.of_kind("ps")
    backups = [r for r in stores if r.role.sub > 0]
    return [w for w in (mains, backups) if w]


def _make_live_dirs(launch: MachineLaunch) -> None:
    """The store servers' log directories (``graphrun serve --live-dir`` wants them)."""
    for d in launch.live_dirs:
        try:
            Path(d).mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            why = f"{d}: cannot make the store servers' log directory ({exc.strerror or exc})"
            raise JobFailed(RoleName.worker(launch.machine), launch.machine, None,
                            why) from None  # fmt: skip


def remove_shm(pids: Mapping[RoleName, int], shm_dir: Path | None = None) -> list[str]:
    """Unlink the shared-memory segments left by the given (dead) role processes.

    Store segments are named ``graphrun-<pid>-<start>-<token>.<seq>``
    (:mod:`graphrun.store.shm`); only those of our roles whose process is gone are removed.
    """
    from graphrun.store.shm import owner_alive

    shm_dir = SHM_DIR if shm_dir is None else shm_dir
    removed: list[str] = []
    prefixes = tuple(f"graphrun-{pid}-" for pid in pids.values())
    if not prefixes or not shm_dir.is_dir():
        return removed
    for p in shm_dir.iterdir():
        if p.name.startswith(prefixes) and not owner_alive(p.name):
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p.name)
    return removed


class _Stopped(Exception):
    """Control flow inside this module (a stop signal ends the wait), never raised to a
    caller: outside the error tree on purpose."""


def _stop_trainers_first(launch: MachineLaunch, sup: Supervisor[RoleName], interval: float) -> None:
    """Told to stop while training: SIGTERM the trainers (and samplers) first — they
    agree on a step, write an exact checkpoint, including the embedding state on the
    store servers, and trainer 0 then stops the job's stores — and give this machine's
    stores until the grace period ends to be stopped so, before SIGTERM."""
    deadline = time.monotonic() + sup.grace_s
    sup.stop([r.role for r in launch.roles if r.kind in ("trainer", "sampler")])
    stores = {r.role for r in launch.of_kind("store")}
    while time.monotonic() < deadline and not stores <= set(sup.exits()):
        sup.poll()
        time.sleep(interval)


def _leave(launch: MachineLaunch, sup: Supervisor[RoleName]) -> None:
    """This machine leaves an elastic job alone (:mod:`graphrun.machine.stopmark`): its
    roles are killed at once — no trainer enters the stop agreement, so the others do
    not checkpoint; they see the connections drop and re-form without this machine,
    and its partitions' replicas serve."""
    emit(MachineLeaving(machine=launch.machine, time=round(time.time(), 3)))
    sup.stop(grace_s=0.0, first=signal.SIGKILL)


def run_machine(
    launch: MachineLaunch,
    sup: Supervisor[RoleName],
    stop: threading.Event,
    status_dir: Path | None = None,
    is_ready: IsReady | None = None,
    interval: float = 0.05,
    leave_alone: Callable[[], bool] | None = None,
) -> MachineResult:
    """Run one machine's roles until its trainers finish and ``stop`` is set, or a role fails.

    ``stop`` set while the machine trains: its trainers write an exact checkpoint with
    every other machine's, unless ``leave_alone()`` (asked then; it may wait a moment
    for the stop mark) says this machine leaves an elastic job alone: its roles are
    killed at once and the state is ``left``.

    Returns instead of raising, so the caller can report and exit; every role is
    stopped before this returns.
    """
    is_ready = is_ready or store_is_ready(Path(launch.key_file) if launch.key_file else None)
    status = StatusFile(status_dir, launch.machine)
    kinds = {r.role: r.kind for r in launch.roles}
    state: State = "stopped"
    failure: JobFailed | None = None

    stopped_by_job: list[RoleName] = []
    lost: list[RoleName] = []  # replicated stores that died while the job trained
    stalls = StallWatch(launch.stall_timeout_s)

    def check() -> None:
        stalls.check(sup, launch.machine)
        status.usage.sample(status.running(sup))
        for ex in sup.poll():
            clean = ex.exit_code == 0 and kinds[ex.role] in ("store", "ps")
            if clean and status.state in ("training", "done"):
                stopped_by_job.append(ex.role)  # trainer 0 stops the stores at the end
                continue
            if ex.role in launch.replicated and status.state in ("training", "done"):
                lost.append(ex.role)
                store_lost(launch.machine, ex.role, ex)
                continue
            f = failure_of(ex, kinds[ex.role])
            if f is not None:
                raise f
        # Done machines keep serving until the job stops their stores; a machine without
        # stores (a placement plan may leave it only trainers, or nothing) is needed by
        # no one once its trainers are done.
        # Parameter servers are stopped by trainer 0 too: wait for theirs to exit as well.
        ps_done = {r.role for r in launch.of_kind("ps")} <= set(stopped_by_job)
        lost_all = all(r.role in lost for r in launch.of_kind("store"))
        served = (stopped_by_job or lost_all) and ps_done
        if stop.is_set() or (served and status.state == "done"):
            raise _Stopped

    def wait_until(
        cond: Callable[[], bool], what: str | Callable[[], str], timeout: float | None = None
    ) -> None:
        deadline = time.monotonic() + (launch.ready_timeout_s if timeout is None else timeout)
        while not cond():
            check()
            if time.monotonic() > deadline:
                raise JobFailed(
                    RoleName.worker(launch.machine),
                    launch.machine,
                    None,
                    f"timed out after {launch.ready_timeout_s:g}s waiting for "
                    f"{what() if callable(what) else what}",
                )
            time.sleep(interval)

    try:
        status.update(sup, "starting")
        _make_live_dirs(launch)
        own: list[Endpoint] = []
        for wave in store_waves(launch):  # main servers first: backups attach to them
            for r in wave:
                sup.start(launch.command(r))
            status.update(sup)
            up = [r.ready for r in wave if r.ready is not None]
            own += up
            wait_until(all_up(up, is_ready), "this machine's store servers")
        status.update(sup, "serving")
        pending = list(launch.wait_for)
        others = servers_up(pending, lambda e: e in own or is_ready(e))
        wait_until(others, lambda: f"the store servers of other machines ({waited_for(pending)})")
        for kind in ("sampler", "trainer"):
            for r in launch.of_kind(kind):
                sup.start(launch.command(r))
        status.update(sup, "training")
        trainers = {r.role for r in launch.of_kind("trainer")}
        wait_until(lambda: trainers <= set(sup.exits()), "the trainers", float("inf"))
        status.update(sup, "done")
        while True:
            check()
            time.sleep(interval * 2)
    except _Stopped:
        state = "done" if status.state == "done" else "stopped"
        if status.state in ("training", "done"):
            # told to stop (not ended by the job stopping its stores): alone, or with all?
            if stop.is_set() and leave_alone is not None and leave_alone():
                state = "left"
                _leave(launch, sup)
            else:
                _stop_trainers_first(launch, sup, interval)
    except JobFailed as exc:
        failure, state = exc, "failed"
        status.fail(sup, exc)  # reported before the (slow) stop, so the launcher sees it first
    sup.stop()
    # stores stopped by SIGKILL left their segments: nobody else may be left to remove them
    # (the launcher killed with -9 is why this worker stops)
    remove_shm({r: p for r, p in sup.pids().items() if kinds.get(r) == "store"})
    status.update(sup, state)
    exits: dict[RoleName, int | None] = {role: None for role in kinds}
    exits.update({role: ex.exit_code for role, ex in sup.exits().items()})
    return MachineResult(launch.machine, state, exits, failure)
