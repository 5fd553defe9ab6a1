"""``graphrun bench partition`` on a small generated graph: one JSON object per run."""

from __future__ import annotations

import json

import pytest

from graphrun.cli import main


@pytest.mark.integration
def test_bench_partition_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "partition", "--nodes", "2000", "--edges", "20000", "--parts", "2", "3"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["parts"] for r in rows] == [2, 3]
    for r in rows:
        for key in ("method", "edge_cut", "seconds", "peak_rss_mb", "pymetis_edge_cut"):
            assert key in r
        assert 0 < r["edge_cut"] < 1 and r["peak_rss_mb"] > 0 and r["pymetis_seconds"] >= 0
        assert r["edge_cut"] <= 1.25 * r["pymetis_edge_cut"]
        phases = ["read", "graph", "assign", "relabel", "write"]
        assert list(r["phase_peak_mb"]) == phases and list(r["phases"]) == phases
        assert r["peak_rss_mb"] >= max(r["phase_peak_mb"].values()) > 0


@pytest.mark.integration
@pytest.mark.slow
def test_bench_partition_distributed_reports_every_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "partition", "--nodes", "2000", "--edges", "20000", "--parts", "2"]
    assert main([*argv, "--mode", "distributed", "--no-pymetis"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["method"] == "xtrapulp" and row["parts"] == 2
    assert len(row["peak_rss_mb_per_rank"]) == 2 and min(row["peak_rss_mb_per_rank"]) > 0
    assert set(row["phases"]) == {"read", "graph", "assign", "relabel", "shuffle", "write"}
    assert list(row["phase_peak_mb"]) == list(row["phases"])
    assert max(row["phase_peak_mb"].values()) == max(row["peak_rss_mb_per_rank"])
    per_rank = row["phase_peak_mb_per_rank"]
    assert [max(r.values()) for r in per_rank] == row["peak_rss_mb_per_rank"]
    for name, peak in row["phase_peak_mb"].items():
        assert peak == max(r[name] for r in per_rank) > 0
    assert 0 < row["metis_edge_cut"] < 1
    assert row["cut_vs_metis"] == pytest.approx(row["edge_cut"] / row["metis_edge_cut"], 1e-3)
