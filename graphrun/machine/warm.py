"""Warm starts: trainers forked from one process that imported torch and PyG already.

A trainer spends 3.5 CPU-s of its start importing torch, ``torch._dynamo`` (PyG and
every optimizer step pull it in) and PyG. Where several machines share one host (the
local backend: every machine of a job on this host, or on one network-namespace host)
those imports are the same for all of them. The local backend starts one
:class:`WarmServer` per host before the machines; it imports what a trainer imports,
once, and forks a trainer for each request from a machine worker. A machine's trainers
then start in milliseconds, and the host pays the imports once per attempt instead of
once per trainer (the suite's jobs: half their CPU was trainers importing).

What a forked trainer gets is what ``subprocess.Popen`` gave it: its own session
(``setsid``), the worker's output pipe as stdout and stderr, ``/dev/null`` as stdin, the
request's environment, working directory and arguments (run as ``__main__`` by
``runpy``, as ``python -m`` does), signal handlers at their defaults, random generators
as a new interpreter has them (torch's at its fixed initial seed, Python's and numpy's
global ones seeded from the OS: numpy's would otherwise be the server's in every trainer)
and a fresh ``multiprocessing`` key. It is the server's child, not the worker's: it watches its
worker (:func:`~graphrun.parent.exit_with`, the worker's death kills it as
``PR_SET_PDEATHSIG`` did), the worker learns its exit code from the server (a negative
one for a signal, as ``Popen.returncode``), and the machine's processes are its worker's
descendants and the roles its status file lists
(:func:`graphrun.local.elastic.machine_processes`).

Not warm-started (``Popen`` as before): GPU trainers (the server must not touch CUDA
before it forks), other roles, a request whose import-time environment (``PYTHON*``,
``OMP_*``, ``GOMP_*``, ``*_NUM_THREADS``: OpenMP's wait policy and spin count are read
then too; the server takes a trainer's :data:`~graphrun.machine.trainer_env.TRAINER_OPENMP`
where its own environment sets no waiting, as a machine's worker gives its trainers) or
interpreter differs from the server's, a request to a server one of
whose imported files has changed since it imported it (its code would not be the
trainer's), and any worker whose server is gone or is not this user's.

A shared server (opt-in, :data:`SHARED_ENV`): a server started by hand outlives jobs, and
every job of this user on this host whose launcher sees ``GRAPHRUN_WARM_SOCKET=PATH``
forks its CPU trainers there (even a host's only one: the imports are paid already), the
way a build daemon serves many builds. That is sound because the server never runs job
code: it imports, builds PyG's templates and forks; each trainer starts from the same
state, whichever job asked before. Its directory must be this user's and closed to
others (checked by the server and the launcher), and the checks above apply to each
request. Hosts of ``--hosts netns`` start their own (a trainer would otherwise be in the
server's network namespace).

    python -m graphrun.machine.warm --socket ~/.graphrun-warm/s.sock &   # mkdir -m 700
    GRAPHRUN_WARM_SOCKET=~/.graphrun-warm/s.sock graphrun run job.yaml

Protocol: one ``AF_UNIX`` ``SOCK_SEQPACKET`` connection per trainer, in a directory only
this user can enter, peers of another uid refused. The worker sends one JSON request
(at most :data:`MAX_REQUEST` bytes) with its pipe's write end attached
(``SCM_RIGHTS``). Requests are read as :mod:`graphrun.streams` reads them
(:data:`REQUESTS`): every connection at once, each within its own
:data:`REQUEST_TIMEOUT_S`, at most :data:`MAX_PENDING` waiting; one that is not a JSON
object (garbage, brackets nested past the parser's depth, truncated past
:data:`MAX_REQUEST`) is refused with an error answer, and the server goes on. The server
answers ``{"pid": N}`` (or ``{"error": "..."}``), then
``{"exit": code, "cpu_s": ..., "peak_rss_mb": ...}`` once it has reaped the trainer
(``wait4``: what it used in all, however short it ran).

    python -m graphrun.machine.warm --socket PATH     # what the local backend starts

Why not ``multiprocessing``'s fork server, as the loader workers have
(:mod:`graphrun.distributed.forkserver`): that one is private to the process that
started it and forks that process's children; a trainer here is asked for by another
process (a machine worker, one of several on the host), must get that worker's output
pipe, its own session and environment, and hand its exit code back to it, and the
request crosses a process boundary, where ``multiprocessing`` would unpickle it. So
the warm server takes a JSON request and a file descriptor over a socket of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import select
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import psutil

from graphrun.errors import ArgumentError
from graphrun.machine.trainer_env import trainer_openmp
from graphrun.parent import exit_with
from graphrun.streams import Pending, StreamLimits, json_object

#: what the server forks, and what it imports before it listens for requests
MODULES = ("graphrun.machine.trainer",)
PRELOAD = (
    "graphrun.machine.trainer",
    "graphrun.train.loop",
    "graphrun.train.tasks",
    "graphrun.train.models",
    "graphrun.distributed.loader",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.optim",
)
MAX_REQUEST = 1 << 20  # bytes of one request (arguments and environment)
REQUEST_TIMEOUT_S = 5.0  # from a connection's accept to its request
MAX_PENDING = 64  # connections waiting for their request (the oldest closed past it)
REQUESTS = StreamLimits(MAX_REQUEST, REQUEST_TIMEOUT_S, MAX_PENDING)
REPLY_TIMEOUT_S = 120.0  # a request's answer (the server may still be importing)
READY_TIMEOUT_S = 10.0  # until the server's socket exists
SOCKET_DIR_PREFIX = "graphrun-warm-"  # the local backend's directory of a host's sockets
SHARED_ENV = "GRAPHRUN_WARM_SOCKET"  # a running server every job of this host shares


def _import_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables read while torch and PyG are imported (OpenMP's among them, e.g.
    ``OMP_WAIT_POLICY``): a trainer that would see other values than the server did is
    started on its own."""
    return {k: v for k, v in env.items() if k.startswith(("PYTHON", "OMP_", "GOMP_"))
            or k.endswith("_NUM_THREADS")}  # fmt: skip


