"""`graphrun demo` at a small scale (the real demo is 100k nodes, about two minutes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphrun.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_demo_generates_and_partitions(tmp_path, capsys):
    assert main(["demo", "--nodes", "2000", "--no-train", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "edge cut" in out and (tmp_path / "parts" / "partition.json").is_file()


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [("--epochs", "0", "--epochs: 0 is not in [1, 1000000]"),
     ("--nodes", "5", "--nodes: 5 is not in [100, 10000000]")],
)  # fmt: skip
def test_bad_arguments_are_one_line_before_any_work(tmp_path, capsys, flag, value, says):
    """``--epochs 0`` was refused by the job after the graph was generated and partitioned,
    ``--nodes 5`` as an ``--avg-degree`` the demo has no flag for."""
    work = tmp_path / "work"
    argv = ["demo", "--nodes", "2000", "--workdir", str(work), flag, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert not work.exists()


def test_the_demo_bounds_epochs_as_the_job_spec_does():
    from graphrun.cli.demo import MAX_EPOCHS
    from graphrun.job.spec.base import MAX_EPOCHS as SPEC_MAX_EPOCHS

    assert MAX_EPOCHS == SPEC_MAX_EPOCHS


@pytest.mark.integration
@pytest.mark.slow
def test_demo_trains_and_compares_with_an_mlp(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "graphrun", "demo", "--nodes", "3000", "--epochs", "1",
         "--workdir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=110,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "test accuracy: GraphSAGE" in out.stdout and "MLP" in out.stdout
    report = tmp_path / "runs" / "demo" / "report.html"
    assert f"[demo] report: {report} (open it in a browser)" in out.stdout
    assert "<h1>graphrun report: demo</h1>" in report.read_text()
