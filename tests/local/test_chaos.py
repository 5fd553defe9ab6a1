"""Chaos: roles killed, stopped or paused at seeded random moments of a real job.

Whatever happens, the job either succeeds (after restarts, within its backoff limit) or
fails naming the role that was hurt, and no process or shared-memory segment is left.
Bounded: three seeded cases, each one real 2-machine job on loopback.
"""

from __future__ import annotations

import io
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from graphrun.errors import JobFailed
from graphrun.job.spec import load_job
from graphrun.local.runner import LocalJob, RunOptions
from graphrun.names import RoleName
from graphrun.record import read_status
from graphrun.testing.jobs import nothing_left, small_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROLES = (RoleName.store(0), RoleName.store(1), RoleName.trainer(0), RoleName.trainer(1))
# long enough to still train 1.5 s after the trainers start: warm-started (forked from
# the host's warm server) they are training within 0.3 s, and 4 epochs took 0.5 s
EPOCHS = 60


def hurt(
    status_dir: Path,
    role: RoleName,
    action: str,
    delay: float,
    done: threading.Event,
    hit: list[RoleName],
) -> None:
    """Once ``role`` runs and training started, wait ``delay`` s, then kill/stop/pause it
    (``hit`` gets the role if it was still running)."""
    machine = f"m{role.index}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not done.is_set():
        st = read_status(status_dir / f"{machine}.json")
        if st and st.state == "training" and role in st.pids():
            time.sleep(delay)
            pid = st.pids()[role]
            try:
                os.kill(pid, 0)
                hit.append(role)
                if action == "kill":
                    os.kill(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGSTOP)
                    if action == "pause":  # shorter than the stall timeout: must not matter
                        time.sleep(1.0)
                        os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass  # it finished first: nothing was hurt
            return
        time.sleep(0.05)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("seed", "action", "backoff"), [(0, "kill", 0), (1, "stop", 1), (2, "pause", 0)]
)
def test_chaos(tmp_path: Path, seed: int, action: str, backoff: int) -> None:
    rng = random.Random(seed)
    role, delay = rng.choice(ROLES), rng.uniform(0.0, 1.5)
    path = small_job(tmp_path, epochs=EPOCHS, run_policy={"backoffLimit": backoff})
    opts = RunOptions(grace_s=2.0, stall_timeout_s=3.0)
    job = LocalJob(load_job(path), path, opts, sink=io.StringIO())
    done = threading.Event()
    status_dir = tmp_path / "runs" / "small" / "status"
    hit: list[RoleName] = []
    chaos = threading.Thread(target=hurt, args=(status_dir, role, action, delay, done, hit))
    chaos.start()
    try:
        report = job.run()
    except JobFailed as exc:
        assert action != "pause", f"a 1 s pause failed the job: {exc}"
        assert exc.role == role, f"{action} {role} at +{delay:.2f}s was blamed on {exc}"
        if action == "stop":
            assert "stopped (SIGSTOP)" in str(exc)
    else:
        if hit and action != "pause":  # hurt for good: it took a restart to succeed
            assert backoff >= 1 and report.state.restarts >= 1, (action, role, delay)
    finally:
        done.set()
        chaos.join()
    assert hit == [role], "the chaos came after the job ended: make the job longer"
    nothing_left(job)