def private_dir(path: Path) -> str | None:
    """What is wrong with ``path``'s directory as a home for a warm server's socket (this
    user's, closed to everyone else), or None."""
    try:
        st = path.parent.stat()
    except OSError as exc:
        return f"{path.parent} cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path.parent} is not a directory"
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        return f"{path.parent} must be this user's and closed to others (chmod 700)"
    return None


def shared_socket(env: Mapping[str, str]) -> Path | None:
    """The shared server that ``env`` names (:data:`SHARED_ENV`), checked; None if none."""
    value = env.get(SHARED_ENV)
    if not value:
        return None
    path = Path(value).expanduser()
    wrong = private_dir(path) if path.is_absolute() else "is not an absolute path"
    if wrong is None and not path.is_socket():
        wrong = "names no running warm server (no socket there)"
    if wrong is not None:
        raise ArgumentError(f"${SHARED_ENV}={value}: {wrong}")
    return path


def _imported_files() -> dict[str, int]:
    """Each imported module's file and its modification time."""
    out = {}
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if isinstance(name, str):
            with contextlib.suppress(OSError):
                out[name] = os.stat(name).st_mtime_ns
    return out


def _changed(files: Mapping[str, int]) -> str | None:
    for name, mtime in files.items():
        try:
            if os.stat(name).st_mtime_ns != mtime:
                return name
        except OSError:
            return name
    return None


# ---- the server (one per host) ------------------------------------------------------


