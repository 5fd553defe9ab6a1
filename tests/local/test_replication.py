"""A replicated job (``runtime.replicas: 2``) goes on when a store server dies."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from graphrun.job.spec import load_job
from graphrun.local.runner import LocalJob, RunOptions
from graphrun.names import RoleName
from graphrun.record import read_status
from graphrun.testing.jobs import nothing_left, small_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def kill_when(status_file: Path, role: str, ready: Callable[[], bool], hit: list[int]) -> None:
    """SIGKILL ``role`` once its machine trains and ``ready()``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        st = read_status(status_file)
        if st and st.state == "training" and RoleName.parse(role) in st.pids() and ready():
            pid = st.pids()[RoleName.parse(role)]
            try:
                os.kill(pid, signal.SIGKILL)
                hit.append(pid)
            except ProcessLookupError:
                pass
            return
        time.sleep(0.05)


def worker_of(machine: str, run: Path) -> psutil.Process | None:
    """The ``graphrun worker`` process of ``machine`` (started by this test's launcher)."""
    plan = str(run / "launch" / f"{machine}.json")
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "worker" in p.cmdline() and plan in p.cmdline():
                return p
    return None


def kill_while_m0_waits(run: Path, hit: list[int], took: list[float]) -> None:
    """SIGKILL ``store:1`` (m1) while m0 has not yet looked for it: m0's worker is stopped
    (SIGSTOP) once it started its own store servers, until m1 trains and ``store:1`` is
    dead. m0 then waits for partition 1, whose replica (on m0) serves; ``took``: the
    seconds from m0 going on to its trainers starting."""
    status, deadline = run / "status", time.monotonic() + 120
    worker = None
    while worker is None and time.monotonic() < deadline:
        st = read_status(status / "m0.json")
        if st is not None and RoleName.store(0) in st.pids():
            worker = worker_of("m0", run)
        time.sleep(0.01)
    if worker is None:
        return
    worker.suspend()
    try:
        st = read_status(status / "m0.json")
        assert st is not None and st.state != "training", "m0 passed its wait: too late"
        while time.monotonic() < deadline:
            st = read_status(status / "m1.json")
            if st is not None and st.state == "training":
                victim = psutil.Process(st.pids()[RoleName.store(1)])
                victim.kill()
                victim.wait(30)
                hit.append(victim.pid)
                break
            time.sleep(0.05)
    finally:
        worker.resume()
    resumed = time.monotonic()
    while time.monotonic() < deadline:
        st = read_status(status / "m0.json")
        if st is not None and st.state in ("training", "done", "failed"):
            if st.state != "failed":
                took.append(time.monotonic() - resumed)
            return
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_a_primary_killed_while_another_machine_waits_for_it_is_stood_in_for(tmp_path):
    """A machine that starts waiting for the stores after a primary died starts its
    trainers once the partition's replica answers, and they join it. It used to wait for
    the dead primary until the ready timeout (120 s) and fail the start."""
    path = small_job(tmp_path, runtime={"replicas": 2}, run_policy={"backoffLimit": 0})
    sink = io.StringIO()
    run = tmp_path / "runs" / "small"
    # a start that timed out fails the job here, as it would after 120 s
    job = LocalJob(load_job(path), path, RunOptions(grace_s=2.0, ready_timeout_s=45.0), sink=sink)
    hit: list[int] = []
    took: list[float] = []
    chaos = threading.Thread(target=kill_while_m0_waits, args=(run, hit, took))
    chaos.start()
    try:
        report = job.run()
    finally:
        chaos.join()
    assert hit, "store:1 was not killed"
    assert report.state.phase == "Succeeded" and report.state.restarts == 0, sink.getvalue()
    assert took and took[0] < 15.0, took  # the replica answers at once
    lines = sink.getvalue().splitlines()
    check_the_replica_took_over(lines)
    joined = [x for x in lines if x.startswith("[trainer:0@m0]") and "its replica" in x]
    assert joined and "partition 1:" in joined[0], lines  # m0's trainer joined the replica
    nothing_left(job)


def check_the_replica_took_over(lines: list[str]) -> None:
    lost = [json.loads(x[x.index("{") :]) for x in lines if '"store_lost"' in x]
    assert [(e["role"], e["machine"]) for e in lost] == [("store:1", "m1")]
    took_over = [x for x in lines if x.startswith("[trainer:") and "replica" in x]
    assert took_over and all("partition 1:" in x for x in took_over), lines


@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["trainers_start", "first_step"])
def test_a_killed_primary_store_is_replaced_by_its_replica_without_a_restart(tmp_path, when):
    """Killed as the trainers start (they join its replica) or once they train (they
    fail over to it); the job ends Succeeded without a restart either way."""
    path = small_job(tmp_path, epochs=6, runtime={"replicas": 2})
    sink = io.StringIO()

    m0 = tmp_path / "runs" / "small" / "status" / "m0.json"

    def ready() -> bool:
        # every machine past its wait for the others' stores (killed while another machine
        # still waits: test_a_primary_killed_while_another_machine_waits_for_it_is_stood_in_for)
        st = read_status(m0)
        started = st is not None and st.state == "training"
        return started and (when == "trainers_start" or '"first_step"' in sink.getvalue())

    job = LocalJob(load_job(path), path, RunOptions(grace_s=2.0), sink=sink)
    status = tmp_path / "runs" / "small" / "status" / "m1.json"
    hit: list[int] = []
    chaos = threading.Thread(target=kill_when, args=(status, "store:1", ready, hit))
    chaos.start()
    try:
        report = job.run()
    finally:
        chaos.join()
    assert hit, "the job ended before the kill: make it longer"
    assert report.state.phase == "Succeeded" and report.state.restarts == 0
    check_the_replica_took_over(sink.getvalue().splitlines())
    nothing_left(job)
