import json

import pytest

from graphrun.cli import main


def test_bench_sampling_prints_json(capsys) -> None:
    rc = main(
        [
            "bench",
            "sampling",
            "--nodes",
            "500",
            "--avg-degree",
            "6",
            "--batch-size",
            "50",
            "--batches",
            "2",
            "--no-dist",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["local_sampled_edges_per_s"] > 0 and out["local_minibatches_per_s"] > 0
    assert "pyg_sampled_edges_per_s" in out and out["dist_sampled_edges_per_s"] is None


def test_bench_sampling_bad_fanouts(capsys) -> None:
    assert main(["bench", "sampling", "--fanouts", "5,x", "--no-dist"]) == 2
    assert "--fanouts" in capsys.readouterr().err


@pytest.mark.integration
def test_bench_sampling_compares_pyg_loader_on_the_store(capsys) -> None:
    args = ["--nodes", "600", "--avg-degree", "6", "--batch-size", "50", "--batches", "6"]
    assert main(["bench", "sampling", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dist_minibatches_per_s"] > 0 and out["pyg_remote_minibatches_per_s"] > 0
    assert "pyg_remote_slowdown" in out
