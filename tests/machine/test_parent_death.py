"""``kill -9`` of ``graphrun run``: nothing of the job outlives it.

The launcher cannot clean up after a SIGKILL; its workers, store servers, trainers and
loader workers must notice their parent's death themselves, stop, and the store servers
unlink their shared-memory segments.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from graphrun.machine.process import still_running
from graphrun.machine.warm import SHARED_ENV
from graphrun.record import read_status
from graphrun.testing.jobs import small_job
from graphrun.testing.procs import child_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _without(env: dict[str, str], name: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k != name}


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


@pytest.mark.timeout(180)
def test_sigkill_of_graphrun_run_leaves_no_process_and_no_segment(tmp_path: Path) -> None:
    path = small_job(tmp_path, epochs=200, runtime={"samplerWorkersPerTrainer": 1})
    status_dir = tmp_path / "runs" / "small" / "status"
    log = (tmp_path / "run.out").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphrun", "run", str(path), "--verbose"],
        # its own warm server (not the suite's shared one): it must go with the launcher
        stdout=log, stderr=subprocess.STDOUT, env=_without(child_env(), SHARED_ENV),
        start_new_session=True,
    )  # fmt: skip
    procs: list[psutil.Process] = []
    store_pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        # 2 workers, 2 stores, 2 trainers, 2 loader workers (+ resource trackers)
        while time.monotonic() < deadline:
            states = [read_status(status_dir / f"m{i}.json") for i in range(2)]
            procs = _descendants(proc.pid)
            if all(s and s.state == "training" for s in states) and len(procs) >= 8:
                store_pids = [
                    pid
                    for s in states
                    if s is not None
                    for role, pid in s.pids().items()
                    if role.kind == "store"
                ]
                break
            assert proc.poll() is None, (tmp_path / "run.out").read_text()
            time.sleep(0.2)
        else:
            pytest.fail("the job did not reach training: " + (tmp_path / "run.out").read_text())
        time.sleep(1.0)  # mid-training
        procs = _descendants(proc.pid)
        assert len(store_pids) == 2
        # the warm server (its trainers, forked from it, show its command line too)
        [warm] = [
            p for p in procs if "graphrun.machine.warm" in p.cmdline() and p.ppid() == proc.pid
        ]
        warm_dir = Path(warm.cmdline()[-1]).parent  # --socket DIR/0.sock
        assert [p for p in os.listdir("/dev/shm") if p.startswith(_prefixes(store_pids))]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while still_running(procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = still_running(procs)
        segments = [p for p in os.listdir("/dev/shm") if p.startswith(_prefixes(store_pids))]
        assert left == [], [(p.pid, p.cmdline()[:6]) for p in left]
        assert segments == []
        assert not warm_dir.exists()  # the warm server's socket and directory
    finally:
        for p in still_running(procs):
            p.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        for p in os.listdir("/dev/shm"):
            if store_pids and p.startswith(_prefixes(store_pids)):
                (Path("/dev/shm") / p).unlink(missing_ok=True)


def _prefixes(pids: list[int]) -> tuple[str, ...]:
    return tuple(f"graphrun-{pid}-" for pid in pids)
