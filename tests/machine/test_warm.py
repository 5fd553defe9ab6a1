"""Warm starts (graphrun.machine.warm) with a real warm server and real trainer processes.

A trainer whose ``--job`` is a FIFO nobody writes blocks in ``open``: a trainer that
runs until it is signalled, without a job.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from graphrun.machine.process import RoleCommand, Supervisor
from graphrun.machine.trainer_env import sets_waiting, trainer_openmp
from graphrun.machine.warm import SOCKET_DIR_PREFIX, WarmStarter
from graphrun.testing.procs import child_env

pytestmark = pytest.mark.integration

TRAINER = (sys.executable, "-m", "graphrun.machine.trainer")


def trainer_env() -> dict[str, str]:
    """A CPU trainer's environment as a machine's worker gives it (the warm server's
    imports had the same OpenMP waiting: graphrun.machine.trainer_env)."""
    env = child_env()
    return {**env, **trainer_openmp({**os.environ, **env})}


def _until(cond, timeout: float = 30.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@contextlib.contextmanager
def warm_server() -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A warm server, listening: its socket and process (stopped with SIGTERM after)."""
    with tempfile.TemporaryDirectory(prefix="warm-test-") as d:
        sock = Path(d) / "0.sock"
        argv = [sys.executable, "-m", "graphrun.machine.warm", "--socket", str(sock)]
        proc = subprocess.Popen(argv, env={**child_env(), "PYTHONUNBUFFERED": "1"})
        try:
            _until(sock.exists, what="the warm server's socket")
            yield sock, proc
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Path, int]]:
    """One warm server for the module's tests (it imports once): its socket and pid."""
    with warm_server() as (sock, proc):
        yield sock, proc.pid
        proc.terminate()
        assert proc.wait(timeout=30) == 0  # a SIGTERM ends it cleanly
        assert not sock.exists()  # its socket with it


def _blocked_trainer(tmp_path: Path) -> tuple[str, ...]:
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    return (*TRAINER, "--job", str(fifo), "--rank", "0", "--hosts-file", "h", "--keys", "k")


def _trainer(argv: tuple[str, ...]) -> RoleCommand:
    return RoleCommand("trainer:0", "m0", argv, trainer_env())


def _run(sup: Supervisor, argv: tuple[str, ...]):  # type: ignore[no-untyped-def]
    sup.start(_trainer(argv))
    (ended,) = sup.wait_any(timeout=120)
    return ended


def test_a_warm_trainer_says_and_exits_what_a_new_interpreter_does(server):
    sock, _ = server
    for argv in [(*TRAINER, "--help"), (*TRAINER, "--rank", "x")]:
        with Supervisor(sink=io.StringIO(), warm=WarmStarter(sock)) as warm:
            got = _run(warm, argv)
            assert warm.warm_started() == {"trainer:0"}
        with Supervisor(sink=io.StringIO()) as cold:
            want = _run(cold, argv)
            assert cold.warm_started() == set()
        assert got.exit_code == want.exit_code and got.tail == want.tail
    assert want.exit_code == 2 and "argument --rank: invalid int value: 'x'" in want.tail[-1]


def test_a_warm_trainer_runs_in_its_own_session_and_a_signal_is_its_exit_code(server, tmp_path):
    sock, server_pid = server
    sup = Supervisor(sink=io.StringIO(), grace_s=5.0, warm=WarmStarter(sock))
    with sup:
        sup.start(_trainer(_blocked_trainer(tmp_path)))
        pid = sup.pids()["trainer:0"]
        p = psutil.Process(pid)
        assert p.ppid() == server_pid and os.getpgid(pid) == pid and os.getsid(pid) == pid
        assert p.cwd() == os.getcwd()
        sup.stop(first=signal.SIGHUP)  # which it does not handle (SIGTERM it does)
    assert sup.exits()["trainer:0"].exit_code == -signal.SIGHUP  # as Popen's returncode


