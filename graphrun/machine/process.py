"""Role processes: start, watch and stop the processes of a job.

A :class:`Supervisor` owns a set of role processes (``store:0``, ``trainer:1``, ...).
Every role is a real subprocess in its own session and process group, so a signal
to the group reaches whatever the role started. Its stdout and stderr are merged
and pumped line by line, prefixed with ``[role@machine]``, to one sink (the
launcher's terminal) and to ``LOG_DIR/<role>.log``; the last lines are kept so a
failure can quote them.

Stopping is always the same: SIGTERM to every group, wait up to ``grace_s``,
then SIGKILL to whatever is left — including descendants that left the group
(found with psutil before the first signal). On Linux every role is also asked to
die with its parent (``PR_SET_PDEATHSIG``, :mod:`graphrun.parent`), so a launcher
killed with SIGKILL leaves no orphans behind: SIGKILL by default, or the supervisor's
``death_signal`` (SIGTERM for processes that clean up on the way out, such as a
machine's worker, which then stops its roles). A sink that breaks (the launcher's
terminal gone) does not stop the logs.

The supervisor knows nothing about jobs or phases: it runs commands, named by what its
user names them by (``N``): a :class:`~graphrun.names.RoleName` for a worker's roles,
the launcher's workers and its steps; a ``str`` for what is no role of a job (a host's
warm fork server, :mod:`graphrun.machine.warm`).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Generic, NoReturn, Protocol, TypeVar

import psutil

from graphrun.errors import ArgumentError
from graphrun.machine.warm import WarmProcess, WarmStarter
from graphrun.parent import set_death_signal

TAIL_LINES = 20

N = TypeVar("N", bound=Hashable)  # what a supervisor names its processes by


class Sink(Protocol):
    """Where role output goes: a text stream, or a filter such as
    :class:`graphrun.local.console.Console`."""

    def write(self, text: str, /) -> int: ...
    def flush(self) -> None: ...


@dataclass(frozen=True)
class RoleCommand(Generic[N]):
    """One role to run: its name, the machine it belongs to, and the command line."""

    role: N
    machine: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # added to the inherited environment
    cwd: str | None = None

    def __post_init__(self) -> None:
        if not self.role or not self.argv:
            raise ArgumentError(f"RoleCommand '{self.role}': role and argv must not be empty")


@dataclass(frozen=True)
class RoleExit(Generic[N]):
    """How a role ended. ``exit_code`` is negative for a signal (as in subprocess)."""

    role: N
    machine: str
    exit_code: int
    tail: tuple[str, ...] = ()
    # CPU seconds and peak RSS (MiB) over its whole life, where known: a warm-started
    # role's, from its server's wait4 (a short-lived one may end between two samples)
    usage: tuple[float, float] | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def reason(self) -> str:
        """The last meaningful output line of the role (usually the exception)."""
        if self.exit_code < 0:
            try:
                name = signal.Signals(-self.exit_code).name
            except ValueError:
                name = f"signal {-self.exit_code}"
            last = _last_meaningful(self.tail)
            return f"killed by {name}" + (f"; last output: {last}" if last else "")
        return _last_meaningful(self.tail)


def _last_meaningful(lines: Sequence[str]) -> str:
    """The line that says why a role ended: the exception line of its last traceback (the
    first unindented line after the frames; an exception's message may go on over more
    lines, e.g. torch.distributed's advice about TORCH_DISTRIBUTED_DEBUG, which is not
    the cause), else its last non-empty line."""
    tb = max((i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent")),
             default=None)  # fmt: skip
    if tb is not None:
        for line in lines[tb + 1 :]:
            if line.strip() and not line[:1].isspace():
                return line.strip()[:300]
    for line in reversed(lines):
        s = line.strip()
        if s and not s.startswith(("^", "~")):
            return s[:300]
    return ""


def log_name(role: object) -> str:
    """File-name form of a role: ``trainer:1`` -> ``trainer-1``."""
    return str(role).replace(":", "-").replace("/", "-")


def _die_with_parent(sig: int) -> None:  # runs in the child between fork and exec
    set_death_signal(sig)


class _Pump(threading.Thread):
    """Copies a role's output lines to the sink and its log file, keeping the tail."""

    def __init__(
        self,
        cmd: RoleCommand[N],
        stream: IO[bytes],
        sink: Sink | None,
        log: IO[str] | None,
        lock: threading.Lock,
        prefix: bool = True,
    ) -> None:
        super().__init__(name=f"pump-{cmd.role}", daemon=True)
        self.prefix = f"[{cmd.role}@{cmd.machine}] " if prefix else ""
        self.stream, self.sink, self.log, self.lock = stream, sink, log, lock
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)

    def run(self) -> None:
        for raw in iter(self.stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail.append(line)
            if self.log is not None:
                self.log.write(line + "\n")
                self.log.flush()
            if self.sink is not None:
                try:
                    with self.lock:
                        self.sink.write(self.prefix + line + "\n")
                        self.sink.flush()
                except (OSError, ValueError):  # the terminal is gone: keep the log going
                    self.sink = None
        self.stream.close()
        if self.log is not None:
            self.log.close()


@dataclass
class _Running(Generic[N]):
    cmd: RoleCommand[N]
    proc: subprocess.Popen[bytes] | WarmProcess
    pump: _Pump
    exit: RoleExit[N] | None = None


class Supervisor(Generic[N]):
    """Runs role processes; use as a context manager so every role is stopped on exit."""

    def __init__(
        self,
        log_dir: Path | None = None,
        sink: Sink | None = None,
        grace_s: float = 5.0,
        prefix: bool = True,
        death_signal: int = signal.SIGKILL,
        warm: WarmStarter | None = None,
    ) -> None:
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.warm = warm  # CPU trainers fork from this host's warm server (graphrun.machine.warm)
        self.death_signal = death_signal  # what a role gets when this process dies
        self.sink = sink if sink is not None else sys.stdout
        self.grace_s = grace_s
        self.prefix = prefix  # False: the roles prefix their own lines (workers)
        self._roles: dict[N, _Running[N]] = {}
        self._lock = threading.Lock()
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)

    # ---- starting -------------------------------------------------------------------

    def start(self, cmd: RoleCommand[N]) -> int:
        """Start one role; returns its pid."""
        if cmd.role in self._roles and self._roles[cmd.role].exit is None:
            raise ArgumentError(f"role '{cmd.role}' is already running")
        env = {**os.environ, **cmd.env, "PYTHONUNBUFFERED": "1"}
        warm = self.warm.start(cmd.argv, env, cmd.cwd) if self.warm is not None else None
        try:
            proc = warm or subprocess.Popen(
                list(cmd.argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cmd.cwd,
                start_new_session=True,
                preexec_fn=functools.partial(_die_with_parent, self.death_signal),
            )
        except OSError as exc:
            raise ArgumentError(f"role {cmd.role}: cannot start {cmd.argv[0]!r}: {exc}") from exc
        log = None
        if self.log_dir is not None:
            log = (self.log_dir / f"{log_name(cmd.role)}.log").open("a", encoding="utf-8")
        assert proc.stdout is not None  # PIPE was requested
        pump = _Pump(cmd, proc.stdout, self.sink, log, self._lock, self.prefix)
        pump.start()
        self._roles[cmd.role] = _Running(cmd, proc, pump)
        return proc.pid

    # ---- watching -------------------------------------------------------------------

    def poll(self) -> list[RoleExit[N]]:
        """Roles that ended since the last call (in start order)."""
        ended = []
        for r in self._roles.values():
            if r.exit is None and r.proc.poll() is not None:
                r.exit = self._exit_of(r)
                ended.append(r.exit)
        return ended

    def _exit_of(self, r: _Running[N]) -> RoleExit[N]:
        r.pump.join(timeout=2.0)  # the pipe closes when the process (group) is gone
        code = r.proc.returncode
        assert code is not None  # it was polled
        usage = r.proc.usage if isinstance(r.proc, WarmProcess) else None
        return RoleExit(r.cmd.role, r.cmd.machine, int(code), tuple(r.pump.tail), usage)

    def wait_any(self, timeout: float, interval: float = 0.05) -> list[RoleExit[N]]:
        """Wait until at least one role ends or ``timeout`` passes; returns the ended roles."""
        deadline = time.monotonic() + timeout
        while True:
            ended = self.poll()
            if ended or time.monotonic() >= deadline or not self.running():
                return ended
            time.sleep(interval)

    def running(self) -> list[N]:
        return [name for name, r in self._roles.items() if r.exit is None]

    def exits(self) -> dict[N, RoleExit[N]]:
        return {name: r.exit for name, r in self._roles.items() if r.exit is not None}

    def pids(self) -> dict[N, int]:
        return {name: r.proc.pid for name, r in self._roles.items()}

    def warm_started(self) -> set[N]:
        """The roles forked by the warm server (:mod:`graphrun.machine.warm`)."""
        return {name for name, r in self._roles.items() if isinstance(r.proc, WarmProcess)}

    # ---- stopping -------------------------------------------------------------------

    def stop(
        self,
        roles: Sequence[N] | None = None,
        grace_s: float | None = None,
        first: signal.Signals = signal.SIGTERM,
    ) -> None:
        """SIGTERM the roles (default: all running), SIGKILL them after the grace period
        (``first=SIGKILL``: at once, with nothing to react to)."""
        grace = self.grace_s if grace_s is None else grace_s
        targets = [self._roles[n] for n in (roles or self.running()) if n in self._roles]
        targets = [r for r in targets if r.exit is None]
        if not targets:
            return
        own = {r.proc.pid for r in targets}
        others = [p for p in _with_descendants(list(own)) if p.pid not in own]
        for r in targets:
            _signal_group(r.proc.pid, first)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if all(r.proc.poll() is not None for r in targets) and not still_running(others):
                break
            time.sleep(0.05)
        for r in targets:
            if r.proc.poll() is None:
                _signal_group(r.proc.pid, signal.SIGKILL)
        for p in still_running(others):
            with contextlib.suppress(psutil.Error):
                p.kill()
        # not our children: polled, not reaped
        psutil.wait_procs(still_running(others), timeout=2.0)
        for r in targets:
            r.proc.wait(timeout=5.0)
        self.poll()

    def close(self) -> None:
        self.stop()
        for r in self._roles.values():
            r.pump.join(timeout=2.0)

    def __enter__(self) -> Supervisor[N]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def still_running(procs: Sequence[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` that still run (not gone, not a zombie)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def _with_descendants(pids: Sequence[int]) -> list[psutil.Process]:
    out: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out[pid] = p
            for c in p.children(recursive=True):
                out[c.pid] = c
        except psutil.Error:
            continue
    return list(out.values())


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` without Python's finalisation, after flushing the
    standard streams and the log handlers. With torch and PyG loaded, finalisation takes
    1.5 s (0.85 s with torch alone) that a finished role has no use for — every job paid it
    once per trainer and store server before it could end. For roles whose files are all
    closed and whose children are gone when their ``main`` returns."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
