"""Elastic trainers where a loss used to break them (issue 40, item 7).

A 3-machine local job (``replicas: 2``, ``minMachines: 2``) loses ``m1`` (or ``m0``,
trainer 0's) during an evaluation: the survivors re-form there and evaluate again, and
the job goes on without a restart. A loss early in an epoch: the epoch's accuracy is a
fault-free epoch's, not a model drawn to one class after another.
"""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from graphrun.job.spec import load_job
from graphrun.local.elastic import kill_machine
from graphrun.local.runner import LocalJob, RunOptions
from graphrun.testing.jobs import job_metrics, nothing_left, small_job, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUNTIME = {"replicas": 2, "elastic": {"minMachines": 2, "maxRejoins": 0}}


def events(text: str, name: str) -> list[dict[str, Any]]:
    prefix = f'{{"event": "{name}"'
    return [
        json.loads(line[line.index("{") :])
        for line in text.splitlines()
        if line.partition("] ")[2].startswith(prefix) or line.startswith(prefix)
    ]


def run_killing(
    path: Path, tmp_path: Path, step: int | None, delay_s: float = 0.0, machine: str = "m1"
) -> tuple[Any, str, LocalJob]:
    """Runs the job and kills every process of ``machine`` ``delay_s`` after trainer 0
    took step ``step`` of epoch 1 (None: its last); returns the report, console and job."""
    sink, killed = io.StringIO(), []
    run_dir = tmp_path / "runs" / "small"
    opts = RunOptions(grace_s=2.0, profile_dir=tmp_path / "profile")
    job = LocalJob(load_job(path), path, opts, sink=sink)

    def chaos() -> None:
        metrics = run_dir / "metrics.jsonl"
        assert wait_for(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 1)
        steps = json.loads(metrics.read_text().splitlines()[0])["steps"]
        prof = tmp_path / "profile" / "trainer-0.jsonl"  # a line per step
        assert wait_for(lambda: prof.read_text().count("\n") >= steps + (step or steps))
        time.sleep(delay_s)
        killed.extend(kill_machine(machine))

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    report = job.run()
    thread.join(30)
    assert killed, "the job ended before the kill"
    return report, sink.getvalue(), job


@pytest.mark.timeout(400)
@pytest.mark.parametrize("machine", ["m1", "m0"])
def test_a_machine_lost_during_evaluation_is_survived(tmp_path, machine):
    # the machine dies 0.15 s after trainer 0's last step of epoch 1 (its all-reduce done),
    # while the trainers evaluate: epoch 1's sampled evaluation of 20k nodes takes 0.35 s
    # and more (it was longer; 0.4 s after the step came after it, a CI failure at stop 58)
    # (m0: trainer 0's; on local hosts its loss made both survivors think themselves cut off)
    path = small_job(
        tmp_path, nodes=20_000, machines=3, epochs=3, batchSize=20, evalEvery=1,
        evaluation="sampled", runtime=RUNTIME,
    )  # fmt: skip
    report, out, job = run_killing(path, tmp_path, None, delay_s=0.15, machine=machine)
    assert report.state.phase == "Succeeded" and report.state.restarts == 0, out[-3000:]
    assert events(out, "resumed") == [] and "failed first" not in out
    [reformed] = events(out, "reformed")
    records = job_metrics(path)
    assert reformed["phase"] == "evaluation", reformed  # not in a step: the kill was late
    assert reformed["epoch"] == 1 and reformed["step"] == records[1]["steps"]
    assert reformed["lost_machines"] == [machine] and reformed["world_size"] == 2
    # the evaluation ran again on the survivors, over every node (m1's from its replicas)
    assert [r["epoch"] for r in records] == [0, 1, 2]
    assert records[1]["world_sizes"] == [[0, 3], [records[1]["steps"], 2]]
    assert records[1]["reforms"][0]["phase"] == "evaluation"
    assert records[1]["val_acc"] > records[0]["val_acc"] - 0.02, records
    assert records[2]["world_sizes"] == [[0, 2]]
    nothing_left(job)


@pytest.mark.timeout(400)
def test_the_epoch_that_re_formed_learns_as_one_without_a_loss(tmp_path):
    # m1 dies at step 1 of epoch 1: the survivors train almost all of it on the re-split
    # rest; dealt in node-id order (community by community) the epoch ended on a model
    # drawn to the last classes: validation 0.65 after 0.83 at epoch 0 (0.88 without a loss)
    path = small_job(
        tmp_path, nodes=30_000, machines=3, epochs=2, batchSize=50, evalEvery=1,
        runtime=RUNTIME,
    )  # fmt: skip
    report, out, job = run_killing(path, tmp_path, 1)
    assert report.state.phase == "Succeeded" and report.state.restarts == 0, out[-3000:]
    [reformed] = events(out, "reformed")
    assert reformed["phase"] == "training" and reformed["epoch"] == 1
    records = job_metrics(path)
    assert records[1]["val_acc"] > records[0]["val_acc"], records
    assert records[1]["test_acc"] > records[0]["test_acc"], records
    nothing_left(job)