def test_a_warm_trainer_ends_with_the_worker_that_started_it(server, tmp_path):
    sock, _ = server
    worker = (
        "import sys, time\n"
        "from graphrun.machine.warm import SOCKET_DIR_PREFIX, WarmStarter\n"
        f"proc = WarmStarter({str(sock)!r}).start({_blocked_trainer(tmp_path)!r}, "
        "dict(__import__('os').environ), None)\n"
        "print(proc.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    client = subprocess.Popen(
        [sys.executable, "-c", worker], stdout=subprocess.PIPE, text=True, env=trainer_env()
    )
    try:
        assert client.stdout is not None
        trainer = psutil.Process(int(client.stdout.readline()))
        client.kill()  # SIGKILL: the worker cannot stop it
        client.wait(timeout=10)
        trainer.wait(timeout=10)  # raises if it is still running
    finally:
        client.kill()


def test_a_server_told_to_stop_as_soon_as_its_socket_exists_removes_it():
    """A launcher that sees the socket may stop the server at once: the SIGTERM came
    before the handler was set (the suite's run with four workers: exit -15, the socket
    and its directory left)."""
    d = Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX))
    sock = d / "0.sock"
    code = (
        "import os, signal, socket, sys\n"
        "from graphrun.machine import warm\n"
        "bind = socket.socket.bind\n"
        "def bound(self, addr):\n"
        "    bind(self, addr)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)  # the socket exists: stopped now\n"
        "socket.socket.bind = bound\n"
        f"sys.exit(warm.main(['--socket', {str(sock)!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(), timeout=60)
    assert proc.returncode == 0
    assert not d.exists()


def test_a_server_told_to_stop_as_it_imports_removes_its_socket_and_directory():
    """The local backend's directory of a host's socket (``graphrun-warm-*``) went with
    nothing when its launcher was killed with -9 (the server died of SIGKILL, its death
    signal then): 26 were left in /tmp after six suite runs."""
    d = Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX))
    sock = d / "0.sock"
    argv = [sys.executable, "-m", "graphrun.machine.warm", "--socket", str(sock)]
    proc = subprocess.Popen(argv, env={**child_env(), "PYTHONUNBUFFERED": "1"})
    try:
        _until(sock.exists, what="the warm server's socket")
        proc.terminate()  # long before torch and PyG are imported
        assert proc.wait(timeout=30) == 0
        assert not d.exists()
    finally:
        proc.kill()
        if d.exists():
            shutil.rmtree(d)


def test_a_trainer_whose_server_is_gone_is_still_seen_to_end(tmp_path):
    with warm_server() as (sock, server):
        sup = Supervisor(sink=io.StringIO(), grace_s=5.0, warm=WarmStarter(sock))
        sup.start(_trainer(_blocked_trainer(tmp_path)))
        server.kill()
        server.wait(timeout=10)
        assert sup.poll() == [] and sup.running() == ["trainer:0"]  # it runs on
        sup.stop(first=signal.SIGKILL)
        assert sup.exits()["trainer:0"].exit_code == -signal.SIGKILL


@pytest.mark.parametrize(
    "request_", [b"[1, 2]", b'{"module": "graphrun.machine.trainer", "env": []}']
)
def test_a_request_that_is_not_a_json_object_is_refused_and_the_server_goes_on(server, request_):
    """A JSON array (or an environment that is one) ended the server with an
    AttributeError: every later trainer of the host started cold."""
    import socket

    sock, _ = server
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read, write = os.pipe()
    try:
        conn.connect(str(sock))
        socket.send_fds(conn, [request_], [write])
        conn.settimeout(120)
        assert "error" in json.loads(conn.recv(4096))
    finally:
        conn.close()
        os.close(read)
        os.close(write)
    with Supervisor(sink=io.StringIO(), warm=WarmStarter(sock)) as sup:
        assert _run(sup, (*TRAINER, "--help")).exit_code == 0
        assert sup.warm_started() == {"trainer:0"}


