from __future__ import annotations

import json

import pytest

from graphrun.cli import main

FIELDS = (
    "setting",
    "speedup_vs_colocation",
    "speedup_vs_random",
    "etp_to_lower_bound",
    "etp_seconds",
    "simgrid_max_rel_error",
)


@pytest.mark.slow
def test_bench_placement_prints_one_json_object_per_setting(capsys):
    argv = ["bench", "placement", "--settings", "tiny3-products", "--seeds", "2"]
    assert main([*argv, "--seconds", "0.3", "--random-samples", "3"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["setting"] for r in rows] == ["tiny3-products"]
    row = rows[0]
    for field in FIELDS:
        assert field in row
    assert row["simulated"] is True and row["seeds"] == 2
    assert row["etp_to_lower_bound"] >= 1 - 1e-9
    assert row["etp_to_optimum"] >= 1 - 1e-9
    assert row["speedup_vs_colocation"] > 0
    assert len(row["etp_to_lower_bound_per_seed"]) == 2
