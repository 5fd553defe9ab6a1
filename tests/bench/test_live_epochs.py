"""The training epochs of ``graphrun bench live``: their order and what is reported."""

from __future__ import annotations

import threading

from graphrun.bench.live_epochs import LEAD_S, lead, order, summary


def test_the_epochs_alternate_so_that_each_kind_runs_first_as_often():
    assert order(1) == "UI"
    assert order(3) == "UIIUUI"
    kinds = order(4)
    assert kinds.count("U") == kinds.count("I") == 4
    # each kind's mean position is the same: a drift over the run weighs on both alike
    pos = {k: sum(i for i, x in enumerate(kinds) if x == k) for k in "UI"}
    assert pos["U"] == pos["I"]


def test_the_summary_reports_medians_every_epoch_and_the_cpu_of_each_process():
    def run(wall: float, compactions: int = 0, nodes: float = 100.0) -> dict[str, float]:
        return {"wall_s": wall, "trainer": wall * 1.5, "servers": 0.5, "writer": 0.0,
                "compactions": compactions, "nodes": nodes, "edges": 2 * nodes}  # fmt: skip

    runs = {"U": [run(3.0), run(9.0), run(3.2, nodes=120.04)],
            "I": [run(3.3, 2), run(3.5, nodes=110.0), run(3.4, nodes=130.0)]}  # fmt: skip
    out = summary(runs, 100_000.0, 101_000.0, 2)
    # one slow epoch (another process took the box) does not move the median
    assert out["epoch_s_undisturbed"] == 3.2 and out["epoch_s_ingesting"] == 3.4
    assert out["epochs_s"] == {"undisturbed": [3.0, 9.0, 3.2], "ingesting": [3.3, 3.5, 3.4]}
    assert out["epoch_pairs"] == 3
    assert out["epoch_cpu_s"]["undisturbed"] == {"trainer": 4.8, "servers": 0.5, "writer": 0.0}
    assert out["epochs_cpu_s"]["ingesting"][1] == [5.25, 0.5, 0.0]
    assert out["compactions_in_epochs"] == {"undisturbed": 0, "ingesting": 2}
    # the batches' size an epoch: the work its model step did, which grows with the graph
    assert out["epochs_batch"]["undisturbed"][2] == [120.0, 240.1]
    assert out["epoch_batch"] == {"undisturbed": {"nodes": 100.0, "edges": 200.0},
                                  "ingesting": {"nodes": 110.0, "edges": 220.0}}  # fmt: skip
    assert out["trainer_threads"] == 2
    assert out["ingest_rate_reached_edges_per_s"] == 101_000.0
    # each pair's ratio (the k-th of each kind ran next to each other) and their median
    assert out["epoch_pair_ratios"] == [0.1, -0.6111, 0.0625]
    assert out["epoch_pair_ratio_median"] == 0.0625


def test_every_epoch_starts_after_the_same_pause_an_ingesting_one_with_its_ingest_going():
    waits: list[float] = []
    for kind, going in (("U", False), ("I", True)):
        go = threading.Event()
        lead(kind, go, waits.append)
        assert go.is_set() == going
    # an undisturbed epoch after an ingesting one does not start while its servers
    # still index that ingest's last commits
    assert waits == [LEAD_S, LEAD_S]