def test_what_the_server_cannot_fork_is_left_to_popen(server, tmp_path):
    sock, _ = server
    starter = WarmStarter(sock)
    other_threads = {**trainer_env(), "OMP_NUM_THREADS": "7"}  # read when torch is imported
    assert starter.start((*TRAINER, "--help"), other_threads, None) is None
    policy = "ACTIVE" if os.environ.get("OMP_WAIT_POLICY") == "PASSIVE" else "PASSIVE"
    waiting = {**trainer_env(), "OMP_WAIT_POLICY": policy}  # read when torch is imported too
    assert starter.start((*TRAINER, "--help"), waiting, None) is None
    if not sets_waiting(os.environ):  # a trainer without the server's spin count
        assert starter.start((*TRAINER, "--help"), child_env(), None) is None
    assert starter.start((*TRAINER, "--help", "--gpu", "0"), trainer_env(), None) is None
    assert starter.start((sys.executable, "-m", "graphrun", "serve"), trainer_env(), None) is None
    assert (
        WarmStarter(tmp_path / "none.sock").start((*TRAINER, "--help"), trainer_env(), None) is None
    )
    with Supervisor(sink=io.StringIO(), warm=WarmStarter(tmp_path / "none.sock")) as sup:
        assert _run(sup, (*TRAINER, "--help")).exit_code == 0  # a new interpreter
        assert sup.warm_started() == set()


def _ask(sock: Path, request: dict) -> dict:  # type: ignore[type-arg]
    """The server's first answer to ``request`` (a trainer's output goes to a pipe)."""
    import socket

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read, write = os.pipe()
    try:
        conn.connect(str(sock))
        socket.send_fds(conn, [json.dumps(request).encode()], [write])
        conn.settimeout(120)
        return dict(json.loads(conn.recv(4096)))
    finally:
        conn.close()
        os.close(read)
        os.close(write)


def test_a_server_leaves_to_popen_another_interpreter_and_code_changed_since_its_imports(
    tmp_path,
):
    """A shared server (GRAPHRUN_WARM_SOCKET) outlives jobs: its code, imported once,
    must still be the code a new interpreter of the request's would run. And it loaded
    the mean's kernels (the backward's scatter, the offsets, the forward's weights) before
    it forked (each trainer paid about 0.7 CPU-s for numba and the kernel at its first
    backward): the server runs no trainer code, so the kernels it holds when it ends are
    the ones its start loaded."""
    (tmp_path / "extra.py").write_text("")
    server = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import extra\n"
        "from graphrun.machine.warm import main\n"
        "main(sys.argv[1:])\n"
        "from graphrun.train import aggregate as A\n"
        "print(len(A._COMPILED), [len(k.signatures) for k in A._COMPILED[0]] if A._COMPILED "
        "else 0)\n"
    )
    with tempfile.TemporaryDirectory(prefix="warm-test-") as d:
        sock = Path(d) / "0.sock"
        proc = subprocess.Popen([sys.executable, "-c", server, "--socket", str(sock)],
                                env=child_env(), stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            _until(sock.exists, what="the warm server's socket")
            trainer = {"module": "graphrun.machine.trainer", "argv": ["--help"],
                       "env": trainer_env(), "cwd": None, "watch": os.getpid()}  # fmt: skip
            other = _ask(sock, {**trainer, "python": "/usr/bin/python3"})
            assert other == {"error": "its interpreter is not the warm server's"}
            with Supervisor(sink=io.StringIO(), warm=WarmStarter(sock)) as sup:
                assert _run(sup, (*TRAINER, "--help")).exit_code == 0
                assert sup.warm_started() == {"trainer:0"}
            later = time.time() + 10
            os.utime(tmp_path / "extra.py", (later, later))
            changed = _ask(sock, {**trainer, "python": os.path.realpath(sys.executable)})
            assert changed == {
                "error": f"{tmp_path / 'extra.py'} changed since the warm server imported it"
            }
            with Supervisor(sink=io.StringIO(), warm=WarmStarter(sock)) as sup:
                assert _run(sup, (*TRAINER, "--help")).exit_code == 0  # a new interpreter
                assert sup.warm_started() == set()
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.strip() == "1 [1, 1, 1]"  # the mean's kernels, loaded