class WarmServer:
    """Forks trainers for the machine workers that connect to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.stopping = False
        # told to stop while it imports (a launcher killed with -9 sends SIGTERM, its death
        # signal): it still removes its socket and directory. Set before the socket
        # exists: a launcher that sees the socket may stop the server at once
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        self.env = _import_env(os.environ)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.listener.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.listener.listen(64)
        self.children: dict[int, socket.socket | None] = {}  # pid -> its worker's connection
        self.python = os.path.realpath(sys.executable)
        self.files: dict[str, int] = {}  # what it imported (preload): a trainer runs that code

    def preload(self) -> None:
        from graphrun.train import activation
        from graphrun.train.aggregate import warm_up

        for name in PRELOAD:
            if self.stopping:
                return
            importlib.import_module(name)
        _build_pyg_templates()
        warm_up()  # the mean's backward kernel (numba): loaded once, not once a trainer
        activation.warm_up()  # and a bf16 hidden layer's ReLU and dropout
        self.files = _imported_files()

    def serve(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # SIGTERM and SIGINT: __init__
        sel = selectors.DefaultSelector()
        self.listener.setblocking(False)
        sel.register(self.listener, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        pending = Pending(sel, REQUESTS)
        try:
            while not self.stopping:
                for key, _ in sel.select(timeout=0.2):
                    if key.fileobj is self.listener:
                        for conn in pending.accept(self.listener):
                            self._admit(conn, pending)
                    elif key.data is pending:
                        ready = key.fileobj
                        assert isinstance(ready, socket.socket)
                        self._answer(ready, pending, [sel, wake_r, wake_w])
                    else:
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake_r, 512)
                pending.expire()
                self._reap()
        finally:
            pending.close()
            self.close()

    def close(self) -> None:
        """Remove the socket, and its directory if the local backend made it for this
        server (``graphrun-warm-*``) and nothing else is in it."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.listener.close()
        if self.path.parent.name.startswith(SOCKET_DIR_PREFIX):
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()

    def _stop(self, *_: object) -> None:
        self.stopping = True

    @staticmethod
    def _admit(conn: socket.socket, pending: Pending) -> None:
        """Refuse a peer of another uid at once."""
        if _peer_uid(conn) != os.getuid():
            pending.drop(conn)

    def _answer(self, conn: socket.socket, pending: Pending, keep_out: list[Any]) -> None:
        fds: list[int] = []
        try:
            try:
                data, fds, flags, _ = socket.recv_fds(conn, MAX_REQUEST, 1)
            except (BlockingIOError, InterruptedError):
                return  # not there yet after all
            pending.take(conn)
            conn.settimeout(5.0)
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise ValueError(f"a request of more than {MAX_REQUEST} bytes or one pipe")
            req = json_object(data)
            if req.get("module") not in MODULES or len(fds) != 1:
                raise ValueError("not a trainer request")
            if _import_env(req["env"]) != self.env:
                raise ValueError("its environment differs from the warm server's")
            if req.get("python") != self.python:
                raise ValueError("its interpreter is not the warm server's")
            changed = _changed(self.files)
            if changed is not None:
                raise ValueError(f"{changed} changed since the warm server imported it")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # refused (a request that is not a JSON object of strings, too): it goes on
            if conn in pending:
                pending.take(conn)
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"error": str(exc)[:200]}).encode())
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        # answered once the trainer has its session, streams and directory (as Popen
        # returns after the exec): a signal to its group right away reaches it
        settled_r, settled_w = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:  # no memory, too many processes: the worker starts it cold
            for fd in (settled_r, settled_w, fds[0]):
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"error": f"fork: {exc}"[:200]}).encode())
            conn.close()
            return
        if pid == 0:  # the trainer
            os.close(settled_r)
            close = [self.listener, conn, *self.children.values()]
            _become_trainer(req, fds[0], settled_w, close, keep_out)
        os.close(settled_w)
        os.read(settled_r, 1)  # EOF: the trainer closed its end
        os.close(settled_r)
        os.close(fds[0])
        self.children[pid] = conn
        try:
            conn.send(json.dumps({"pid": pid}).encode())
        except OSError:  # the worker is gone: its trainer sees that itself
            self._forget(pid)

    def _forget(self, pid: int) -> None:
        conn = self.children.get(pid)
        if conn is not None:
            conn.close()
            self.children[pid] = None

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                ended = {
                    "exit": os.waitstatus_to_exitcode(status),
                    "cpu_s": round(ru.ru_utime + ru.ru_stime, 3),
                    "peak_rss_mb": round(ru.ru_maxrss / 1024, 1),  # kB
                }
                with contextlib.suppress(OSError):
                    conn.send(json.dumps(ended).encode())
                conn.close()


def _peer_uid(conn: socket.socket) -> int:
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return -1
    return int(struct.unpack("3i", creds)[1])


def _build_pyg_templates() -> None:
    """PyG writes each message-passing class's ``propagate`` from a template into a new
    file in the temporary directory (and imports it) the first time it is built in a
    process: built here, once, the trainers inherit them, and the files are removed."""
    from torch_geometric.nn import GATConv, GCNConv, SAGEConv

    from graphrun.machine.templates import drop_pyg_templates

    SAGEConv(4, 4)
    GATConv(4, 4)
    GCNConv(4, 4)
    drop_pyg_templates()


def _become_trainer(
    req: dict[str, Any], out: int, settled: int, close: Sequence[Any], keep_out: list[Any]
) -> None:
    code = 1
    try:
        sel, wake_r, wake_w = keep_out
        signal.set_wakeup_fd(-1)
        for fd in (wake_r, wake_w):
            os.close(fd)
        sel.close()
        for s in close:
            if s is not None:
                s.close()
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        if req.get("cwd"):
            os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        os.close(settled)
        exit_with(int(req["watch"]))  # the worker's death ends it, as PDEATHSIG did
        _fresh_state()
        sys.argv = [req["module"], *req["argv"]]
        sys.path[0] = os.getcwd()  # what ``python -m`` puts first
        import runpy

        # as ``python -m`` runs it: as ``__main__`` only (preloaded, it would be both)
        sys.modules.pop(req["module"], None)
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _fresh_state() -> None:
    """What a new interpreter would not share with its siblings."""
    import multiprocessing
    import random

    import numpy as np
    import torch

    random.seed()
    np.random.seed()  # a new interpreter's are seeded from the OS
    # torch's default generator starts at the same seed in every new interpreter: back to
    # it (building PyG's layers here drew from it)
    torch.default_generator.manual_seed(torch.default_generator.initial_seed())
    multiprocessing.current_process().authkey = os.urandom(32)


