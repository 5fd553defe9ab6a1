"""`graphrun bench serve`: its bad arguments, and one small run end to end (its JSON's
shape; no timing is asserted)."""

from __future__ import annotations

import json

import pytest

from graphrun.cli import main


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--requests", "0"], "--requests: must be at least 1"),
        (["--seconds", "0"], "--seconds: must be at least 0.1"),
        (["--concurrency", "1,x"], "--concurrency: expected comma-separated ints"),
        (["--concurrency", "2000"], "--concurrency: at most 1024"),
        (["--modes", "fast"], "--modes: 'fast' is not sampled or full"),
        (["--fanouts", "5,0"], "--fanouts"),
        (["--dataset", "/nonexistent"], "--dataset: /nonexistent is not a dataset directory"),
    ],
)
def test_bad_arguments(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "serve", *argv]) == 2
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()
    assert says in line and out.out == ""


def test_a_dataset_directory_is_taken(tmp_path) -> None:
    """`--dataset` takes what `graphrun generate` writes (it looked for a `dataset.json`
    that no dataset has, and refused every one)."""
    import argparse

    from graphrun.bench.serve import _check, register

    assert main(["generate", "community", str(tmp_path / "g"), "--nodes", "50"]) == 0
    p = argparse.ArgumentParser().add_subparsers()
    register(p)
    args = p.choices["serve"].parse_args(["--dataset", str(tmp_path / "g")])
    _check(args)  # no ArgumentError
    assert args.dataset == tmp_path / "g"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_small_run_prints_the_runs_and_the_full_pass(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "serve", "--nodes", "600", "--requests", "20", "--seconds", "5",
            "--concurrency", "1,4", "--fanouts", "5,5"]  # fmt: skip
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["mode"], r["concurrency"]) for r in got["runs"]] == [
        ("sampled", 1), ("sampled", 4), ("full", 1), ("full", 4)
    ]  # fmt: skip
    for r in got["runs"]:
        assert r["errors"] == 0 and r["requests"] == 20
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["requests_per_s"] > 0
    assert got["nodes"] == 600 and got["full_pass_s"] > 0
    assert got["refresh_s"] > 0 and 0 < got["refresh_recomputed"] <= 600
    assert got["refresh_max_abs_diff"] <= 1e-5
    assert got["refresh_per_layer"][-1] == got["refresh_updated"] + got["refresh_recomputed"]
