"""A warm server shared by jobs (``GRAPHRUN_WARM_SOCKET``, graphrun.machine.warm): the
suite's conftest starts one per xdist worker and names it in the environment."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import psutil
import pytest

from graphrun.machine.warm import SHARED_ENV
from graphrun.names import RoleName
from graphrun.record import read_status
from graphrun.testing.jobs import local_job, nothing_left, small_job
from graphrun.testing.procs import child_env

pytestmark = pytest.mark.integration


def _cmdline(p: psutil.Process) -> list[str]:
    """Its command line; none for a child gone or a zombie (an earlier test's child this
    worker has not reaped yet: ``cmdline`` raised ZombieProcess and failed the test)."""
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _server() -> psutil.Process:
    sock = os.environ[SHARED_ENV]
    [server] = [p for p in psutil.Process().children() if sock in _cmdline(p)]
    return server


@pytest.mark.slow
def test_two_jobs_fork_even_a_lone_trainer_from_the_shared_server_which_outlives_them(tmp_path):
    server = _server()
    path = small_job(tmp_path, nodes=400, machines=1)
    for run in ("a", "b"):
        job, _ = local_job(path, run_dir=tmp_path / run)
        assert set(job.run().exits.values()) == {0}
        roles = read_status(tmp_path / run / "status" / "m0.json").roles
        assert roles[RoleName.trainer(0)].warm  # one trainer: no server of its own pays
        assert not [p for p in (tmp_path / run / "logs").rglob("*") if "warm" in p.name]
        nothing_left(job)
        assert server.is_running() and server.status() != psutil.STATUS_ZOMBIE


@pytest.mark.parametrize(
    "value, said",
    [
        ("warm.sock", "is not an absolute path"),
        ("{tmp}/open/s.sock", "{tmp}/open must be this user's and closed to others (chmod 700)"),
        ("{tmp}/closed/s.sock", "names no running warm server (no socket there)"),
        ("{tmp}/none/s.sock", "{tmp}/none cannot be read (No such file or directory)"),
    ],
)
def test_a_wrong_shared_warm_socket_is_one_line_before_anything_starts(tmp_path, value, said):
    (tmp_path / "open").mkdir(mode=0o755)
    os.chmod(tmp_path / "open", 0o755)  # whatever the umask
    (tmp_path / "open" / "s.sock").touch()
    (tmp_path / "closed").mkdir(mode=0o700)
    path = small_job(tmp_path / "job", nodes=400, machines=1)
    value, said = value.format(tmp=tmp_path), said.format(tmp=tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "graphrun", "run", str(path), "--run-dir", str(tmp_path / "run")],
        env={**child_env(), SHARED_ENV: value}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [f"graphrun: error: ${SHARED_ENV}={value}: {said}"]
    assert not (tmp_path / "run").exists()


def test_the_server_refuses_a_socket_directory_others_can_enter(tmp_path):
    home = tmp_path / "open"
    home.mkdir()
    os.chmod(home, 0o711)
    assert stat.S_IMODE(home.stat().st_mode) == 0o711
    out = subprocess.run(
        [sys.executable, "-m", "graphrun.machine.warm", "--socket", str(home / "s.sock")],
        env=child_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"graphrun-warm: error: --socket: {home} must be this user's and closed to others "
        "(chmod 700)"
    ]
    assert list(home.iterdir()) == []


def test_a_zombie_child_of_the_worker_does_not_hide_the_server():
    """A child of this process that has exited and is not reaped yet, as an earlier
    test can leave one: the server is still found."""
    import time

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    try:
        assert _server().is_running()
    finally:
        child.wait()
