"""``graphrun worker`` as a process, for machines a placement plan leaves without stores."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from graphrun.job.hosts import free_ports
from graphrun.job.launch import MachineLaunch
from graphrun.job.worker import read_status
from graphrun.testing.jobs import fake_store, fake_trainer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def run_worker(tmp_path: Path, launch: MachineLaunch) -> subprocess.CompletedProcess[str]:
    plan = launch.write(tmp_path / f"{launch.machine}.json")
    argv = [sys.executable, "-m", "graphrun", "worker", "--plan", str(plan)]
    argv += ["--status-dir", str(tmp_path / "status"), "--grace", "1"]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_trainer_only_machine_exits_0_when_its_trainers_are_done(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    store = fake_store("store:0", "m0", port)  # machine m0's store, run here as a stand-in
    with subprocess.Popen(store.command.argv, stdout=subprocess.DEVNULL) as server:
        try:
            trainer = fake_trainer("trainer:0", "m1", "print('trained')")
            launch = MachineLaunch("m1", (trainer,), wait_for=(store.ready or "",))
            out = run_worker(tmp_path, launch)
        finally:
            server.kill()
    assert out.returncode == 0, out.stderr
    assert "trained" in out.stdout
    status = read_status(tmp_path / "status" / "m1.json")
    assert status is not None and status["state"] == "done"
    assert status["roles"]["trainer:0"]["exit_code"] == 0


def test_machine_without_roles_exits_0(tmp_path: Path) -> None:
    out = run_worker(tmp_path, MachineLaunch("m2", ()))
    assert out.returncode == 0, out.stderr
    status = read_status(tmp_path / "status" / "m2.json")
    assert status is not None and status["state"] == "done"
