"""The trainer's config is the spec's training section: defaults defined once, every
shared field copied (issue 41, item 5)."""

from __future__ import annotations

import dataclasses

import pytest

from graphrun.errors import ArgumentError, SpecError
from graphrun.job.spec import TrainingSpec, load_job, parse_job
from graphrun.machine.trainer import SPEC_FIELDS, parse_args, train_config
from graphrun.testing.jobs import small_job
from graphrun.train.config import DEFAULTS, Fanouts, TrainConfig
from graphrun.train.names import MODELS, TASKS


def test_the_spec_and_the_trainer_have_one_default_for_every_shared_field():
    spec = TrainingSpec(task="node-classification")
    shared = [f.name for f in dataclasses.fields(TrainConfig) if f.name in spec.model_fields]
    assert set(SPEC_FIELDS) <= set(shared) and len(SPEC_FIELDS) >= 24
    for name in shared:
        if name in ("task", "entry_point", "args", "checkpoint_dir"):
            continue  # the spec's own: a task or an entry point; a path of the run
        mine = getattr(DEFAULTS, name)
        theirs = getattr(spec, name)
        assert (Fanouts.of(theirs) if name == "fanouts" else theirs) == mine, name


def test_the_task_list_is_spelled_once():
    assert set(MODELS) == set(TASKS)
    assert set(TrainingSpec.model_json_schema()["properties"]["task"]["anyOf"][0]["enum"]) == set(
        TASKS
    )


def test_every_training_field_reaches_the_trainer(tmp_path):
    given = {
        "model": "gcn", "epochs": 3, "batchSize": 77, "hidden": 24, "lr": 0.02,
        "dropout": 0.25, "weightDecay": 0.001, "negativeSamples": 3, "embeddingDim": 8,
        "sparseLr": 0.2, "targetNodeType": "paper", "feature": "x", "label": "y",
        "evalEvery": 2, "evaluation": "sampled", "evalSubset": 50, "seed": 7,
        "precision": "fp32", "edgesPerEpoch": 900, "valEdges": 0.1, "testEdges": 0.2,
        "evalNegatives": 9, "fanouts": [4, 3],
    }  # fmt: skip
    path = small_job(tmp_path, nodes=200, **given)
    job = load_job(path)
    args = parse_args(["--job", str(path), "--rank", "0", "--hosts-file", "h", "--keys", "k"])
    cfg = train_config(job, args, tmp_path / "run", tmp_path / "ckpt")
    for name in SPEC_FIELDS:
        assert getattr(cfg, name) == getattr(job.spec.training, name), name
    assert cfg.batch_size == 77 and cfg.fanouts == Fanouts((4, 3)) and cfg.seed == 7
    assert cfg.task == "node-classification" and cfg.entry_point is None


def test_the_fanouts_are_one_value_made_and_checked_when_the_spec_is_read():
    spec = TrainingSpec(
        task="hetero-node-classification",
        fanouts=[5, -1],
        fanouts_per_etype={"author:writes:paper": [3, 2]},
    )
    fan = spec.normalized_fanouts
    assert fan == Fanouts((5, -1), (("author:writes:paper", (3, 2)),)) and len(fan) == 2
    types = [("author", "writes", "paper"), ("paper", "cites", "paper")]
    assert fan.for_graph(types) == [
        {"author:writes:paper": 3, "paper:cites:paper": 5},
        {"author:writes:paper": 2, "paper:cites:paper": -1},
    ]
    assert Fanouts((4, 2)).for_graph(types) == [4, 2]
    with pytest.raises(ArgumentError, match="fanoutsPerEtype: the graph has no edge type"):
        fan.for_graph([("paper", "cites", "paper")])
    with pytest.raises(ArgumentError, match="fanouts: empty"):
        Fanouts(())
    bad = {"task": "node-classification", "fanouts": [5, 5], "fanoutsPerEtype": {"a:b:c": [1]}}
    doc = {
        "apiVersion": "graphrun.io/v1alpha1", "kind": "GraphJob", "metadata": {"name": "x"},
        "spec": {"graph": {"dataset": "d"}, "partition": {"parts": 1, "output": "p"},
                 "runtime": {"machines": 1}, "training": bad},
    }  # fmt: skip
    with pytest.raises(SpecError, match=r"fanoutsPerEtype\.a:b:c: has 1 layers, fanouts has 2"):
        parse_job(doc)
