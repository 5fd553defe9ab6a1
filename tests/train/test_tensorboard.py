"""The metrics log's TensorBoard scalars, read back with TensorBoard's own reader."""

from __future__ import annotations

import io
import math

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from graphrun.train.metrics import MetricsLog
from graphrun.train.tensorboard import machine_peaks, scalars


def test_epoch_records_become_scalars_per_epoch(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl", out=io.StringIO(), tensorboard_dir=tmp_path / "tb")
    trainers = [
        {"rank": 0, "machine": "m0", "epoch_s": 1.0, "sample_s": 0.2, "peak_rss_mb": 100.0},
        {"rank": 1, "machine": "m0", "epoch_s": 1.1, "sample_s": 0.3, "peak_rss_mb": 50.0},
    ]
    for epoch in range(3):
        log.write({"epoch": epoch, "loss": 1.0 / (epoch + 1), "val_auc": 0.5 + epoch / 10,
                   "val_hits@10": 0.25, "trainers": trainers, "world_size": 2})  # fmt: skip
    log.write({"event": "a record of no epoch"})
    log.write({"epoch": 3, "loss": math.nan})  # a NaN is no scalar, as in metrics.jsonl
    log.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == {
        "loss/train", "auc/val", "hits@10/val", "job/world_size", "trainer0/epoch_s",
        "trainer1/epoch_s", "trainer0/sample_s", "trainer1/sample_s", "memory/peak_rss_mb/m0",
    }  # fmt: skip
    assert [e.step for e in acc.Scalars("loss/train")] == [0, 1, 2]
    assert [e.value for e in acc.Scalars("auc/val")] == pytest.approx([0.5, 0.6, 0.7])
    assert acc.Scalars("memory/peak_rss_mb/m0")[0].value == 150.0
    assert machine_peaks({"trainers": trainers}) == {"m0": 150.0}


def test_nothing_is_written_without_a_directory_or_on_other_ranks(tmp_path):
    MetricsLog(None, out=io.StringIO()).write({"epoch": 0, "loss": 1.0})
    off = MetricsLog(tmp_path / "m.jsonl", enabled=False, tensorboard_dir=tmp_path / "tb")
    off.write({"epoch": 0, "loss": 1.0})
    off.close()
    assert not (tmp_path / "tb").exists()
    assert scalars({"epoch": 0, "loss": True, "train_acc": "x"}) == {}
