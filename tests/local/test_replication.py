"""A replicated job (``runtime.replicas: 2``) goes on when a store server dies."""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["trainers_start", "first_step"])
def test_a_killed_primary_store_is_replaced_by_its_replica_without_a_restart(tmp_path, when):
    """Killed as the trainers start (they join its replica) or once they train (they
    fail over to it); the job ends Succeeded without a restart either way."""
    path = small_job(tmp_path, epochs=6, runtime={"replicas": 2})
    sink = io.StringIO()

    m0 = tmp_path / "runs" / "small" / "status" / "m0.json"

    def ready() -> bool:
        # every machine past its wait for the others' stores (a store killed while another
        # machine still waits for it to answer is the start's timeout, not a failover)
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
    lines = sink.getvalue().splitlines()
    lost = [json.loads(x[x.index("{") :]) for x in lines if '"store_lost"' in x]
    assert [(e["role"], e["machine"]) for e in lost] == [("store:1", "m1")]
    took_over = [x for x in lines if x.startswith("[trainer:") and "replica" in x]
    assert took_over and all("partition 1:" in x for x in took_over), lines
    nothing_left(job)
