"""The GPU feature path run with the CPU transfer: same training, the cache, the stats;
the trainer's device wiring. CUDA runs are marked ``cuda``."""

from __future__ import annotations

import argparse
import io

import pytest
import torch

from graphrun.distributed.devicefeed import CpuTransfer
from graphrun.errors import UserError
from graphrun.graph.generate import GenParams, community
from graphrun.job.spec import job_roles, parse_job, resolve_placement
from graphrun.local.preflight import check_gpus_here
from graphrun.machine.roles import trainer_gpu
from graphrun.machine.trainer import trainer_device
from graphrun.names import RoleName
from graphrun.train.config import Fanouts, TrainConfig
from graphrun.train.context import TrainContext
from graphrun.train.data import LocalData
from graphrun.train.ddp import DDPConfig
from graphrun.train.gpu import NO_FEATURE, DevicePath
from graphrun.train.inference import MIN_BATCH, chunk_targets
from graphrun.train.loop import Profiler, evaluate, train_epoch
from graphrun.train.metrics import MetricsLog
from graphrun.train.tasks import device_precision, make_task

ROW = 16 * 4  # feat_dim 16, float32


@pytest.fixture(scope="module")
def small():
    return community(GenParams(nodes=2000, avg_degree=10, feat_dim=16, classes=4, seed=0))


def _ctx(graph, device: str = "cpu") -> TrainContext:
    cfg = TrainConfig(
        epochs=2, batch_size=200, fanouts=Fanouts((5, 5)), hidden=32, evaluation="sampled"
    )
    ddp = DDPConfig(0, 1, "x:1", accelerator=device)
    return TrainContext(cfg, LocalData(graph), ddp, MetricsLog(None, out=io.StringIO()))


def _train(graph, budget: int | None) -> tuple[list[dict], dict]:
    """Two epochs and an evaluation; with ``budget``, through the feed and cache."""
    c = _ctx(graph)
    torch.manual_seed(0)
    task = make_task(c)
    if budget is not None:
        task.path = DevicePath(
            c.data, torch.device("cpu"), "_N", "feat", RoleName.trainer(0), 200,
            transfer=CpuTransfer(), free_bytes=budget * 4,
        )  # fmt: skip
    prof = Profiler(c, task.model)
    epochs = [train_epoch(task, c, e, prof) for e in range(2)]
    return epochs, evaluate(task, c)


@pytest.mark.parametrize("budget", [2000 * ROW, 300 * ROW])  # the whole table; part of it
def test_the_feed_trains_exactly_as_without_it(small, budget: int) -> None:
    plain, plain_eval = _train(small, None)
    fed, fed_eval = _train(small, budget)
    for a, b in zip(plain, fed, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
        assert a["train"] == b["train"]
    assert plain_eval == fed_eval
    assert all(0.0 <= e["gpu_idle_share"] <= 1.0 for e in fed)
    if budget == 2000 * ROW:  # all rows resident from the start: every lookup hits
        assert [e["gpu_cache_hit_rate"] for e in fed] == [1.0, 1.0]
    else:  # epoch 0 counts accesses, later epochs hit the hottest 300 rows
        assert "gpu_cache_hit_rate" not in fed[0]
        assert 0.0 < fed[1]["gpu_cache_hit_rate"] < 1.0


def test_whole_table_on_the_device_means_no_features_from_the_loaders(small) -> None:
    c = _ctx(small)
    path = DevicePath(
        c.data, torch.device("cpu"), "_N", "feat", RoleName.trainer(0), 200,
        transfer=CpuTransfer(), free_bytes=4 * 2000 * ROW,
    )  # fmt: skip
    assert path.cache is not None and path.cache.whole
    assert path.loader_feature == NO_FEATURE
    raw = next(iter(c.data.loader("train", None, [5, 5], 200, False, 0, NO_FEATURE)))
    assert getattr(raw.data, "x", None) is None  # the loader gathered none
    (moved,) = list(path.batches(iter([raw])))
    assert torch.equal(moved.data.x, torch.from_numpy(small.ndata["_N"]["feat"])[moved.data.n_id])
    path.close()
    # CPU trainers: the loaders' batches pass untouched, features gathered as before
    cpu = DevicePath(c.data, torch.device("cpu"), "_N", "feat", RoleName.trainer(0), 200)
    assert not cpu.active and cpu.loader_feature == "feat" and cpu.end_epoch(1.0) == {}
    batches = iter([raw])
    assert cpu.batches(batches) is batches


def test_layerwise_chunks_fit_the_gpu() -> None:
    assert chunk_targets(1000, None, 128, 40.0) == MIN_BATCH  # on CPU: as before
    # 1 GiB free, half of it, width 128, degree 40: (41 * 128 * 12 + 64) bytes a target
    assert chunk_targets(1000, 1 << 30, 128, 40.0) == (1 << 29) // (41 * 128 * 12 + 64)
    assert chunk_targets(1000, 10, 128, 40.0) == MIN_BATCH  # never below the floor


def test_precision_auto_on_cpu_follows_the_cpu_rule() -> None:
    from graphrun.train.models import resolve_precision

    assert device_precision("auto", torch.device("cpu")) == resolve_precision("auto")
    assert device_precision("bf16", torch.device("cpu")) == "bf16"


def _job(**runtime):
    return parse_job({
        "apiVersion": "graphrun.io/v1alpha1", "kind": "GraphJob", "metadata": {"name": "g"},
        "spec": {"graph": {"dataset": "d"}, "runtime": runtime,
                 "training": {"task": "node-classification"}},
    })  # fmt: skip


def test_each_trainer_is_pinned_to_its_local_gpu() -> None:
    job = _job(machines=2, gpusPerMachine=2)
    roles = {r.id: r for r in job_roles(job.spec)}
    placement = resolve_placement(job)
    got = {
        str(name): (placement[name], trainer_gpu(job, roles, r))
        for name, r in roles.items() if r.kind == "trainer"
    }  # fmt: skip
    assert got == {
        "trainer:0": ("m0", 0), "trainer:1": ("m0", 1), "trainer:2": ("m1", 0),
        "trainer:3": ("m1", 1),
    }  # fmt: skip
    cpu = _job(machines=2)
    assert all(trainer_gpu(cpu, roles, r) is None for r in job_roles(cpu.spec))


def test_asking_for_gpus_where_there_are_none_fails_up_front() -> None:
    check_gpus_here(_job(machines=2), count=0)  # CPU job: nothing to check
    check_gpus_here(_job(gpusPerMachine=1), count=1)
    with pytest.raises(UserError) as err:
        check_gpus_here(_job(gpusPerMachine=2), count=0)
    assert str(err.value) == (
        "machine m0 (this host): has 0 CUDA device(s); the job asks for 2 (runtime.gpusPerMachine)"
    )
    args = argparse.Namespace(gpu=None, machine="m0")
    assert trainer_device(_job(), args) == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="machine m1: has 0 CUDA device"):
            trainer_device(_job(gpusPerMachine=1), argparse.Namespace(gpu=0, machine="m1"))


