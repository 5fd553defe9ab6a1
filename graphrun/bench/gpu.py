"""``graphrun bench train --device cuda``: the same job with GPU and with CPU trainers.

On one machine with a GPU, in one run: the 2-machine job of :mod:`graphrun.bench.train`
with ``runtime.gpusPerMachine: 1`` (both local machines' trainers on the host's GPUs; two
trainers sharing one GPU talk over gloo, as NCCL refuses two ranks on one device), then
the same job with CPU trainers. One JSON object::

    {"device": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3", "gpus": 1, "backend": "gloo",
     "epoch_s": .., "cpu_epoch_s": .., "epoch_ratio": epoch_s / cpu_epoch_s,
     "gpu_step_ms": .., "cpu_step_ms": .., "step_speedup": cpu_step_ms / gpu_step_ms,
     "test_acc": .., "cpu_test_acc": .., "acc_gap": test_acc - cpu_test_acc,
     "stages": {"sample_fetch_ms": .., "feed_ms": .., "compute_ms": .., "step_ms": ..},
     "overlap_ratio": step_ms / the slowest stage, "gpu_idle_share": .., "gpu_cache_hit_rate": ..,
     "step": {...}, "cpu_step": {...} (graphrun.bench.train.step_breakdown), "targets": {...}}

``step_ms`` is the epoch's wall time per step; the stages run side by side (sampler
workers, the feed thread, the GPU), so with overlap it is close to the slowest of them:
sampling and pulling (a batch's seconds over the trainer's sampler workers), the feed
(packing and issuing copies) and the compute step. ``targets`` says which of issue 28's
targets this run met; it measures, it does not decide.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphrun.errors import UserError

TARGETS = {"acc_gap_max": 0.005, "epoch_ratio_max": 0.25, "step_speedup_min": 10.0,
           "overlap_ratio_max": 1.3}  # fmt: skip


def stages(result: dict[str, Any], workers: int) -> dict[str, float]:
    """Per-step milliseconds of each stage of a job's epoch, and of the epoch itself."""
    step = result.get("step") or {}
    dev = result.get("device_stats") or {}
    steps = max(int(result.get("steps") or 1), 1)
    out = {
        "sample_fetch_ms": round(
            (step.get("sample_ms", 0.0) + step.get("fetch_ms", 0.0)) / max(workers, 1), 2
        ),
        "compute_ms": float(step.get("compute_ms", 0.0)),
        "step_ms": round(result["epoch_s"] * 1e3 / steps, 2),
    }
    if "gpu_feed_ms" in dev:
        out["feed_ms"] = float(dev["gpu_feed_ms"])
    return out


def summary(gpu: dict[str, Any], cpu: dict[str, Any], workers: int) -> dict[str, Any]:
    """The comparison's fields from the two jobs' results (pure: tested on CPU)."""
    st = stages(gpu, workers)
    slowest = max(v for k, v in st.items() if k != "step_ms") or 1e-9
    g_step = float((gpu.get("step") or {}).get("compute_ms") or 0.0)
    c_step = float((cpu.get("step") or {}).get("compute_ms") or 0.0)
    out = {
        "epoch_s": gpu["epoch_s"], "cpu_epoch_s": cpu["epoch_s"],
        "epoch_ratio": round(gpu["epoch_s"] / cpu["epoch_s"], 4) if cpu["epoch_s"] else None,
        "gpu_step_ms": g_step, "cpu_step_ms": c_step,
        "step_speedup": round(c_step / g_step, 2) if g_step else None,
        "test_acc": gpu["test_acc"], "cpu_test_acc": cpu["test_acc"],
        "acc_gap": round(gpu["test_acc"] - cpu["test_acc"], 5),
        "stages": st, "overlap_ratio": round(st["step_ms"] / slowest, 3),
        **(gpu.get("device_stats") or {}),
        "step": gpu.get("step"), "cpu_step": cpu.get("step"),
        "epoch_s_all": gpu.get("epoch_s_all"), "cpu_epoch_s_all": cpu.get("epoch_s_all"),
        "eval_s": gpu.get("eval_s"), "cpu_eval_s": cpu.get("eval_s"),
        "precision": gpu.get("precision"), "cpu_precision": cpu.get("precision"),
        "time_to_first_step_s": gpu.get("time_to_first_step_s"),
        "peak_rss_mb": gpu.get("peak_rss_mb"), "cpu_peak_rss_mb": cpu.get("peak_rss_mb"),
    }  # fmt: skip
    out["targets"] = {
        "accuracy_within_0.5_point": abs(out["acc_gap"]) <= TARGETS["acc_gap_max"],
        "epoch_at_most_0.25x_cpu": out["epoch_ratio"] is not None
        and out["epoch_ratio"] <= TARGETS["epoch_ratio_max"],
        "step_at_least_10x_faster": out["step_speedup"] is not None
        and out["step_speedup"] >= TARGETS["step_speedup_min"],
        "epoch_at_most_1.3x_slowest_stage": out["overlap_ratio"] <= TARGETS["overlap_ratio_max"],
    }
    return out


def require_cuda() -> None:
    """Fail before any work, in one line, where torch sees no GPU."""
    import torch

    if not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no CUDA device on this machine")


def compare(
    args: argparse.Namespace, workdir: Path, aggr: str, run_job: Callable[..., dict[str, Any]]
) -> dict[str, Any]:
    """Both jobs, GPU trainers first; ``run_job`` is
    :func:`graphrun.bench.train.run_distributed`."""
    import torch

    from graphrun.job.gpus import GPU_SAMPLER_WORKERS

    require_cuda()
    count = torch.cuda.device_count()
    machines = 2
    shared = count < machines  # both local machines' trainers on one GPU
    backend = ("--backend", "gloo") if shared else ()
    workers = GPU_SAMPLER_WORKERS if args.sampler_workers is None else args.sampler_workers
    if args.sampler_workers is None:
        args = argparse.Namespace(**{**vars(args), "sampler_workers": workers})  # same for both
    gpu = run_job(args, workdir, aggr, tag="gpu", gpus=1, trainer_args=backend)
    cpu = run_job(args, workdir, aggr, tag="cpu", gpus=0)
    return {
        "device": "cuda", "gpu_name": torch.cuda.get_device_name(0), "gpus": count,
        "backend": "gloo" if shared else "nccl", "aggr": aggr, "sampler_workers": workers,
        **summary(gpu, cpu, workers),
    }  # fmt: skip
