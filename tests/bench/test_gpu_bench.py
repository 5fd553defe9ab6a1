"""``graphrun bench train --device cuda``: the comparison's fields (pure), and the one
line it fails with where torch sees no GPU."""

from __future__ import annotations

import argparse

import pytest
import torch

from graphrun.bench.gpu import compare, stages, summary
from graphrun.errors import UserError


def _result(epoch_s: float, compute_ms: float, acc: float, **dev: float) -> dict:
    return {
        "epoch_s": epoch_s, "test_acc": acc, "steps": 100, "epoch_s_all": [epoch_s],
        "step": {"sample_ms": 40.0, "fetch_ms": 20.0, "compute_ms": compute_ms},
        "device_stats": dev,
    }  # fmt: skip


def test_summary_fields_and_targets() -> None:
    gpu = _result(2.0, 5.0, 0.801, gpu_feed_ms=3.0, gpu_idle_share=0.1, gpu_cache_hit_rate=1.0)
    cpu = _result(10.0, 80.0, 0.80)
    s = summary(gpu, cpu, workers=4)
    for key in ("epoch_s", "cpu_epoch_s", "gpu_step_ms", "cpu_step_ms", "test_acc",
                "cpu_test_acc", "step", "cpu_step", "stages", "gpu_idle_share"):  # fmt: skip
        assert key in s, key
    assert (s["epoch_ratio"], s["step_speedup"], s["acc_gap"]) == (0.2, 16.0, 0.001)
    # 100 steps in 2 s: 20 ms a step; the slowest stage is sampling, (40 + 20) / 4 workers
    assert s["stages"] == {"sample_fetch_ms": 15.0, "compute_ms": 5.0, "step_ms": 20.0,
                           "feed_ms": 3.0}  # fmt: skip
    assert s["overlap_ratio"] == round(20.0 / 15.0, 3)
    assert s["targets"] == {
        "accuracy_within_0.5_point": True, "epoch_at_most_0.25x_cpu": True,
        "step_at_least_10x_faster": True, "epoch_at_most_1.3x_slowest_stage": False,
    }  # fmt: skip
    slow = summary(_result(5.0, 20.0, 0.79), cpu, workers=4)
    assert slow["targets"]["epoch_at_most_0.25x_cpu"] is False
    assert slow["targets"]["step_at_least_10x_faster"] is False
    assert slow["targets"]["accuracy_within_0.5_point"] is False


def test_stages_without_workers_count_the_trainer_alone() -> None:
    assert stages(_result(1.0, 5.0, 0.5), workers=0)["sample_fetch_ms"] == 60.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_no_gpu_is_one_line(tmp_path) -> None:
    with pytest.raises(UserError, match=r"^--device cuda: torch sees no CUDA device"):
        compare(argparse.Namespace(sampler_workers=None), tmp_path, "csr", lambda *a, **k: {})