def test_ddp_config_without_an_accelerator_is_cpu_even_where_cuda_is() -> None:
    """CPU trainers on a machine with a GPU (the benchmark's CPU run) stay on gloo."""
    plain = DDPConfig(0, 2, "x:1")
    assert (plain.device.type, plain.resolved_backend) == ("cpu", "gloo")


def test_ddp_config_follows_the_accelerator() -> None:
    cpu = DDPConfig(0, 2, "x:1", accelerator="cpu")
    assert (cpu.device.type, cpu.resolved_backend, cpu.collective_device.type) == (
        "cpu", "gloo", "cpu",
    )  # fmt: skip
    gpu = DDPConfig(0, 2, "x:1", accelerator="cuda:1")
    assert (str(gpu.device), gpu.resolved_backend, str(gpu.collective_device)) == (
        "cuda:1", "nccl", "cuda:1",
    )  # fmt: skip
    shared = DDPConfig(0, 2, "x:1", backend="gloo", accelerator="cuda:0")
    assert shared.resolved_backend == "gloo" and shared.collective_device.type == "cpu"


@pytest.mark.cuda
def test_cuda_training_matches_cpu_accuracy(small) -> None:
    """The same two epochs on the GPU (fp32) reach about the CPU's accuracy."""
    from graphrun.train.loop import fit

    def run(device: str) -> float:
        cfg = TrainConfig(epochs=3, batch_size=200, fanouts=Fanouts((5, 5)), hidden=32,
                          precision="fp32", lr=0.01)  # fmt: skip
        ddp = DDPConfig(0, 1, "x:1", accelerator=device)
        c = TrainContext(cfg, LocalData(small), ddp, MetricsLog(None, out=io.StringIO()))
        return float(fit(c)["test_acc"])

    assert abs(run("cuda:0") - run("cpu")) < 0.1


@pytest.mark.cuda
def test_cuda_layerwise_equals_cpu(small) -> None:
    from graphrun.train import inference

    c = _ctx(small)
    torch.manual_seed(0)
    task = make_task(c)
    model = task.model
    targets = torch.arange(500)
    cpu = inference.layerwise(model, c.data, "_N", "feat", targets, 200, lambda: None)
    gpu_model = model.to("cuda:0")
    gpu = inference.layerwise(
        gpu_model, c.data, "_N", "feat", targets, 200, lambda: None, torch.device("cuda:0")
    )
    assert torch.allclose(cpu, gpu, atol=1e-4)
