"""Suite-wide hooks.

- Tests marked ``cuda`` run only where torch sees a CUDA device (``scripts/gpu-check``).
- The suite runs on three pytest-xdist workers (``-n 3`` in pyproject's ``addopts``). A
  test that measures time or a CPU share (marked ``exclusive``) runs alone: it takes a
  lock every other test shares, through a turnstile so that the other workers cannot
  starve it. Their modules come first in the list (:func:`alone_first`). The lock is
  taken outside the test's timeout (an outer ``pytest_runtest_protocol`` wrapper), so
  waiting for the other workers' tests does not count against this one's.
- Each worker has one core's share: torch (in the worker and in the processes it starts
  that do not size their threads themselves) gets one OpenMP thread, not one per core,
  which spin in OpenMP's barriers while the other workers have the cores.
- Each worker starts one warm server (``graphrun.machine.warm``) before its first test and
  names it in ``GRAPHRUN_WARM_SOCKET``: every job its tests start forks its CPU trainers
  there instead of importing torch and PyG again (4 CPU-s a job). The tests of the
  per-job server take the variable out of their environment.
- ``GRAPHRUN_TEST_CPU=FILE`` (opt-in) appends one JSON line per test to FILE: its wall time
  and the CPU-seconds of the test's process, of the children it reaped (the processes a
  job test starts, with their descendants) and of the shared warm server with the
  trainers it forked, setup and teardown included. The suite is
  CPU-bound on two cores, so this, not ``--durations``, says which tests cost it.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before any test module imports torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = alone_first(items)
    if not any("cuda" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def runs_alone(item: pytest.Item) -> bool:
    return "exclusive" in item.keywords


def alone_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The modules with a test that runs alone first, in their order, then the rest.

    A test that runs alone waits for the other workers' tests to end while they start no
    new one; at the session's start (xdist gives each worker a block of the list in its
    order) they run short ones, and the waits are short: in the middle of the list they
    were tens of seconds of idle cores each. Whole modules move, so that a module's
    fixtures are still set up once."""
    first = {item.module for item in items if runs_alone(item)}
    return [i for i in items if i.module in first] + [i for i in items if i.module not in first]


def _lock_dir(config: pytest.Config) -> Path:
    # Each worker's basetemp is <session tmp>/popen-gwN; the session directory is shared.
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    return factory.getbasetemp().parent


_WARM_SERVER: list[int] = []  # the pid of this worker's shared warm server


def _warm_cpu() -> float:
    import psutil

    try:
        cpu = psutil.Process(_WARM_SERVER[0]).cpu_times()
    except (IndexError, psutil.Error):
        return 0.0
    return cpu.user + cpu.system + cpu.children_user + cpu.children_system


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True, specname="pytest_runtest_protocol")
def pytest_runtest_protocol_cpu(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Records the test's CPU where ``GRAPHRUN_TEST_CPU`` names a file (inside the lock)."""
    out = os.environ.get("GRAPHRUN_TEST_CPU")
    if not out:
        yield
        return
    wall, own = time.monotonic(), _cpu(resource.RUSAGE_SELF)
    children, warm = _cpu(resource.RUSAGE_CHILDREN), _warm_cpu()
    yield
    line = {
        "test": item.nodeid,
        "wall": round(time.monotonic() - wall, 2),
        "self": round(_cpu(resource.RUSAGE_SELF) - own, 2),
        "children": round(_cpu(resource.RUSAGE_CHILDREN) - children, 2),
        "warm": round(_warm_cpu() - warm, 2),  # the shared server and trainers it reaped
    }
    with open(out, "a") as f:
        f.write(json.dumps(line) + "\n")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    root = _lock_dir(item.config)
    with open(root / "turnstile.lock", "a") as turnstile, open(root / "alone.lock", "a") as alone:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if runs_alone(item):
            fcntl.flock(alone, fcntl.LOCK_EX)  # the other worker finishes its test first
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        else:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(alone, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(alone, fcntl.LOCK_UN)


@pytest.fixture(scope="session", autouse=True)
def _shared_warm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One warm server for this worker's jobs (before any test: no test's child)."""
    import shutil
    import subprocess
    import sys
    import tempfile

    from graphrun.local.machines import package_env
    from graphrun.machine.warm import READY_TIMEOUT_S, SHARED_ENV

    home = Path(tempfile.mkdtemp(prefix="graphrun-test-warm-"))  # 0700, a short path
    sock = home / "s.sock"
    log = tmp_path_factory.getbasetemp() / "warm-server.log"
    argv = [sys.executable, "-m", "graphrun.machine.warm", "--socket", str(sock)]
    with open(log, "ab") as out:
        server = subprocess.Popen(
            argv, env={**os.environ, **package_env()}, stdin=subprocess.DEVNULL, stdout=out,
            stderr=out,
        )  # fmt: skip
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not sock.exists() and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if sock.exists():  # else the jobs start their own, as without it
        os.environ[SHARED_ENV] = str(sock)
        _WARM_SERVER.append(server.pid)
    try:
        yield
    finally:
        os.environ.pop(SHARED_ENV, None)
        _WARM_SERVER.clear()
        server.terminate()  # ends between two imports if it still imports
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def _children_before_the_test() -> Iterator[None]:
    """The descendants alive when a test begins are not its own (``no_children``)."""
    import psutil

    from graphrun.testing import jobs

    before = set()
    for p in psutil.Process().children(recursive=True):
        try:
            before.add((p.pid, p.create_time()))
        except psutil.Error:
            continue
    jobs.BEFORE_TEST.clear()
    jobs.BEFORE_TEST.update(before)
    yield
