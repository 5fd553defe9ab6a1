"""The group a training loop asks: fixed, or elastic (its re-form runs in tests/local)."""

from __future__ import annotations

import io
import json
from dataclasses import replace

from graphrun.graph.generate import GenParams, community
from graphrun.train.config import ElasticConfig, Fanouts, TrainConfig
from graphrun.train.context import TrainContext
from graphrun.train.data import LocalData
from graphrun.train.ddp import DDPConfig
from graphrun.train.elastic import Regroup
from graphrun.train.loop import fit
from graphrun.train.membership import ElasticMembership, Membership, membership
from graphrun.train.metrics import MetricsLog


def _ctx(tmp_path, world: int = 1, elastic: bool = False) -> TrainContext:
    graph = community(GenParams(nodes=600, avg_degree=6, feat_dim=8, classes=3, seed=0))
    cfg = TrainConfig(epochs=2, batch_size=100, fanouts=Fanouts((4, 4)), hidden=16,
                      machines=tuple(f"m{i}" for i in range(world)))  # fmt: skip
    ddp = DDPConfig(0, world, "x:1")
    reg = Regroup(ddp, ElasticConfig(min_machines=1), cfg.machines) if elastic else None
    metrics = MetricsLog(tmp_path / "metrics.jsonl", out=io.StringIO())
    return TrainContext(cfg, LocalData(graph), ddp, metrics, elastic=reg)


def test_a_fixed_group_runs_each_try_once_and_its_records_say_nothing_of_membership(tmp_path):
    ctx = _ctx(tmp_path)
    group = membership(ctx)
    assert type(group) is Membership and not group.joining
    seen = []

    def attempt(c, *, timer, at, work, rest):
        seen.append((c, work, rest))
        return {"steps": 1}

    assert group.train(0, attempt, None, admit=True) == {"steps": 1}
    assert len(seen) == 1 and seen[0][0] is ctx and seen[0][1].done == 0 and seen[0][2] is None
    assert group.fields() == {} and group.machines() == ("m0",)
    fit(ctx)
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1]
    assert not {"world_sizes", "reforms", "rejoins"} & {k for r in records for k in r}


def test_an_elastic_group_records_its_size_where_it_changes(tmp_path):
    ctx = _ctx(tmp_path, world=3, elastic=True)
    group = membership(ctx)
    assert isinstance(group, ElasticMembership)
    assert group.machines() == ("m0", "m1", "m2")
    group._note_world(0)
    group._note_world(5)  # the same size: nothing new
    assert group.fields() == {"world_sizes": [[0, 3]]}
    group.ctx = replace(ctx, ddp=DDPConfig(0, 2, "x:1"))
    group._note_world(5)
    assert group.fields() == {"world_sizes": [[0, 3], [5, 2]]}
    group.ctx = replace(ctx, ddp=DDPConfig(0, 1, "x:1"))
    group._note_world(5)  # the try at 2 failed before its first step: replaced
    assert group.fields() == {"world_sizes": [[0, 3], [5, 1]]}
    group.reforms.append({"event": "reformed"})
    assert group.fields()["reforms"] == [{"event": "reformed"}]
    assert "rejoins" not in group.fields()
