"""Training loops in one process on small generated graphs (real sampling kernels)."""

from __future__ import annotations

import io
import json

import pytest
import torch

from graphrun.graph.generate import GenParams, academic, community
from graphrun.train.checkpoint import load_checkpoint
from graphrun.train.config import Fanouts, TrainConfig
from graphrun.train.context import TrainContext
from graphrun.train.data import LocalData
from graphrun.train.ddp import DDPConfig
from graphrun.train.loop import fit, run_training
from graphrun.train.metrics import MetricsLog


@pytest.fixture(scope="module")
def small():
    return community(GenParams(nodes=2000, avg_degree=10, feat_dim=16, classes=4, seed=0))


def ctx(graph, tmp_path, **kw):
    fanouts = kw.pop("fanouts", Fanouts((5, 5)))
    cfg = TrainConfig(epochs=kw.pop("epochs", 1), batch_size=200, fanouts=fanouts, hidden=32, **kw)
    out = io.StringIO()
    return TrainContext(
        cfg,
        LocalData(graph),
        DDPConfig(0, 1, "x:1"),
        MetricsLog(tmp_path / "metrics.jsonl", out=out),
    ), out


def test_node_classification_learns(small, tmp_path):
    c, _ = ctx(small, tmp_path, epochs=5, lr=0.01, checkpoint_dir=tmp_path / "ck")
    rec = fit(c)
    # 4 classes: chance is 0.25; 5 epochs of one batch reach 0.47-0.67 over seeds 0-5
    assert rec["epoch"] == 4 and rec["test_acc"] > 0.4
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [0, 1, 2, 3, 4]
    assert load_checkpoint(tmp_path / "ck").epoch == 4  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("precision", "aggr_path"), [("bf16", "csr"), ("fp32", "csr"), ("bf16", "scatter")]
)
def test_a_bf16_sage_task_has_its_rows_fetched_in_bf16(small, tmp_path, precision, aggr_path):
    """The batches bring ``x`` in bf16 only where layer 0 reads bf16 rows; fp32 as before."""
    from graphrun.train.tasks import make_task

    c, _ = ctx(small, tmp_path, precision=precision, aggr_path=aggr_path)
    task = make_task(c)
    half = precision == "bf16" and aggr_path == "csr"
    assert task.x_bf16 == half
    batch = next(task.batches("train", 0, shuffle=True))
    assert batch.data.x.dtype == (torch.bfloat16 if half else torch.float32)
    loss, _, counted = task.loss(task.model, batch)
    assert torch.isfinite(loss) and counted == batch.data.batch_size


