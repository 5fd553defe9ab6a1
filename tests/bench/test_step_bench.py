"""``graphrun bench step`` on a small graph: every variant runs on the same batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphrun.cli import main
from graphrun.graph.format import save_dataset
from graphrun.graph.generate import GenParams, community


def test_step_bench_times_every_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = community(GenParams(nodes=2000, avg_degree=10, feat_dim=16, classes=4, seed=0))
    save_dataset(graph, tmp_path / "g")
    argv = ["bench", "step", "--dataset", str(tmp_path / "g"), "--batches", "2"]
    assert main([*argv, "--batch-size", "50", "--fanouts", "5,3", "--hidden", "16"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["step_ms"]) == {"pyg_full", "pyg_trim", "mfg_scatter", "mfg_csr"}
    assert all(len(v) == 2 and min(v) > 0 for v in out["step_ms_all"].values())
    assert out["nodes_per_hop"][0] == 50 and len(out["edges_per_hop"]) == 2
