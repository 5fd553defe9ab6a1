"""The launcher's side of elastic trainers (``runtime.elastic``, docs/elastic.md).

A machine is *lost* when its worker process ends (killed with every role it ran, or
its host gone) while the job trains. With ``runtime.elastic`` and at least
``minMachines`` machines left, the launcher says so (:func:`machine_lost_event`: which
machine, when, which replicas serve its partitions, which machines' trainers go on)
and waits for the others; the surviving trainers re-form their group by themselves
(:mod:`graphrun.train.elastic`). Below ``minMachines`` the loss fails the attempt, and
the job restarts as without elastic.

A machine whose processes live on but stopped answering (stopped with SIGSTOP, its
link cut) never ends by itself: it is *fenced* (:class:`Fencing`). Once the surviving
trainers re-formed without it (their ``reformed`` event names it in ``lost_machines``),
or once its worker reports a failed role while the job trains (a cut-off trainer gives
up), the launcher counts it lost as above and kills every process left of it
(:func:`kill_tree`), so the job ends without waiting for it and none of its store
servers goes on taking writes the others never see.

A lost machine is then started again (:class:`Rejoins`, ``runtime.elastic.maxRejoins``
times at most, once the trainers re-formed without it): its worker with ``--join`` runs
its trainers only, which join the others at their next epoch boundary. Its store servers are not
started again: their replicas serve, and a new primary would miss what was written since.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import psutil

from graphrun.job.elastic import may_rejoin, took_over
from graphrun.job.spec.runtime import ElasticSpec
from graphrun.machine.launch import MachineLaunch
from graphrun.machine.process import Sink
from graphrun.names import RoleName
from graphrun.record import (
    UNSET,
    MachineLost,
    Reformed,
    Relaunched,
    emit,
    read_status,
    role_event,
)

# the states of a machine whose loss the others survive: its trainers started; "left":
# its worker, told to stop without the job-wide stop mark, killed its roles itself
SURVIVABLE = ("training", "done", "left")
REJOIN_DELAY_S = 2.0  # from a machine's loss to its start again (its sockets gone)


def store_machines(launches: Sequence[MachineLaunch]) -> dict[RoleName, str]:
    """Every store server role of the job and its machine."""
    return {r.role: m.machine for m in launches for r in m.of_kind("store")}


def machine_lost_event(
    machine: str,
    launches: Sequence[MachineLaunch],
    exit_code: int | None,
    lost: Sequence[str],
    fenced: str | None = None,
    back: Collection[str] = (),
) -> MachineLost:
    """The ``machine_lost`` event: which partitions' replicas take over (and where), and
    the machines whose trainers go on, by the job core's rule
    (:func:`graphrun.job.elastic.took_over`; ``lost``: every machine lost and not back;
    ``back``: those started again, whose store servers are gone). ``fenced``: why a
    machine whose processes still ran was declared lost (they were killed)."""
    trainers = [m.machine for m in launches if m.of_kind("trainer")]
    stores_gone = {*lost, *back}
    over = took_over(store_machines(launches), trainers, machine, stores_gone, lost)
    return MachineLost(
        machine=machine,
        exit_code=exit_code,
        time=round(time.time(), 3),
        took_over=over,
        fenced=UNSET if fenced is None else fenced,
    )


def reformed_without(line: str) -> list[str]:
    """The machines a trainer's ``reformed`` event line (``[trainer:0@m0] {"event":
    "reformed", ..., "lost_machines": [...]}``, read as a
    :class:`~graphrun.record.Reformed`) says the group re-formed without."""
    got = role_event(line)
    if got is None or got[0].kind != "trainer" or not isinstance(got[2], Reformed):
        return []
    return got[2].lost_machines


class Fencing:
    """A sink filter between the workers and the console: every line passes unchanged,
    and the machines named by the trainers' ``reformed`` events are kept for
    :meth:`take` (the launcher's loop fences them)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self._named: list[str] = []
        self._lock = threading.Lock()

    def write(self, text: str, /) -> int:
        for line in text.splitlines():
            named = reformed_without(line)
            if named:
                with self._lock:
                    self._named += named
        return self.sink.write(text)

    def flush(self) -> None:
        self.sink.flush()

    def take(self) -> list[str]:
        """The machines named since the last call."""
        with self._lock:
            named, self._named = self._named, []
        return named


def machine_processes(worker: int) -> list[psutil.Process]:
    """A machine's processes: its worker ``worker``, the worker's descendants, and the
    roles its status file lists (warm-started trainers are the warm server's children)
    with their descendants."""
    try:
        root = psutil.Process(worker)
        procs = {p.pid: p for p in [root, *root.children(recursive=True)]}
    except psutil.Error:
        return []
    try:
        argv = root.cmdline()
        plan = Path(argv[argv.index("--plan") + 1])
        status = read_status(Path(argv[argv.index("--status-dir") + 1]) / f"{plan.stem}.json")
    except (psutil.Error, ValueError, IndexError):
        return list(procs.values())
    if status is None:  # no status yet: no role started
        return list(procs.values())
    for pid in status.pids().values():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.pid not in procs and p.create_time() >= root.create_time():
                for q in [p, *p.children(recursive=True)]:
                    procs[q.pid] = q
    return list(procs.values())


def kill_tree(pid: int) -> list[int]:
    """SIGKILL machine worker ``pid`` and all its processes (its descendants and its
    warm-started trainers: :func:`machine_processes`), all stopped
    (SIGSTOP) first so that none sees another die and reacts (a worker reporting its
    roles' deaths, a store server answering one more write); returns the pids killed. A
    stopped process dies of SIGKILL as it is (no SIGCONT needed); so does one inside a
    network namespace."""
    procs = machine_processes(pid)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGSTOP)
    # a child forked meanwhile: a second look
    procs += [c for c in machine_processes(pid) if c not in procs]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    return [p.pid for p in procs]


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
    descendant of this process) and everything the worker started (:func:`kill_tree`);
    returns the pids killed."""
    return [pid for w in worker_pids(machine) for pid in kill_tree(w)]


def stop_machine(machine: str) -> list[int]:
    """SIGSTOP every process of a local job's ``machine`` (chaos: it goes silent, its
    sockets stay open); returns the pids stopped."""
    stopped = []
    for w in worker_pids(machine):
        for p in machine_processes(w):
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGSTOP)
                stopped.append(p.pid)
    return stopped


def cut_link(machine: str) -> str:
    """Take the link of a netns job's ``machine`` down (chaos: its processes run on but
    reach no other machine; the file system stays shared); returns its namespace."""
    from graphrun.errors import HostError

    pids = worker_pids(machine)
    if not pids:
        raise HostError(f"cut_link: no worker of machine {machine} runs")
    argv = ["ip", "netns", "identify", str(pids[0])]
    ns = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
    if not ns:
        raise HostError(f"cut_link: machine {machine} is not in a network namespace")
    down = ["ip", "-n", ns, "link", "set", "eth0", "down"]
    out = subprocess.run(down, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise HostError(f"{' '.join(down)}: {out.stderr.strip()}")
    return ns


class _Stopper(Protocol):
    def stop(
        self, roles: Sequence[RoleName] | None = None, grace_s: float | None = None
    ) -> None: ...


class Rejoins:
    """The lost machines a local job starts again to join its trainers at an epoch
    boundary: each at most ``runtime.elastic.maxRejoins`` times (the job core's
    :func:`graphrun.job.elastic.may_rejoin`), ``delay_s`` after its loss at the earliest,
    once the trainers re-formed without it.
    One that has not come in when every other machine is done gets ``2 * grace_s + 10``
    seconds more, then is stopped and counted lost."""

    def __init__(
        self, elastic: ElasticSpec | None, grace_s: float, delay_s: float = REJOIN_DELAY_S
    ) -> None:
        self.elastic, self.delay_s = elastic, delay_s
        self.wait_s = 2 * grace_s + 10
        self.count: dict[str, int] = {}
        self.pending: dict[str, float] = {}  # machine: when to start it (time.monotonic)
        self.started: set[str] = set()  # machines started again (their worker has --join)
        # machines the trainers re-formed without (their "reformed" events): one is started
        # again only once the others no longer count on it (else the fencing of the
        # re-form would take its new worker for the lost one)
        self.reformed: set[str] = set()
        self._others_done: float | None = None

    def lost(self, machine: str) -> None:
        """``machine`` was lost: start it again after ``delay_s`` if it has rejoins left."""
        if may_rejoin(self.elastic, self.count.get(machine, 0)):
            self.pending[machine] = time.monotonic() + self.delay_s

    def seen(self, named: Sequence[str]) -> None:
        """The trainers re-formed without the machines ``named``."""
        self.reformed.update(named)

    def due(
        self, launches: Sequence[MachineLaunch], sink: Sink, busy: Collection[RoleName] = ()
    ) -> list[MachineLaunch]:
        """The machines to start again now (each said on the console: ``relaunched``):
        ``delay_s`` after the loss, once the trainers re-formed without it and its old
        worker (a role in ``busy``, still running) is gone."""
        now, out = time.monotonic(), []
        for launch in launches:
            m = launch.machine
            ready = m in self.reformed and RoleName.worker(m) not in busy
            if self.pending.get(m, float("inf")) <= now and ready:
                del self.pending[m]
                self.reformed.discard(m)
                self.count[m] = self.count.get(m, 0) + 1
                self.started.add(m)
                event = Relaunched(
                    machine=m, rejoin=self.count[m],
                    max_rejoins=self.elastic.max_rejoins if self.elastic else 0,
                    roles="trainers (no store servers)", time=round(time.time(), 3),
                )  # fmt: skip
                emit(event, sink)
                out.append(launch)
        return out

    def skip(self, lost: Collection[str]) -> set[str]:
        """Machines whose reported failure does not fail the attempt: lost ones, and those
        started again (their worker's exit decides, :meth:`lost`)."""
        return set(lost) | self.started

    def finished(self, states: Mapping[str, str], lost: list[str], sup: _Stopper) -> bool:
        """Whether every machine not lost is done; a machine started again that is not when
        all the others are is stopped after :attr:`wait_s` and added to ``lost``."""
        going = [m for m in states if m not in lost]
        if all(states[m] == "done" for m in going):
            return True
        if not all(states[m] == "done" for m in going if m not in self.started):
            self._others_done = None
            return False
        self.pending.clear()  # nobody left to join
        now = time.monotonic()
        if self._others_done is None:
            self._others_done = now
        if now - self._others_done < self.wait_s:
            return False
        for m in going:
            if states[m] != "done":
                sup.stop([RoleName.worker(m)])
                lost.append(m)
        return True