def test_resume_continues_after_the_checkpoint(small, tmp_path):
    fit(ctx(small, tmp_path, epochs=1, checkpoint_dir=tmp_path / "ck")[0])
    c, _ = ctx(small, tmp_path, epochs=2, checkpoint_dir=tmp_path / "ck", resume=True)
    rec = fit(c)
    assert rec["epoch"] == 1
    epochs = [json.loads(x)["epoch"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [0, 1]


def test_a_resume_drops_the_records_of_the_epochs_it_runs_again(small, tmp_path):
    """A restart after epoch 1's record but before its checkpoint: epoch 1 runs again,
    and its first record goes (it was in the file twice, as a CI run of
    tests/local/test_elastic.py showed)."""
    fit(ctx(small, tmp_path, epochs=1, checkpoint_dir=tmp_path / "ck")[0])
    metrics = tmp_path / "metrics.jsonl"
    with metrics.open("a") as f:  # epoch 1's record, its checkpoint never written
        f.write(json.dumps({"epoch": 1, "loss": 9.0}) + "\n")
    c, _ = ctx(small, tmp_path, epochs=2, checkpoint_dir=tmp_path / "ck", resume=True)
    fit(c)
    records = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1] and records[1]["loss"] != 9.0


@pytest.mark.slow
def test_link_prediction_learns_and_reports_ranking_metrics(small, tmp_path):
    c, _ = ctx(
        small, tmp_path, task="link-prediction", embedding_dim=8, edges_per_epoch=4000,
        epochs=5, eval_negatives=20,
    )  # fmt: skip
    rec = fit(c)
    assert rec["steps"] == 20
    # chance: AUC 0.5, MRR 0.17 (the mean of 1/rank over ranks 1..21)
    assert rec["test_auc"] > 0.58 and 0.2 < rec["test_mrr"] <= 1.0
    assert 0.0 <= rec["val_hits@10"] <= 1.0


def test_link_prediction_trains_and_evaluates_on_disjoint_edges(small):
    import torch

    from graphrun.sampling.edgesplit import TEST, TRAIN, VAL, EdgeSplit, pair_key

    split = EdgeSplit(0.1, 0.1, seed=0)
    src, dst = torch.from_numpy(small.src), torch.from_numpy(small.dst)
    pairs = {}
    for rank in range(2):
        d = LocalData(small, rank=rank, world_size=2)
        for name, code in (("train", TRAIN), ("val", VAL), ("test", TEST)):
            e = d.edges(name, split)
            assert bool((split.of(src[e], dst[e]) == code).all()) and e.numel() > 0
            keys = set(pair_key(src[e], dst[e], small.num_nodes).tolist())
            pairs[name] = pairs.get(name, set()) | keys
    # an undirected edge's two directions are never on two sides of the split
    assert not pairs["train"] & pairs["val"] and not pairs["train"] & pairs["test"]
    assert not pairs["val"] & pairs["test"]


def test_hetero_node_classification_runs(tmp_path):
    g = academic(GenParams(nodes=3000, avg_degree=6, feat_dim=16, classes=4, seed=1))
    c, _ = ctx(
        g,
        tmp_path,
        task="hetero-node-classification",
        target_node_type="paper",
        fanouts=Fanouts.of((5, 5), {"author:writes:paper": [3, 2]}),
    )
    rec = fit(c)
    assert 0.0 <= rec["test_acc"] <= 1.0


def test_hetero_task_builds_rgcn_with_the_configured_bases(tmp_path):
    from graphrun.train.rgcn import RGCNLayer
    from graphrun.train.tasks import make_task

    g = academic(GenParams(nodes=600, avg_degree=4, feat_dim=8, classes=3, seed=1))
    kw = {"task": "hetero-node-classification", "target_node_type": "paper"}
    model = make_task(ctx(g, tmp_path, num_bases=2, **kw)[0]).model
    layers = [m for m in model.modules() if isinstance(m, RGCNLayer)]
    assert [m.num_bases for m in layers] == [2, 2]
    assert all(m.comp is not None for m in layers)
    model = make_task(ctx(g, tmp_path, model="hetero-sage", **kw)[0]).model
    assert not any(isinstance(m, RGCNLayer) for m in model.modules())


def test_entry_point_gets_the_context(small, tmp_path):
    cfg = TrainConfig(task=None, entry_point="tests.train.entry:main", args=("--x", "1"))
    res = run_training(cfg, LocalData(small), DDPConfig(0, 1, "x:1"))
    assert res == {"rank": 0, "world_size": 1, "args": ["--x", "1"], "seeds": 200}


def test_profile_records_follow_the_placement_schema(small, tmp_path):
    from graphrun.placement.profile import read_records

    c, _ = ctx(small, tmp_path, profile_file=tmp_path / "prof.jsonl")
    fit(c)
    recs = read_records(tmp_path / "prof.jsonl")
    assert [r.iteration for r in recs] == [1]
    assert recs[0].compute_s > 0 and recs[0].batch_bytes > 0 and recs[0].grad_bytes > 0
    # the CPU seconds a placement on slower or shared cores scales
    assert recs[0].compute_cpu_s is not None and recs[0].compute_cpu_s > 0
    assert recs[0].sample_cpu_s is not None and recs[0].threads == torch.get_num_threads()


def test_a_non_finite_loss_fails_the_run_and_metrics_stay_json(small, tmp_path):
    """lr .inf trained to NaN and reported success; metrics.jsonl held a bare NaN."""
    from graphrun.errors import UserError

    c, _ = ctx(small, tmp_path, lr=1e30, epochs=3)
    with pytest.raises(UserError, match="the training loss became nan"):
        fit(c)
    log = MetricsLog(tmp_path / "m.jsonl", out=io.StringIO())
    log.write({"epoch": 0, "loss": float("nan"), "val_acc": float("inf")})
    assert json.loads((tmp_path / "m.jsonl").read_text()) == {
        "epoch": 0,
        "loss": None,
        "val_acc": None,
    }


def test_evaluation_modes(small, tmp_path):
    from graphrun.errors import ArgumentError
    from graphrun.train.loop import evaluate
    from graphrun.train.tasks import make_task

    c, _ = ctx(small, tmp_path, epochs=5, lr=0.01)
    rec = fit(c)
    assert rec["test_acc"] > 0.4 and rec["eval_s"] >= 0  # auto: layer-wise for GraphSAGE
    task = make_task(c)
    assert task.layerwise
    n_test = int(small.ndata["_N"]["test_mask"].sum())
    assert task.evaluate_splits(("test",), final=True)["test"].seeds == n_test
    sampled, _ = ctx(small, tmp_path, evaluation="sampled", eval_subset=150)
    task = make_task(sampled)
    assert not task.layerwise
    # before the last evaluation: whole batches until 150 seeds (batch size 200)
    assert task.evaluate_splits(("test",), final=False)["test"].seeds == min(200, n_test)
    assert task.evaluate_splits(("test",), final=True)["test"].seeds == n_test
    assert set(evaluate(task, sampled)) == {"val_acc", "test_acc"}
    with pytest.raises(ArgumentError, match="evaluation: layerwise runs GraphSAGE and GAT"):
        make_task(ctx(small, tmp_path, model="gcn", evaluation="layerwise")[0])
    with pytest.raises(ArgumentError, match="evaluation: 'nope'"):
        ctx(small, tmp_path, evaluation="nope")


def test_the_loaders_start_is_off_the_epochs_clock(small, tmp_path, monkeypatch):
    """Starting an epoch's loader (its sampler worker processes: a fork server and a store
    client each) is not the epoch's time. Here the start moves the clock 1000 s on (a
    clock only the start moves, so nothing here depends on how fast this box is): the
    epoch's ``epoch_s`` is still the steps' own."""
    import time

    from graphrun.train import tasks

    ahead, real = [0.0], time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() + ahead[0])
    start = tasks.Task.epoch_batches

    def slow_start(self, epoch):
        ahead[0] += 1000.0
        return start(self, epoch)

    monkeypatch.setattr(tasks.Task, "epoch_batches", slow_start)
    c, _ = ctx(small, tmp_path)
    fit(c)
    (rec,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert ahead[0] == 1000.0 and 0 < rec["epoch_s"] < 1000
