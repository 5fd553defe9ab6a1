"""Stopped mid-epoch, resumed there: the same losses as a run never stopped.

Real jobs (``graphrun run``: store servers, two DDP trainers, the trainer code the
worker pods run): SIGTERM in the middle of epoch 1 → every trainer stops before the same
step and rank 0 writes an exact checkpoint (model, optimiser, the store's embedding rows
and SparseAdam state, RNG states, the loader's position) → ``--resume`` takes the rest
of epoch 1 and every epoch after exactly as the uninterrupted run did.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphrun.testing.jobs import small_job
from graphrun.train.checkpoint import load_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _epochs(run_dir: Path) -> dict[int, dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    return {r["epoch"]: r for r in map(json.loads, path.read_text().splitlines())}


def _steps_taken(profile: Path) -> int:
    return len(profile.read_text().splitlines()) if profile.exists() else 0


@pytest.mark.timeout(400)  # three jobs in a row: past 120 s on a busy machine
@pytest.mark.parametrize(
    "training",
    [
        # RNG state: dropout masks differ at every step. Batches of 2: ~50 steps an epoch,
        # so the SIGTERM (run -> worker -> trainer) lands inside one, not on its boundary
        # (batches of 5 made 20 steps of ~0.3 s in all: once the stop fell at step 0)
        {"dropout": 0.5, "lr": 0.03, "batchSize": 2},
        # DistEmbedding: rows and SparseAdam state on the store server. One trainer: two
        # push their sparse updates to shared rows in no fixed order, so two uninterrupted
        # runs differ already (epoch 0 loss 0.70937 against 0.71382)
        {
            "task": "link-prediction",
            "embeddingDim": 8,
            "sparseLr": 0.05,
            "batchSize": 100,
            "edgesPerEpoch": 3000,  # 30 steps an epoch (all 14,500 took 145: a minute each)
            "machines": 1,
        },
    ],
    ids=["node-classification", "link-prediction"],
)
def test_sigterm_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path, training):
    training = dict(training)
    path = small_job(tmp_path, epochs=3, machines=training.pop("machines", 2), **training)
    whole, cut, prof = tmp_path / "whole", tmp_path / "cut", tmp_path / "prof"
    cli = [sys.executable, "-m", "graphrun", "run", str(path), "--grace", "60"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([*cli, "--run-dir", str(whole)], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    steps = _epochs(whole)[0]["steps"]
    assert steps >= 10

    proc = subprocess.Popen(
        [*cli, "--run-dir", str(cut), "--profile", str(prof)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    # just into epoch 1: the SIGTERM travels run -> worker -> trainer; on a busy machine
    # (3 test workers on 2 cores) it took over 20 of link prediction's 30 steps, and a
    # stop sent a third into epoch 1 fell on epoch 2's first step
    while _steps_taken(prof / "trainer-0.jsonl") < steps + 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=180)[0]
    assert proc.returncode == 1, out[-3000:]
    assert "Cancelled" in out, out[-3000:]

    ckpt = load_checkpoint(cut / "checkpoints")
    assert ckpt is not None and ckpt.position is not None, out[-3000:]
    # SIGTERM goes out 3 steps into epoch 1; on a busy machine the trainers may get to the
    # stop only in epoch 2 (the signal travels run -> worker -> trainer): either is a stop
    # mid-epoch, which is what this test is about
    stopped_in = ckpt.position["epoch"]
    assert stopped_in in (1, 2) and ckpt.epoch == stopped_in - 1, (ckpt.epoch, stopped_in)
    assert 0 < ckpt.position["step"] < steps  # stopped mid-epoch, not at its end
    assert len(ckpt.position["rng"]) == (1 if "embeddingDim" in training else 2)
    if "embeddingDim" in training:
        assert any(float(v.abs().sum()) > 0 for v in ckpt.sparse["embedding"]["optimizer"].values())
    assert sorted(_epochs(cut)) == list(range(stopped_in))  # that epoch was not finished

    resumed = subprocess.run([*cli, "--run-dir", str(cut), "--resume"], env=env,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logs = "".join(f.read_text(errors="replace") for f in cut.rglob("*.log"))
    assert f'"at_step": {ckpt.position["step"]}' in logs
    want, got = _epochs(whole), _epochs(cut)
    assert sorted(got) == [0, 1, 2]
    for epoch in range(3):
        keys = [k for k in want[epoch] if k.endswith(("loss", "_acc", "_auc"))]
        assert keys
        for k in keys:
            assert got[epoch][k] == want[epoch][k], (epoch, k, got[epoch], want[epoch])
