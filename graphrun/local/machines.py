"""The local backend: every machine of a job is a ``graphrun worker`` process on this host.

:class:`LocalMachines` runs one attempt of a job: it writes each machine's launch
plan, starts one worker per machine (optionally inside that machine's network
namespace, see :mod:`graphrun.local.netns`), and watches the workers' status files
and exit codes. The attempt

* succeeds when every machine reports ``done`` (all trainers exited 0): the workers
  are then told to stop, which stops the store servers;
* fails with :class:`~graphrun.errors.JobFailed` naming the role, machine and exit
  code as soon as any worker reports a failure or dies, when the deadline passes,
  or when the caller's ``stop`` event is set (Ctrl-C / SIGTERM);
* with ``runtime.elastic`` goes on without a machine lost while the job trains — its
  worker died, its trainers failed, or the surviving trainers re-formed without it (a
  stopped or cut-off machine, then *fenced*: every process left of it killed) — as long
  as the job core's rule allows (:func:`graphrun.job.elastic.why_not_survived`:
  ``minMachines`` left, every partition with a copy; :mod:`graphrun.local.elastic`).

Whatever happens, every worker (and through it every role) is stopped — SIGTERM,
then SIGKILL after the grace period — before :meth:`LocalMachines.run` returns or
raises; if this process is killed (SIGKILL), the kernel sends every worker SIGTERM
(``PR_SET_PDEATHSIG``) and the workers stop their roles themselves. Before it signals
the workers it writes the job-wide stop mark (:mod:`graphrun.machine.stopmark`), so
that the workers of an elastic job checkpoint rather than leave alone. Deciding what an
attempt means for the job (restart, phases) is the workflow's business
(:mod:`graphrun.local.runner`).
"""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

import graphrun
from graphrun.errors import JOB, JobFailed
from graphrun.job.blame import culprit, lost_a_peer
from graphrun.job.elastic import why_not_survived
from graphrun.job.spec.runtime import ElasticSpec
from graphrun.local.elastic import (
    SURVIVABLE,
    Fencing,
    Rejoins,
    kill_tree,
    machine_lost_event,
    store_machines,
)
from graphrun.machine.launch import MachineLaunch
from graphrun.machine.process import (
    RoleCommand,
    RoleExit,
    Sink,
    Supervisor,
    still_running,
)
from graphrun.machine.stopmark import write_mark
from graphrun.machine.warm import READY_TIMEOUT_S, SOCKET_DIR_PREFIX, WarmStarter
from graphrun.names import RoleName
from graphrun.record import RoleFailure, emit, read_status
from graphrun.store.shm import clean_stale

Wrap = Callable[[str], Sequence[str]]  # machine -> command prefix (e.g. ip netns exec NS)


def _trains(role: RoleName) -> bool:
    """Whether ``role`` is a trainer or sampler (they start once the machine trains)."""
    return role.kind in ("trainer", "sampler")


