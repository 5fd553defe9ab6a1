"""``graphrun bench generate`` and ``graphrun bench sage-vs-mlp`` at tiny sizes."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from graphrun.cli import main


def test_generate_bench_reports_time_memory_and_size(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["bench", "generate", "--sizes", "2000:4", "--feat-dim", "8"]) == 0
    assert list(tmp_path.iterdir()) == []  # its default work directory is gone with it
    out = json.loads(capsys.readouterr().out)
    assert (out["bench"], out["nodes"], out["feat_dim"]) == ("generate", 2000, 8)
    assert out["edges"] > 0 and out["dataset_mb"] >= 0 and out["peak_rss_mb"] > 0


def test_sage_vs_mlp_bench_trains_both(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "sage-vs-mlp", "--nodes", "500", "--epochs", "3", "--hidden", "16"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nodes"] == 500 and 0 <= out["mlp_test"] <= 1 and 0 <= out["sage_test"] <= 1
    assert out["gap_points"] == pytest.approx(100 * (out["sage_test"] - out["mlp_test"]), abs=0.1)
