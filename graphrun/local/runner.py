"""``graphrun run``: one GraphJob on this machine, driven by the workflow state machine.

:class:`LocalJob` turns what its processes do into workflow events
(:mod:`graphrun.job.workflow`) and follows the phases:

``Partitioning``  generate the dataset (jobs with ``graph.generator``) and partition it,
                  each a process, unless a matching partition directory exists: one
                  made by an earlier run from another dataset, another version of it
                  or other partition settings (:mod:`graphrun.local.source`) is made
                  again; a dataset named by the job must exist (a job
                  on a running store, ``graph.store``, has nothing to partition or
                  serve: its trainers join that store, and never stop it);
``Distributing``  check the partition directory against the job (on one host every
                  machine reads the same files, so nothing moves);
``Serving``       write the hosts file and key, start one worker per machine (in its
                  network namespace with ``hosts: netns``); every worker starts its
                  store servers, which must accept connections before any trainer starts;
``Training``      trainers run; the job succeeds once every machine's trainers exit 0.

A failed role fails the attempt (:class:`~graphrun.local.machines.LocalMachines` stops
everything); within ``runPolicy.backoffLimit`` the job restarts its servers and
trainers, which resume from the last checkpoint. ``activeDeadlineSeconds`` and a
stop request (SIGTERM / Ctrl-C, the ``stop`` event) fail the job the same way. After
every attempt the job's shared-memory segments are removed. The state (phase,
conditions) is written to ``RUN/state.json`` at every transition.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from msgspec import structs

from graphrun.errors import JOB, DatasetError, JobFailed, SpecError, UserError, WorkflowError
from graphrun.files import atomic_dir, write_atomic
from graphrun.job.blame import culprit
from graphrun.job.hosts import Hosts
from graphrun.job.spec import GraphJob
from graphrun.job.workflow import (
    TERMINAL,
    Event,
    EventKind,
    JobState,
    Launcher,
    Phase,
    RunState,
    initial_state,
    read_run_state,
    transition,
)
from graphrun.local.machines import LocalMachines, Wrap, package_env
from graphrun.local.preflight import (
    check_before_start,
    check_checkpoint,
    check_gpus_here,
    check_partitions,
    check_store,
)
from graphrun.local.source import Source, current, read_source, stale_reason, write_source
from graphrun.machine.launch import MachineLaunch
from graphrun.machine.process import RoleCommand, Sink, Supervisor, log_name
from graphrun.machine.roles import (
    JobPaths,
    job_paths,
    job_placement,
    machine_launches,
    plan_hosts,
    store_key_file,
)
from graphrun.machine.trainer import default_threads
from graphrun.machine.warm import shared_socket
from graphrun.machine.worker import SHM_DIR, remove_shm
from graphrun.names import RoleName
from graphrun.partition.format import load_partition_config

#: how long a run waits for the workers of a killed run in its directory to end (each
#: takes up to two grace periods to stop its roles)
LOST_RUN_WAIT_S = 60.0


@dataclass(frozen=True)
class RunOptions:
    run_dir: Path | None = None
    resume: bool = False
    hosts: str | None = None  # "local" | "netns"; None: the job's runtime.hosts
    grace_s: float = 5.0
    bandwidth_mbit: float | None = None
    cluster: Path | None = None  # hosts netns: a cluster file giving each host its shape
    profile_dir: Path | None = None
    python: str = sys.executable
    ready_timeout_s: float = 120.0
    stall_timeout_s: float = 30.0  # a role stopped (SIGSTOP) this long fails its machine
    env: Mapping[str, str] = field(default_factory=dict)  # added to every role's environment
    trainer_args: tuple[str, ...] = ()  # extra trainer flags, e.g. ("--aggr", "csr")
    warm_start: bool = True  # CPU trainers fork from their host's warm server (machine.warm)


@dataclass(frozen=True)
class JobReport:
    state: JobState
    exits: dict[RoleName, int | None]
    paths: JobPaths
    elapsed_s: float


class _Ended(Exception):
    """The attempt ended for a reason that is not a role failure (deadline, stop).
    Control flow inside this module, never raised to a caller: outside the error tree
    on purpose."""

    def __init__(self, kind: EventKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _kebab(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).replace("_", "-").lower()


class LocalJob:
    """Runs one GraphJob with the local backend."""

    def __init__(
        self,
        job: GraphJob,
        job_file: Path,
        opts: RunOptions | None = None,
        sink: Sink | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.job = job
        self.opts = opts or RunOptions()
        self.sink = sink if sink is not None else sys.stdout
        self.stop = stop or threading.Event()
        self.paths = job_paths(job, job_file, self.opts.run_dir)
        self.roles = job_placement(job, self.paths)  # validates the placement up front
        self.state = initial_state(self._now(), job.spec.run_policy.backoff_limit)
        self.exits: dict[RoleName, int | None] = {}
        self.pids: dict[RoleName, int] = {}  # last pid of every role (for tests and reports)
        self._deadline: float | None = None
        self._shared: Path | None = None  # a running warm server (machine.warm.SHARED_ENV)

    # ---- the workflow ---------------------------------------------------------------

    @staticmethod
    def _now() -> datetime:
        return datetime.now(UTC)

    def _event(self, event: Event) -> None:
        before = self.state.phase
        self.state = transition(self.state, event, self._now())
        # a job on a running store (graph.store) partitions and distributes nothing: the
        # state passes those phases, the console does not show them
        on_store = self.job.spec.graph.store is not None
        quiet = on_store and self.state.phase in (Phase.PARTITIONING, Phase.DISTRIBUTING)
        if self.state.phase is not before and not quiet:
            cond = self.state.conditions[-1] if self.state.conditions else None
            why = f" ({event.reason or cond.reason})" if cond else ""
            if on_store and before is Phase.DISTRIBUTING:
                why = " (on the running store)"
            self._say(f"phase {self.state.phase.value}{why}")
        self._write_state()

    def _say(self, msg: str) -> None:
        self.sink.write(f"[graphrun] {msg}\n")
        self.sink.flush()

    def _write_state(self) -> None:
        from graphrun.store.shm import start_ms

        launcher = Launcher(os.getpid(), start_ms())
        state = RunState.of(self.state.status(), launcher, self.paths.job_file)
        state.write(self.paths.state_file)

    def _after_a_lost_run(self) -> None:
        """A previous ``graphrun run`` of this job that was killed (-9) left its state
        non-terminal and its stores' shared memory behind: say so in the new state, and
        remove the segments of dead stores. Refuse to start beside a live run."""
        from graphrun.store.shm import clean_stale, process_alive

        path = self.paths.state_file
        try:
            before = read_run_state(json.loads(path.read_text()), str(path))
        except (OSError, ValueError, WorkflowError):
            return
        phase, launcher = before.phase.value, before.launcher
        if before.phase in TERMINAL or launcher is None:
            return
        pid, start = launcher.pid, launcher.start
        if process_alive(pid, start):
            raise SpecError(
                f"{self.paths.job_file}: job {self.job.name} is running already "
                f"(graphrun run, pid {pid}; its state is {path})"
            )
        lost = f"the previous run (graphrun run, pid {pid}) was lost in phase {phase}"
        self._wait_for_workers_of_a_lost_run(pid)
        removed = clean_stale(SHM_DIR)
        if removed:
            lost += f"; removed {len(removed)} shared-memory segments it left"
        self._say(lost)
        self.state = initial_state(self._now(), self.job.spec.run_policy.backoff_limit, lost)

    def _wait_for_workers_of_a_lost_run(self, pid: int) -> None:
        """A killed ``graphrun run``'s workers got SIGTERM and stop their roles (a grace
        period each for trainers and stores) while writing into the run's status
        directory: the next run starts once they are gone, or refuses after
        ``LOST_RUN_WAIT_S``."""
        deadline = time.monotonic() + LOST_RUN_WAIT_S
        while left := LocalMachines.workers_of(self.paths.run_dir):
            if time.monotonic() > deadline:
                pids = ", ".join(str(p.pid) for p in left)
                raise SpecError(
                    f"{self.paths.run_dir}: the workers of the previous run (graphrun run, "
                    f"pid {pid}) are still running after {LOST_RUN_WAIT_S:.0f} s "
                    f"(pids {pids}); stop them first"
                )
            time.sleep(0.1)

    def run(self) -> JobReport:
        """Run the job to its end; raises JobFailed if it fails."""
        t0 = time.monotonic()
        self._after_a_lost_run()
        self.check_inputs()
        ads = self.job.spec.run_policy.active_deadline_seconds
        self._deadline = t0 + ads if ads else None
        self._event(Event(EventKind.START))
        while not self.state.terminal:
            phase = self.state.phase
            try:
                if phase is Phase.PARTITIONING:
                    self._partition()
                    self._event(Event(EventKind.PARTITIONED))
                elif phase is Phase.DISTRIBUTING:
                    self._check_partition()
                    self._event(Event(EventKind.DISTRIBUTED))
                elif phase is Phase.SERVING:
                    self._serve_and_train(self.opts.resume or self.state.resumes)
                    self._event(Event(EventKind.TRAINING_DONE))
                elif phase is Phase.RESTARTING:
                    self._event(Event(EventKind.RESTARTED, message="resuming from checkpoint"))
            except JobFailed as exc:
                self._say_failed(exc)
                role = exc.role if isinstance(exc.role, RoleName) else None
                self._event(Event.role_failed(role, exc.host, exc.exit_code, exc.reason))
            except _Ended as exc:
                self._event(Event(exc.kind, message=str(exc)))
            except UserError as exc:  # e.g. the partitions lack what the trainers need
                self._event(Event(EventKind.FAIL, "InvalidInput", str(exc)))
                raise
        report = JobReport(self.state, dict(self.exits), self.paths, time.monotonic() - t0)
        err = self.state.error()
        if err is not None:
            raise err
        return report

    def _say_failed(self, exc: JobFailed) -> None:
        """Name the role that failed first, on the console: the others' tracebacks (they
        lost it) stay in their logs (:mod:`graphrun.local.console`)."""
        if not isinstance(exc.role, RoleName):  # the job as a whole: no role to name
            return
        log = self.paths.run_dir / "logs"  # the launcher's steps and workers log here,
        if exc.role.kind not in ("worker", "partitioner", "generator"):
            log = log / exc.host  # a worker's roles in the folder of their machine
        log = log / f"{log_name(exc.role)}.log"
        how = f"exit code {exc.exit_code}" if exc.exit_code is not None else "no exit code"
        if exc.exit_code is not None and exc.exit_code < 0:
            with contextlib.suppress(ValueError):
                how = f"killed by {signal.Signals(-exc.exit_code).name}"
        reason = exc.reason if not exc.reason.startswith("killed by") else ""
        self._say(f"{exc.role} on {exc.host} failed first ({how})"
                  + (f": {reason}" if reason else "") + f"; its log: {log}")  # fmt: skip

    # ---- phases ---------------------------------------------------------------------

    def check_inputs(self) -> None:
        """Refuse up front what cannot work: a missing dataset, a mismatching partition,
        what the trainers will need (:mod:`graphrun.local.preflight`)."""
        if self.opts.resume:
            check_checkpoint(self.paths)
        if self.opts.warm_start:
            self._shared = shared_socket(os.environ)  # opt-in: a server jobs share
        g = self.job.spec.graph
        have_parts = (self.paths.parts / "partition.json").is_file()
        has_data = (self.paths.dataset / "graph.json").is_file()
        chunked = (self.paths.dataset / "chunks.json").is_file()
        where = f"{self.paths.job_file}: spec.graph.dataset"
        if g.dataset is not None and not (has_data or chunked):
            # even with partitions made earlier: they cannot be told current without it
            what = "does not exist" if not self.paths.dataset.exists() else (
                "is not a dataset directory (no graph.json or chunks.json)"
            )  # fmt: skip
            raise SpecError(f"{where}: {self.paths.dataset} {what}")
        if self.job.spec.partition.mode == "distributed" and not have_parts and g.dataset:
            from graphrun.graph.chunked import check_chunks, load_chunked_meta

            if not chunked:
                raise SpecError(
                    f"{where}: {self.paths.dataset} is not chunked; partition.mode "
                    "'distributed' reads one share per machine (write it with `graphrun "
                    f"import --chunks {self.job.spec.num_parts}` or `generate --chunks`)"
                )
            meta = load_chunked_meta(self.paths.dataset)
            check_chunks(meta)  # a chunk missing or from another dataset: named now
            if meta.num_chunks < self.job.spec.num_parts:
                raise SpecError(
                    f"{where}: {meta.path} has {meta.num_chunks} chunks, fewer than the "
                    f"{self.job.spec.num_parts} machines that partition it"
                )
        check_before_start(self.job, self.paths)
        check_gpus_here(self.job)
        if g.store is not None:
            check_store(self.job, self.paths)
        if self.opts.cluster is not None:
            from graphrun.local.netns import shapes_from_cluster

            if self._hosts_mode() != "netns":
                raise SpecError(f"--cluster {self.opts.cluster}: needs --hosts netns")
            shapes_from_cluster(self.opts.cluster, self.job.spec.machine_names)
        if g.store is None and have_parts and self._stale() is None:
            self._check_partition()  # stale partitions are made again instead

    def _check_partition(self) -> None:
        if self.job.spec.graph.store is not None:
            return  # a running store's partitions were checked in check_inputs
        meta = load_partition_config(self.paths.parts)
        want = self.job.spec.num_parts
        if meta["num_parts"] != want:
            raise SpecError(
                f"{self.paths.job_file}: spec.partition.output: {self.paths.parts} has "
                f"{meta['num_parts']} parts, the job needs {want}"
            )
        check_partitions(self.job, self.paths)

    def _partition(self) -> None:
        if self.job.spec.graph.store is not None:
            self._say(
                f"using the running store at {', '.join(self.job.spec.graph.store.addresses)}"
            )
            return
        aside = None
        if (self.paths.parts / "partition.json").is_file():
            stale = self._stale()
            if stale is None:
                self._say(f"using the partitions in {self.paths.parts}")
                return
            self._say(f"the partitions in {self.paths.parts} are stale ({stale}): "
                      "partitioning again")  # fmt: skip
            aside = self.paths.parts.with_name(f".{self.paths.parts.name}.stale")
            shutil.rmtree(aside, ignore_errors=True)
            self.paths.parts.rename(aside)
        try:
            self._make_partitions()
        except BaseException:
            if aside is not None and not self.paths.parts.exists():
                aside.rename(self.paths.parts)  # nothing new: the old ones, as they were
            raise
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)

    def _source(self) -> Source:
        spec = self.job.spec
        return current(
            self.paths.dataset, ["--parts", str(spec.num_parts), *spec.partition.cli_args()]
        )

    def _stale(self) -> str | None:
        """Why the partitions in the output were not made from the job's dataset and
        settings (:mod:`graphrun.local.source`), or None. A generated dataset that is
        gone is made again, so its partitions are stale."""
        if self.job.spec.graph.store is not None:
            return None
        if not self.paths.dataset.exists() and self.job.spec.graph.generator is not None:
            return "their generated dataset is gone" if read_source(self.paths.parts) else None
        return stale_reason(self.paths.parts, self._source())

    def _make_partitions(self) -> None:
        gen = self.job.spec.graph.generator
        py = self.opts.python
        distributed = self.job.spec.partition.mode == "distributed"
        have = any((self.paths.dataset / f).is_file() for f in ("graph.json", "chunks.json"))
        if gen is not None and not have:
            argv = [py, "-m", "graphrun", "generate", gen.name, str(self.paths.dataset)]
            for k, v in gen.params.items():
                argv += [f"--{_kebab(k)}", str(v)]
            if distributed:  # in pieces, one share per machine
                argv += ["--chunks", str(self.job.spec.num_parts)]
            generator = RoleName.generator()
            self._run_step(RoleCommand(generator, "local", tuple(argv), package_env()))
        source = self._source()  # before partitioning: a dataset changed meanwhile is stale
        if distributed:
            self._partition_distributed()
        else:
            argv = [
                py, "-m", "graphrun", "partition", str(self.paths.dataset), str(self.paths.parts),
                "--parts", str(self.job.spec.num_parts), *self.job.spec.partition.cli_args(),
            ]  # fmt: skip
            partitioner = RoleName.partitioner()
            self._run_step(RoleCommand(partitioner, "local", tuple(argv), package_env()))
        write_source(self.paths.parts, source)

    def _partition_distributed(self) -> None:
        """``partition.mode: distributed``: one rank per machine (role ``partitioner:<r>``
        on machine ``r``, in its network namespace with netns hosts) reads its chunks of
        the dataset and writes its part; they meet in a rendezvous file and talk over
        gloo. The staging directory becomes the partition directory only when every
        rank has exited 0; a failed rank fails the step naming it and leaves nothing."""
        spec = self.job.spec
        machines = spec.machine_names
        p = spec.partition
        env = self._role_env()
        with atomic_dir(self.paths.parts, DatasetError) as staging:
            base = [
                self.opts.python, "-m", "graphrun", "partition", str(self.paths.dataset),
                str(self.paths.parts), "--parts", str(spec.num_parts), *p.cli_args(),
                "--into", str(staging), "--rendezvous", self._file_rendezvous(),
            ]  # fmt: skip
            with self._machines("partitioning") as (wrap, _):
                prefix = wrap or (lambda m: ())
                self._run_steps([
                    RoleCommand(
                        RoleName.partitioner(r), m, (*prefix(m), *base, "--rank", str(r)), env
                    )
                    for r, m in enumerate(machines)
                ])  # fmt: skip

    def _run_step(self, cmd: RoleCommand[RoleName]) -> None:
        self._run_steps([cmd])

    def _run_steps(self, cmds: Sequence[RoleCommand[RoleName]]) -> None:
        """Run the commands together until all have exited 0; the first that fails stops
        the others and fails the step naming its role, machine and exit code."""
        with Supervisor[RoleName](self.paths.run_dir / "logs", self.sink, self.opts.grace_s) as sup:
            for cmd in cmds:
                sup.start(cmd)
            while len(sup.exits()) < len(cmds):
                if any(not ex.ok for ex in sup.wait_any(0.2)):
                    # ranks whose peer failed end too: give them a moment, then blame
                    # by the jobs' one rule (graphrun.job.blame)
                    until = time.monotonic() + 2.0
                    while len(sup.exits()) < len(cmds) and time.monotonic() < until:
                        sup.wait_any(0.2)
                    bad = [ex for ex in sup.exits().values() if not ex.ok]
                    ex = culprit(bad, lambda x: (x.exit_code, x.reason(), None))  # in exit order
                    assert ex is not None
                    raise JobFailed(ex.role, ex.machine, ex.exit_code, ex.reason())
                self._check_stop()

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise _Ended(EventKind.CANCELLED, "stopped by a signal (SIGTERM/Ctrl-C)")
        if self._deadline is not None and time.monotonic() > self._deadline:
            ads = self.job.spec.run_policy.active_deadline_seconds
            raise _Ended(EventKind.DEADLINE_EXCEEDED, f"activeDeadlineSeconds ({ads}) exceeded")

    @contextlib.contextmanager
    def _machines(self, step: str) -> Iterator[tuple[Wrap | None, dict[str, str] | None]]:
        """The job's machines for one ``step``: ``(command prefix, addresses)`` of network
        namespaces (netns hosts, shaped by ``--cluster`` / ``--bandwidth-mbit``), removed
        after it, or ``(None, None)``: processes of this host. Hosts with a memory limit
        are said after the step with the most each held (``host memory (step): m0 1,412
        of 1,536 MiB, ...``: its cgroup's peak, shared memory and page cache included)."""
        if self._hosts_mode() != "netns":
            yield None, None
            return
        from graphrun.local.netns import NetnsNetwork, shapes_from_cluster

        machines = self.job.spec.machine_names
        shapes = shapes_from_cluster(self.opts.cluster, machines) if self.opts.cluster else None
        with NetnsNetwork(machines, self.opts.bandwidth_mbit, shapes=shapes) as net:
            try:
                yield net.prefix, {m: h.address for m, h in net.hosts.items()}
            finally:
                used = net.memory_used()
                if used:  # what each host held at most, as its cgroup counts it
                    held = ", ".join(f"{m} {u}" for m, u in used.items())
                    self._say(f"host memory ({step}): {held}")

    def _serve_and_train(self, resume: bool) -> None:
        with self._machines("serving and training") as (wrap, addrs):
            self._attempt(plan_hosts(self.job, self.roles, addrs), resume, wrap)

    def _file_rendezvous(self) -> str:
        """Every machine runs on this host: the trainers meet in a fresh file of the run
        directory (mode 0700) instead of a TCP store, which listens on every interface
        unauthenticated (SECURITY.md); one file per attempt, so a restart never reads a
        dead attempt's keys."""
        d = self.paths.run_dir / "rendezvous"
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o700)
        for old in d.iterdir():
            old.unlink(missing_ok=True)
        return f"file://{d / secrets.token_hex(8)}"

    def _hosts_mode(self) -> str:
        return self.opts.hosts or self.job.spec.runtime.hosts

    def _write_key(self) -> None:
        from graphrun.rpc.auth import generate_keys

        key = self.paths.key_file
        shared = store_key_file(self.job, self.paths)
        if shared is not None:  # the running store's key: trainers and probes use it
            key.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(key, shared.read_text(), mode=0o600)
        elif not key.is_file():
            key.parent.mkdir(parents=True, exist_ok=True)
            generate_keys(key)

    def _role_env(self) -> dict[str, str]:
        env = {**package_env(), **self.opts.env}
        # gloo's connections: the namespace's private link, or loopback on one host
        # (not every interface the host name resolves to)
        env.setdefault("GLOO_SOCKET_IFNAME", "eth0" if self._hosts_mode() == "netns" else "lo")
        return env

    def launches(self, hosts: Hosts, resume: bool) -> list[MachineLaunch]:
        env = self._role_env()
        # all "machines" share this host's cores: one share per trainer and store server
        threads = default_threads(self.job, machines=self.job.spec.runtime.machines)
        args = ("--threads", str(threads), *self.opts.trainer_args)
        if self.opts.profile_dir is not None:  # the store servers write there from the start
            self.opts.profile_dir.mkdir(parents=True, exist_ok=True)
        launches = machine_launches(
            self.job, self.roles, hosts, self.paths, resume, self.opts.python,
            self.opts.profile_dir, env, self.opts.ready_timeout_s, args,
        )  # fmt: skip
        return [structs.replace(m, stall_timeout_s=self.opts.stall_timeout_s) for m in launches]

    def _attempt(self, hosts: Hosts, resume: bool, wrap: Wrap | None) -> None:
        self._write_key()
        hosts = structs.replace(hosts, rendezvous=self._file_rendezvous())
        hosts.write(self.paths.hosts_file)
        launches = self.launches(hosts, resume)
        machines = LocalMachines(
            self.paths.run_dir, self.sink, self.opts.grace_s, wrap, self.opts.python,
            elastic=self.job.spec.runtime.elastic, warm=self.opts.warm_start,
            shared=self._shared,
        )  # fmt: skip
        ready = {"serving", "training", "done"}

        def on_states(states: Mapping[str, str]) -> None:
            if self.state.phase is Phase.SERVING and all(s in ready for s in states.values()):
                self._event(Event(EventKind.SERVERS_READY))

        try:
            result = machines.run(launches, self.stop, self._deadline, on_states)
        except JobFailed as exc:
            self.exits.update(machines.last_exits)
            self.pids.update(machines.last_pids)
            if exc.role == JOB:
                kind = EventKind.CANCELLED if self.stop.is_set() else EventKind.DEADLINE_EXCEEDED
                if kind is EventKind.DEADLINE_EXCEEDED:
                    ads = self.job.spec.run_policy.active_deadline_seconds
                    raise _Ended(kind, f"activeDeadlineSeconds ({ads}) exceeded") from None
                raise _Ended(kind, exc.reason) from None
            raise
        finally:
            left = remove_shm(machines.last_pids)
            if left:
                self._say(f"removed {len(left)} shared-memory segments of stopped stores")
        self.exits.update(result.exits)
        self.pids.update(machines.last_pids)
        if self.state.phase is Phase.SERVING:  # every machine finished between two polls
            self._event(Event(EventKind.SERVERS_READY))