def package_env() -> dict[str, str]:
    """Environment for child processes so they import this very graphrun."""
    import os

    root = str(Path(graphrun.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH", "")
    if path.split(os.pathsep)[0] == root:  # first already (a launcher started with this)
        return {"PYTHONPATH": path}
    return {"PYTHONPATH": root + (os.pathsep + path if path else "")}


@dataclass(frozen=True)
class AttemptResult:
    """A successful attempt: every role's exit code (``None``: never started)."""

    exits: dict[RoleName, int | None]
    states: dict[str, str]


class LocalMachines:
    """Runs the machines of one job attempt as worker processes."""

    def __init__(
        self,
        run_dir: Path,
        sink: Sink | None = None,
        grace_s: float = 5.0,
        wrap: Wrap | None = None,
        python: str = sys.executable,
        interval: float = 0.1,
        elastic: ElasticSpec | None = None,
        warm: bool = True,
        shared: Path | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.sink = sink if sink is not None else sys.stdout
        self.grace_s = grace_s
        self.wrap = wrap or (lambda machine: ())
        self.python = python
        self.interval = interval
        self.last_exits: dict[RoleName, int | None] = {}
        self.last_pids: dict[RoleName, int] = {}
        # runtime.elastic: a lost machine's trainers are gone, the others go on
        self.elastic = elastic
        self.lost: list[str] = []
        self.lost_codes: dict[str, int | None] = {}  # each lost machine's worker's exit code
        # one warm server per host that runs two or more CPU trainers (graphrun.machine.warm)
        self.warm = warm
        self.shared = shared  # a running server this host's trainers fork from (any number)
        self._warm_sockets: dict[tuple[str, ...], Path] = {}
        self._warm_dir: Path | None = None
        # runtime.elastic.maxRejoins: a lost machine is started again to join at an epoch
        # boundary (graphrun.local.elastic.Rejoins)
        self.rejoins = Rejoins(elastic, grace_s)

    @staticmethod
    def workers_of(run_dir: Path) -> list[psutil.Process]:
        """The living machine workers of a run in ``run_dir`` (whoever started them: a
        ``graphrun run`` killed with -9 leaves its workers stopping their roles for a
        while, writing into the run's status directory as they go)."""
        status = str(Path(run_dir) / "status")
        out = []
        for p in psutil.process_iter(["cmdline"]):
            argv = p.info["cmdline"] or []
            try:
                if argv[argv.index("--status-dir") + 1] == status and "worker" in argv:
                    out.append(p)
            except (ValueError, IndexError):
                continue
        return still_running(out)

    @staticmethod
    def stop_mark(status_dir: Path) -> Path:
        """The file that says the whole job stops (:mod:`graphrun.machine.stopmark`),
        written before the workers are signalled: a worker of an elastic job told to stop
        without it leaves alone (the others go on), with it checkpoints with the others."""
        return status_dir / "stop"

    def _worker_command(
        self, launch: MachineLaunch, status_dir: Path, join: bool = False
    ) -> RoleCommand[RoleName]:
        plan = launch.write(self.run_dir / "launch" / f"{launch.machine}.json")
        argv = (
            *self.wrap(launch.machine),
            self.python, "-m", "graphrun", "worker",
            "--plan", str(plan),
            "--status-dir", str(status_dir),
            "--log-dir", str(self.run_dir / "logs" / launch.machine),
            "--grace", str(self.grace_s),
            # written before any worker is signalled: no update lag to wait for
            "--stop-mark", str(self.stop_mark(status_dir)), "--stop-mark-wait", "0",
            *(("--join",) if join else ()),
        )  # fmt: skip
        sock = self._warm_sockets.get(tuple(self.wrap(launch.machine)))
        if sock is not None:
            argv = (*argv, "--warm-socket", str(sock))
        return RoleCommand(RoleName.worker(launch.machine), launch.machine, argv, package_env())

    def run(
        self,
        launches: Sequence[MachineLaunch],
        stop: threading.Event | None = None,
        deadline: float | None = None,
        on_states: Callable[[Mapping[str, str]], None] | None = None,
    ) -> AttemptResult:
        """Run every machine until all are done; raise JobFailed otherwise.

        ``deadline`` is a ``time.monotonic()`` value; ``on_states`` is called with
        machine -> state whenever a machine's state changes.
        """
        stop = stop or threading.Event()
        status_dir = self.run_dir / "status"
        shutil.rmtree(status_dir, ignore_errors=True)
        status_dir.mkdir(parents=True)
        (self.run_dir / "launch").mkdir(parents=True, exist_ok=True)
        machines = [m.machine for m in launches]
        states = dict.fromkeys(machines, "pending")
        # Workers print their roles' lines already prefixed with [role@machine]. A worker
        # told to stop may take a grace period for its trainers' checkpoint and then one for
        # its stores; one whose launcher dies (kill -9) gets SIGTERM and stops its roles and
        # segments.
        fencing = Fencing(self.sink) if self.elastic is not None else None
        sup = Supervisor[RoleName](
            self.run_dir / "logs", fencing or self.sink, 2 * self.grace_s + 3, prefix=False,
            death_signal=signal.SIGTERM,
        )  # fmt: skip
        failure: JobFailed | None = None
        # a launcher killed with -9: its warm servers get SIGTERM, remove their sockets, end;
        # named by their text: a host's warm server is no role of the job
        warm_sup = Supervisor[str](
            self.run_dir / "logs", self.sink, grace_s=2.0, death_signal=signal.SIGTERM
        )
        try:
            self._start_warm(launches, warm_sup)
            for launch in launches:
                sup.start(self._worker_command(launch, status_dir))
            while True:
                changed = self._read_states(status_dir, states)
                if changed and on_states is not None:
                    on_states(dict(states))
                if fencing is not None:
                    named = fencing.take()
                    self._fence(launches, states, status_dir, named, sup.pids())
                    self.rejoins.seen(named)
                ended = self._survive(launches, states, sup.poll())
                failure = self._failure(
                    status_dir, ended, skip=self.rejoins.skip(self.lost), lost=self._lost()
                )
                if failure is not None:
                    raise failure
                for launch in self.rejoins.due(launches, self.sink, sup.running()):
                    self.lost.remove(launch.machine)  # back: its worker's exit matters again
                    sup.start(self._worker_command(launch, status_dir, join=True))
                if self.rejoins.finished(states, self.lost, sup):
                    break
                if stop.is_set():
                    raise JobFailed(JOB, "local", None, "stopped by a signal (SIGTERM/Ctrl-C)")
                if deadline is not None and time.monotonic() > deadline:
                    raise JobFailed(JOB, "local", None, "activeDeadlineSeconds exceeded")
                time.sleep(self.interval)
        except JobFailed as exc:
            failure = exc
        finally:
            if sup.running():  # whatever the reason, every machine stops: say so first
                write_mark(self.stop_mark(status_dir))
            sup.close()
            self._stop_warm(warm_sup)
            if self.lost:  # a lost machine's stores were killed: their segments stay
                clean_stale()
        # A worker may have reported a failure while being stopped for another reason.
        self._read_states(status_dir, states)
        exits = self._role_exits(status_dir, launches)
        self.last_exits = exits
        self.last_pids = self._role_pids(status_dir, launches)
        if failure is not None:
            first = self._failure(
                status_dir,
                [],
                only_status=True,
                skip=self.rejoins.skip(self.lost),
                lost=self._lost(),
            )
            bystander = first is not None and lost_a_peer(first.exit_code, first.reason)
            if bystander and not lost_a_peer(failure.exit_code, failure.reason):
                first = None  # a survivor that lost the machine which died: not the cause
            if first is not None and not (failure.role == JOB and stop.is_set()):
                failure = first
            raise failure
        return AttemptResult(exits, dict(states))

    def _start_warm(self, launches: Sequence[MachineLaunch], sup: Supervisor[str]) -> None:
        """Start a warm server for each host (each distinct command prefix) that runs two
        or more CPU trainers, and wait until it listens; a host whose server does not
        listen within :data:`~graphrun.machine.warm.READY_TIMEOUT_S` starts its trainers
        cold. This host's trainers (no prefix) fork from the shared server if one is
        given, however few."""
        self._warm_sockets = {}
        if not self.warm:
            return
        trainers: dict[tuple[str, ...], int] = {}
        for launch in launches:
            host = tuple(self.wrap(launch.machine))
            n = sum(WarmStarter.takes(r.argv) is not None for r in launch.roles)
            trainers[host] = trainers.get(host, 0) + n
        if self.shared is not None and trainers.pop((), 0) > 0:
            self._warm_sockets[()] = self.shared
        hosts = [host for host, n in trainers.items() if n >= 2]
        if not hosts:
            return
        # a short path (AF_UNIX allows 108 bytes) in a directory only this user enters
        self._warm_dir = Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX))
        sockets = {}
        for i, host in enumerate(hosts):
            path = self._warm_dir / f"{i}.sock"
            argv = (*host, self.python, "-m", "graphrun.machine.warm", "--socket", str(path))
            sup.start(RoleCommand(f"warm:{i}", "local", argv, package_env()))
            sockets[host] = path
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(p.exists() for p in sockets.values()) and time.monotonic() < deadline:
            if sup.poll():  # one ended at once
                break
            time.sleep(0.01)
        self._warm_sockets.update({host: p for host, p in sockets.items() if p.exists()})

    def _stop_warm(self, sup: Supervisor[str]) -> None:
        sup.close()
        self._warm_sockets = {}
        if self._warm_dir is not None:
            shutil.rmtree(self._warm_dir, ignore_errors=True)
            self._warm_dir = None

    def _survive(
        self,
        launches: Sequence[MachineLaunch],
        states: Mapping[str, str],
        ended: list[RoleExit[RoleName]],
    ) -> list[RoleExit[RoleName]]:
        """The workers' exits that fail the attempt: with ``runtime.elastic``, a worker
        that died while its machine trained is a lost machine the others go on without,
        as long as the job core's rule allows (:meth:`_survivable`)."""
        fatal = []
        for ex in ended:
            machine = ex.machine  # a worker's exit: its machine's
            if machine in self.lost:  # fenced: counted when it was
                continue
            # a machine started again to re-join may die in any state: it is not needed
            back = machine in self.rejoins.started
            died = ex.exit_code != 0 and (back or states.get(machine) in SURVIVABLE)
            if died and self._survivable(machine, launches, states):
                self.lost.append(machine)
                self.lost_codes[machine] = ex.exit_code
                emit(
                    machine_lost_event(
                        machine, launches, ex.exit_code, self.lost, back=self.rejoins.started
                    ),
                    self.sink,
                )
                self.rejoins.lost(machine)
                continue
            fatal.append(ex)
        return fatal

    def _survivable(
        self, machine: str, launches: Sequence[MachineLaunch], states: Mapping[str, str]
    ) -> bool:
        """Whether the others go on without ``machine`` (:mod:`graphrun.job.elastic`): the
        store servers of every machine lost in the attempt are gone, also of those back;
        a machine back waits for no store server (it is not starting)."""
        gone = {*self.lost, *self.rejoins.started}
        starting = [m for m, s in states.items() if s not in SURVIVABLE and m not in gone]
        stores = store_machines(launches)
        lost = len(self.lost)
        why = why_not_survived(self.elastic, machine, len(states), lost, stores, gone, starting)
        return why is None

    def _fence(
        self,
        launches: Sequence[MachineLaunch],
        states: Mapping[str, str],
        status_dir: Path,
        named: Sequence[str],
        pids: Mapping[RoleName, int],
    ) -> None:
        """Fence the machines that are lost although their worker still runs: those the
        trainers re-formed without (``named``), and one whose worker reports a failed role
        while the job trains (a cut-off trainer that gave up, a crashed one: the others
        re-form without it) — as long as :meth:`_survivable`; its
        processes are killed (:mod:`graphrun.local.elastic`)."""
        trained = [m for m in named if states.get(m) in SURVIVABLE]
        why = dict.fromkeys(trained, "the trainers re-formed without it")
        for m, s in states.items():
            st = read_status(status_dir / f"{m}.json") if s == "failed" else None
            f = st.failure if st else None
            if f and m not in why and _trains(f.role):  # so it was training
                why[m] = f"{f.role} failed: {f.reason[:200]}"
        for machine, reason in why.items():
            if machine in self.lost:
                continue
            if not self._survivable(machine, launches, states):
                continue  # too few left, or a partition's last copy: it fails the attempt
            self.lost.append(machine)
            self.rejoins.lost(machine)
            event = machine_lost_event(
                machine, launches, None, self.lost, fenced=reason, back=self.rejoins.started
            )
            pid = pids.get(RoleName.worker(machine))
            if pid is not None:
                kill_tree(pid)
            emit(event, self.sink)

    @staticmethod
    def _read_states(status_dir: Path, states: dict[str, str]) -> bool:
        changed = False
        for machine in states:
            st = read_status(status_dir / f"{machine}.json")
            if st is not None and st.state != states[machine]:
                states[machine] = st.state
                changed = True
        return changed

    @staticmethod
    def _failure(
        status_dir: Path,
        ended: Sequence[RoleExit[RoleName]],
        only_status: bool = False,
        skip: Collection[str] = (),
        lost: Mapping[str, int | None] | None = None,
    ) -> JobFailed | None:
        """The failure that ends the attempt, if any (``skip``: machines whose reported
        failures do not: lost, or started again to re-join). When every reported failure
        only lost a peer, a machine that died (a worker ``ended`` without reporting one,
        or a ``lost`` machine) is the cause: not the survivor that noticed it first."""
        died = LocalMachines._died(status_dir, ended)
        reported: list[RoleFailure] = []
        for path in sorted(status_dir.glob("*.json")):
            if path.stem in skip:
                continue
            st = read_status(path)
            if st is not None and st.failure is not None:
                reported.append(st.failure)
        bystanders = all(lost_a_peer(f.exit_code, f.reason) for f in reported)
        if reported and bystanders and (died or lost):
            return died or LocalMachines._lost_first(lost or {})
        f = culprit(reported, lambda f: (f.exit_code, f.reason, f.time))
        if f is not None:
            return JobFailed(f.role, f.machine, f.exit_code, f.reason)
        return None if only_status else died

    @staticmethod
    def _died(status_dir: Path, ended: Sequence[RoleExit[RoleName]]) -> JobFailed | None:
        """A worker that died without writing a failure (one that wrote one ended
        because of it: its failure is the report)."""
        for ex in ended:
            machine = ex.machine
            st = read_status(status_dir / f"{machine}.json")
            if st is not None and st.failure is not None:
                continue
            if ex.exit_code != 0 or st is None or st.state != "done":
                return JobFailed(ex.role, machine, ex.exit_code, ex.reason() or "worker exited")
        return None

    @staticmethod
    def _lost_first(lost: Mapping[str, int | None]) -> JobFailed:
        machine, code = next(iter(lost.items()))
        reason = "its machine was lost; the trainers could not go on without it"
        return JobFailed(RoleName.worker(machine), machine, code, reason)

    def _lost(self) -> dict[str, int | None]:
        return {m: self.lost_codes.get(m) for m in self.lost}

    @staticmethod
    def _role_pids(status_dir: Path, launches: Sequence[MachineLaunch]) -> dict[RoleName, int]:
        pids: dict[RoleName, int] = {}
        for launch in launches:
            st = read_status(status_dir / f"{launch.machine}.json")
            if st is not None:
                pids.update(st.pids())
        return pids

    @staticmethod
    def _role_exits(
        status_dir: Path, launches: Sequence[MachineLaunch]
    ) -> dict[RoleName, int | None]:
        exits: dict[RoleName, int | None] = {}
        for launch in launches:
            st = read_status(status_dir / f"{launch.machine}.json")
            roles = st.roles if st is not None else {}
            for r in launch.roles:
                got = roles.get(r.role)
                exits[r.role] = got.exit_code if got is not None else None
        return exits