# ---- the client (a machine worker) --------------------------------------------------


class WarmProcess:
    """A warm-started trainer, seen as much like ``subprocess.Popen`` as the
    :class:`~graphrun.machine.process.Supervisor` needs (``pid``, ``stdout``,
    ``poll``, ``wait``, ``returncode``)."""

    def __init__(self, conn: socket.socket, pid: int, stdout: IO[bytes]) -> None:
        self.conn, self.pid, self.stdout = conn, pid, stdout
        self.returncode: int | None = None
        self.usage: tuple[float, float] | None = None  # CPU seconds, peak RSS MiB
        self._orphaned = False  # the server is gone: the pid is watched instead

    def poll(self) -> int | None:
        if self.returncode is None:
            self._check(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if left < 0:
                raise subprocess.TimeoutExpired(f"trainer {self.pid}", timeout or 0.0)
            self._check(left)
        return self.returncode

    def _check(self, timeout: float) -> None:
        if self._orphaned:
            if not _alive(self.pid):
                self.returncode = -signal.SIGKILL  # its code went with the server
            else:
                time.sleep(timeout)
            return
        ready, _, _ = select.select([self.conn], [], [], timeout)
        if not ready:
            return
        try:
            data = self.conn.recv(4096)
        except OSError:
            data = b""
        if not data:
            self._orphaned = True
            self.conn.close()
            return
        ended = json.loads(data)
        self.returncode = int(ended["exit"])
        self.usage = (float(ended["cpu_s"]), float(ended["peak_rss_mb"]))
        self.conn.close()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class WarmStarter:
    """A machine worker's side: forks trainers through the server at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @staticmethod
    def takes(argv: Sequence[str]) -> str | None:
        """The module a warm start of ``argv`` would run, or None (not a CPU trainer of
        this interpreter)."""
        if len(argv) < 3 or argv[1] != "-m" or argv[2] not in MODULES or "--gpu" in argv:
            return None
        if os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
            return None
        return argv[2]

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None
    ) -> WarmProcess | None:
        """Fork ``argv`` (a :meth:`takes` command) in the server; None where the server
        cannot (then ``Popen`` it)."""
        module = self.takes(argv)
        if module is None:
            return None
        req = {
            "module": module,
            "argv": list(argv[3:]),
            "env": dict(env),
            "cwd": cwd,
            "watch": os.getpid(),
            "python": os.path.realpath(sys.executable),
        }
        data = json.dumps(req).encode()
        if len(data) > MAX_REQUEST:
            return None
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read, write = os.pipe()
        try:
            conn.connect(str(self.path))
            if _peer_uid(conn) != os.getuid():  # it would see the request's environment
                raise OSError(f"{self.path}: a server of another user")
            socket.send_fds(conn, [data], [write])
            os.close(write)
            write = -1
            conn.settimeout(REPLY_TIMEOUT_S)
            reply = json.loads(conn.recv(4096) or b"{}")
        except (OSError, ValueError):
            reply = {}
        finally:
            if write >= 0:
                os.close(write)
        if "pid" not in reply:
            conn.close()
            os.close(read)
            return None
        conn.settimeout(None)
        return WarmProcess(conn, int(reply["pid"]), os.fdopen(read, "rb"))


# ---- the server's command line ------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="graphrun-warm", description=__doc__)
    p.add_argument("--socket", type=Path, required=True)
    args = p.parse_args(argv)
    wrong = private_dir(args.socket)
    if wrong is not None:
        raise ArgumentError(f"--socket: {wrong}")
    # torch imported as the trainers it forks import it: with their OpenMP waiting (a job
    # of this host that sets its own is started on its own: its import environment differs)
    os.environ.update(trainer_openmp(os.environ))
    server = WarmServer(args.socket)  # listens at once: requests wait for the imports
    server.preload()
    server.serve()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except ArgumentError as exc:
        print(f"graphrun-warm: error: {exc}", file=sys.stderr)
        code = 2
    sys.stdout.flush()
    os._exit(code)  # without Python's finalisation of torch and PyG (1.5 s)
