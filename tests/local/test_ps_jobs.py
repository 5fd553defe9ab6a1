"""Real jobs with parameter servers (``training.sync: ps``): local processes, gloo only for
the loop's counters, the dense parameters and Adam on ``ps:J`` processes."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from graphrun.errors import JobFailed
from graphrun.local.netns import unavailable_reason
from graphrun.names import RoleName
from graphrun.record import read_status
from graphrun.testing.jobs import job_metrics as metrics
from graphrun.testing.jobs import kill_when_training, no_children, small_job
from graphrun.testing.jobs import local_job as run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(300)  # four jobs in a row
def test_sync_ps_trains_as_allreduce_does_and_resumes_exactly(tmp_path):
    """One synchronous PS run (2 parameter servers) for two things (each had its own):
    it trains as all-reduce does, and a run of its first epoch resumed for the second
    ends exactly as it did (the parameter servers' state restored)."""
    losses, paths = {}, {}
    for sync in ("allreduce", "ps"):
        d = tmp_path / sync
        d.mkdir()
        runtime = {"parameterServers": 2} if sync == "ps" else {}
        path = paths[sync] = small_job(d, epochs=2, sync=sync, runtime=runtime)
        job, sink = run(path)
        report = job.run()
        assert report.exits[RoleName.trainer(0)] == 0 and report.exits[RoleName.trainer(1)] == 0
        if sync == "ps":
            assert report.exits[RoleName.ps(0)] == 0 and report.exits[RoleName.ps(1)] == 0
            assert "[ps:1@m1]" in sink.getvalue()
        losses[sync] = [(m["loss"], m["test_acc"]) for m in metrics(path)]
    for (la, aa), (lp, ap) in zip(losses["allreduce"], losses["ps"], strict=True):
        assert lp == pytest.approx(la, rel=1e-3, abs=1e-4), "as all-reduce: loss"
        assert abs(ap - aa) <= 0.01, "as all-reduce: test_acc"
    no_children()
    (tmp_path / "resumed").mkdir()
    first = small_job(tmp_path / "resumed", epochs=1, sync="ps", runtime={"parameterServers": 2})
    run(first)[0].run()
    first.write_text(first.read_text().replace("epochs: 1", "epochs: 2"))
    job, sink = run(first, resume=True)
    job.run()
    assert '"event": "resumed", "from_epoch": 0' in sink.getvalue(), "resume: not resumed"
    whole, resumed = metrics(paths["ps"]), metrics(first)
    assert [m["epoch"] for m in resumed] == [0, 1], f"resume: {resumed}"
    assert resumed[1]["loss"] == whole[1]["loss"], f"resume: {resumed} against {whole}"
    assert resumed[1]["test_acc"] == whole[1]["test_acc"], f"resume: {resumed} against {whole}"
    no_children()


def test_async_ps_learns(tmp_path):
    from graphrun.placement.profile import PSRecord, profile_from_records, read_metrics

    path = small_job(tmp_path, epochs=3, lr=0.03, sync="ps", staleness=2)
    run(path, profile_dir=tmp_path / "profile")[0].run()
    last = metrics(path)[-1]
    assert last["epoch"] == 2 and last["test_acc"] > 0.5  # 4 classes: chance is 0.25
    # no all-reduce runs: its time is absent, not a 0 (the pulls and pushes are in compute)
    assert last["step"]["allreduce_s"] is None and last["step"]["compute_s"] > 0
    assert [t["allreduce_s"] for t in last["trainers"]] == [None, None]
    # profiled, the parameter server says what it spent: the placement model's PS cost
    batches, servers = read_metrics(sorted((tmp_path / "profile").glob("*.jsonl")))
    (ps,) = [r for r in servers if isinstance(r, PSRecord)]
    steps = len([b for b in batches if b.rank == 0])
    assert (ps.index, ps.trainers, ps.pushes) == (0, 2, 2 * steps) and ps.cpu_s > 0
    assert profile_from_records(batches, "p", servers)["ps_update_s"].mean > 0


def test_killed_parameter_server_fails_the_job_by_name(tmp_path):
    path = small_job(tmp_path, entryPoint="graphrun.testing.jobs:wait", sync="ps",
                     runtime={"parameterServers": 2})  # fmt: skip
    job, _ = run(path)
    kill_when_training(tmp_path / "runs" / "small" / "status" / "m1.json", RoleName.ps(1))
    with pytest.raises(JobFailed) as info:
        job.run()
    assert (info.value.role, info.value.host, info.value.exit_code) == (RoleName.ps(1), "m1", -9)
    no_children()


@pytest.mark.netns
@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
@pytest.mark.parametrize("staleness", [0, 2])
def test_parameter_servers_on_netns_hosts(tmp_path, staleness):
    """Both modes across real network stacks, ps:0 placed away from trainer 0."""
    path = small_job(tmp_path, epochs=2, lr=0.03, sync="ps", staleness=staleness,
                     runtime={"parameterServers": 2},
                     placement={"assignments": {"ps:0": "m1", "ps:1": "m0"}})  # fmt: skip
    job, sink = run(path, hosts="netns")
    report = job.run()
    out = sink.getvalue()
    assert report.exits[RoleName.ps(0)] == 0 and report.exits[RoleName.ps(1)] == 0
    assert re.search(r"\[ps:0@m1\] .*ps:0 ready on tcp://10\.77\.", out), out[-2000:]
    assert metrics(path)[-1]["test_acc"] > 0.4
    no_children()


def test_a_killed_parameter_server_restarts_from_the_checkpoint(tmp_path):
    path = small_job(tmp_path, epochs=40, sync="ps", runtime={"parameterServers": 2},
                     run_policy={"backoffLimit": 1})  # fmt: skip
    job, sink = run(path)
    run_dir = tmp_path / "runs" / "small"

    def kill_ps_after_two_epochs() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = (run_dir / "metrics.jsonl").read_text().count("\n") if (
                run_dir / "metrics.jsonl").exists() else 0  # fmt: skip
            st = read_status(run_dir / "status" / "m1.json")
            if done >= 2 and st and st.state == "training":
                os.kill(st.pids()[RoleName.parse("ps:1")], signal.SIGKILL)
                return
            time.sleep(0.05)

    threading.Thread(target=kill_ps_after_two_epochs, daemon=True).start()
    report = job.run()
    out = sink.getvalue()
    assert report.state.restarts == 1, out[-3000:]
    assert "ps:1" in out and '"event": "resumed"' in out
    assert metrics(path)[-1]["epoch"] == 39
    no_children()


@pytest.mark.parametrize(
    "task",
    [
        {"task": "hetero-node-classification", "hetero": True, "targetNodeType": "paper"},
        {"task": "link-prediction", "embeddingDim": 8, "batchSize": 200},
    ],
    ids=["hetero", "link-prediction"],
)
def test_other_tasks_train_on_parameter_servers(tmp_path, task):
    hetero = bool(task.pop("hetero", False))
    path = small_job(tmp_path, hetero=hetero, sync="ps", staleness=1, **task)
    report = run(path)[0].run()
    assert report.exits[RoleName.ps(0)] == 0 and report.exits[RoleName.trainer(1)] == 0
    assert metrics(path)[-1]["epoch"] == 0
