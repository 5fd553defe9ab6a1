"""Device selection, backend, precision, the up-front GPU check, OOM lines, idle share."""

from __future__ import annotations

import pytest
import torch

from graphrun.errors import ArgumentError, UserError
from graphrun.names import RoleName
from graphrun.train.device import (
    IdleMeter,
    backend_for,
    check_gpus,
    gpu_index,
    local_rank,
    oom_guard,
    oom_message,
    precision_for,
    resolve_device,
)


def test_local_rank_and_gpu_pinning() -> None:
    # 2 machines x 4 trainers: trainer 5 is the second of machine 1, on its GPU 1
    assert [local_rank(r, 4) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert gpu_index(local_rank(5, 4), 4) == 1
    assert gpu_index(3, 2) == 1  # more trainers than GPUs: shared round-robin
    assert gpu_index(0, 0) is None
    with pytest.raises(ArgumentError):
        local_rank(0, 0)


def test_device_and_backend() -> None:
    assert resolve_device("auto", 2, cuda_available=True) == "cuda"
    assert resolve_device("auto", 2, cuda_available=False) == "cpu"
    assert resolve_device("auto", 0, cuda_available=True) == "cpu"
    assert resolve_device("cpu", 2, cuda_available=True) == "cpu"
    assert resolve_device("cuda", 0, cuda_available=False) == "cuda"  # the check says no later
    with pytest.raises(ArgumentError, match="tpu"):
        resolve_device("tpu", 0, False)
    assert backend_for("cuda") == "nccl"
    assert backend_for("cuda:1") == "nccl"
    assert backend_for("cpu") == "gloo"


def test_precision_auto_per_device() -> None:
    assert precision_for("auto", "cuda", bf16_supported=True, cpu_native=False) == "bf16"
    assert precision_for("auto", "cuda", bf16_supported=False, cpu_native=True) == "fp32"
    assert precision_for("auto", "cpu", bf16_supported=True, cpu_native=False) == "fp32"
    assert precision_for("auto", "cpu", bf16_supported=False, cpu_native=True) == "bf16"
    assert precision_for("fp32", "cuda", True, True) == "fp32"
    with pytest.raises(ArgumentError):
        precision_for("fp8", "cuda", True, True)


def test_check_gpus_one_line_naming_the_machine() -> None:
    check_gpus("m0", 0, 0)
    check_gpus("m0", 2, 2)
    with pytest.raises(UserError) as err:
        check_gpus("m1", 2, 0)
    msg = str(err.value)
    assert "\n" not in msg
    assert "machine m1" in msg and "0 CUDA device" in msg and "asks for 2" in msg
    with pytest.raises(UserError, match=r"1 CUDA device\(s\) \(NVIDIA H100\)"):
        check_gpus("m0", 4, 1, ["NVIDIA H100"])


def test_oom_becomes_one_line_naming_role_batch_and_setting() -> None:
    msg = oom_message(
        RoleName.trainer(3), 4096, "training.batchSize", "CUDA out of memory.\nTried ..."
    )
    assert msg == (
        "trainer:3: CUDA out of memory at batch size 4096 (CUDA out of memory.); "
        "lower training.batchSize"
    )
    with (
        pytest.raises(UserError, match="trainer:0: CUDA out of memory at batch size 8"),
        oom_guard(RoleName.trainer(0), 8),
    ):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
    with pytest.raises(ValueError), oom_guard(RoleName.trainer(0), 8):  # anything else passes
        raise ValueError("no")


def test_idle_meter_share() -> None:
    now = [0.0]
    meter = IdleMeter(clock=lambda: now[0])
    meter.start()
    with meter.wait():
        now[0] += 1.0  # waited 1 s for a batch
    now[0] += 3.0  # computed 3 s
    assert meter.share() == pytest.approx(0.25)
    assert meter.steps == 1
    meter.start()
    assert meter.waited_s == 0.0
