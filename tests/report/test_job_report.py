"""A real small job's run directory: TensorBoard's own reader loads trainer 0's scalars,
and the report renders from it with the numbers of metrics.jsonl."""

from __future__ import annotations

import io
import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from graphrun.job.spec import load_job
from graphrun.local.runner import LocalJob, RunOptions
from graphrun.machine.trainer import parse_args, train_config
from graphrun.report import write_report
from graphrun.report.render import cell
from graphrun.testing.jobs import small_job
from graphrun.train.tensorboard import scalars

from .test_report import check_page, epochs_table

EPOCHS = 3


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("job")
    path = small_job(tmp, epochs=EPOCHS, runtime={"featureCacheMb": 1})
    LocalJob(load_job(path), path, RunOptions(grace_s=3.0), sink=io.StringIO()).run()
    return tmp / "runs" / "small"


def records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.integration
@pytest.mark.slow
def test_trainer_0_writes_tensorboard_scalars_that_tensorboard_reads(run_dir):
    recs = records(run_dir)
    assert [r["epoch"] for r in recs] == list(range(EPOCHS))
    last = recs[-1]
    assert last["world_size"] == 2 and [t["rank"] for t in last["trainers"]] == [0, 1]
    assert [t["machine"] for t in last["trainers"]] == ["m0", "m1"]
    for t in last["trainers"]:
        assert t["epoch_s"] > 0 and t["compute_s"] > 0 and t["peak_rss_mb"] > 0
        assert 0 <= t["allreduce_s"] <= t["compute_s"]
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = set().union(*(scalars(r) for r in recs))
    assert tags == want
    assert {
        "loss/train", "acc/train", "acc/val", "acc/test", "throughput/seeds_per_s",
        "time/epoch_s", "step/sample_s", "step/fetch_s", "step/compute_s",
        "step/allreduce_s", "job/world_size", "memory/peak_rss_mb/m0",
        "memory/peak_rss_mb/m1", "trainer1/epoch_s", "trainer0/allreduce_s",
    } <= tags  # fmt: skip
    for tag in ("loss/train", "acc/test", "trainer1/epoch_s"):
        assert [e.step for e in acc.Scalars(tag)] == list(range(EPOCHS))
    assert [e.value for e in acc.Scalars("loss/train")] == pytest.approx(
        [r["loss"] for r in recs], rel=1e-6
    )


@pytest.mark.integration
@pytest.mark.slow
def test_the_report_of_the_job_holds_the_numbers_of_its_metrics(run_dir):
    out = write_report(run_dir)
    assert out == run_dir / "report.html"
    page = check_page(out)
    assert len(page.images) == 3  # curves, epoch time, machines
    recs = records(run_dir)
    table = epochs_table(page)
    assert len(table) == len(recs)
    for row, rec in zip(table, recs, strict=True):
        for col, text in row.items():
            assert text == cell(rec.get(col)), col
    trainers = next(t for t in page.tables if t and t[0][:2] == ["trainer", "machine"])
    for row, t in zip(trainers[1:], recs[-1]["trainers"], strict=True):
        assert row[1:3] == [t["machine"], str(t["epoch_s"])]
    roles = next(t for t in page.tables if t[0] == ["machine", "role", "cpu_s", "peak_rss_mb"])
    got = {(r[0], r[1]) for r in roles[1:]}
    assert got == {("m0", "store:0"), ("m0", "trainer:0"), ("m1", "store:1"), ("m1", "trainer:1")}
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in roles[1:])


@pytest.mark.slow  # a whole job
def test_training_tensorboard_false_turns_it_off(tmp_path):
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    path = small_job(tmp_path / "off", nodes=200, tensorboard=False)
    args = parse_args(["--job", str(path), "--rank", "0", "--hosts-file", "h", "--keys", "k"])
    job = load_job(path)
    assert train_config(job, args, tmp_path / "run", tmp_path / "ckpt").tensorboard_dir is None
    on = load_job(small_job(tmp_path / "on", nodes=200))
    cfg = train_config(on, args, tmp_path / "run", tmp_path / "ckpt")
    assert cfg.tensorboard_dir == tmp_path / "run" / "tensorboard"
    assert cfg.machines == ("m0", "m1")
