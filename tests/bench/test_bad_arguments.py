"""Every ``graphrun bench`` rejects bad numbers with one line and exit 2, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphrun.cli import main

DISTDGL = ["train", "--dataset", "{file}", "--peer", "distdgl", "--hosts", "netns"]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["partition", "--nodes", "0", "--edges", "0"], "--nodes: must be at least 2, got 0"),
        (["generate", "--sizes", "5000"], "--sizes: '5000' is not NODES:AVG_DEGREE"),
        (["partition", "--parts", "2", "0"], "--parts: must be at least 1, got 0"),
        (["partition", "--workdir", "{file}"], "--workdir"),
        (["sampling", "--batch-size", "0"], "--batch-size: must be at least 1"),
        (["sampling", "--batches", "0"], "--batches: must be at least 1"),
        (["sampling", "--fanouts", "5,-1"], "--fanouts"),
        (["kv", "--rows", "0"], "--rows: must be at least 1"),
        (["kv", "--dim", "-1"], "--dim: must be at least 1"),
        (["kv", "--batches", "1,x"], "--batches: expected comma-separated ints"),
        (["step", "--dataset", "{file}", "--batches", "0"], "--batches: 0 is not in [1, "),
        (["step", "--dataset", "{file}", "--fanouts", "x"], "--fanouts"),
        (["step", "--dataset", "{file}"], "a-file"),
        (["train", "--dataset", "{file}", "--peer", "distdgl"], "--peer distdgl: needs --hosts"),
        (DISTDGL, "--peer-python: the DistDGL peer needs a Python with dgl"),
        ([*DISTDGL, "--peer-python", "{file}"], "is not an executable file"),
        (["live", "--batch", "0"], "--batch: must be at least 1, got 0"),
        (["live", "--batch", "2000000"], "--batch: at most 1048576 edges per commit"),
        (["live", "--window", "0"], "--window: must be at least 1, got 0"),
        (["live", "--window", "17"], "--window: at most 16 batches in flight"),
        (["live", "--epoch-window", "0"], "--epoch-window: must be at least 1, got 0"),
        (["live", "--epoch-window", "17"], "--epoch-window: at most 16 batches in flight"),
        (["live", "--rate", "0"], "--rate: must be at least 1"),
        (["live", "--epoch-pairs", "0"], "--epoch-pairs: must be at least 1, got 0"),
        (["live", "--epoch-pairs", "51"], "--epoch-pairs: at most 50, got 51"),
        (["live", "--threads", "-1"], "--threads: must be at least 0, got -1"),
        (["live", "--threads", "2000"], "--threads: at most 1024, got 2000"),
        (["live", "--fanouts", "x"], "--fanouts"),
        (["live", "--dataset", "{file}"], "is not a dataset directory"),
        (["live", "--lose", "m1"], "--lose: a machine is lost only with --replicas 2"),
        (["elastic", "--kill-epoch", "0"], "--kill-epoch: 0 is not in [1, "),
        (["elastic", "--kill-epoch", "10"], "--kill-epoch: 10 is not in [1, 10)"),
        (["elastic", "--epochs", "3", "--kill-epoch", "3"], "--kill-epoch: 3 is not in [1, 3)"),
        (["elastic", "--batch-size", "0"], "--batch-size: 0 is not in [1, "),
        (["elastic", "--nodes", "10"], "--nodes: 10 is not in [1000, "),
        (["elastic", "--dataset", "{file}"], "is not a directory"),
        (["elastic", "--fault", "cut", "--hosts", "local"], "--fault cut: needs --hosts netns"),
        (["elastic", "--timeout-seconds", "0"], "--timeout-seconds: 0 is not in (0, 3600]"),
        (["cost", "{file}", "--hosts", "8", "0"], "--hosts: expected 1..65536 each"),
        (["cost", "{file}", "--terms", "node,vertex"], "--terms: expected distinct names"),
        (["cost", "{file}", "--nodes", "0"], "--nodes: expected 1..2^48"),
    ],
)
def test_bad_arguments(
    argv: list[str], match: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "a-file"
    file.write_text("")
    assert main(["bench", *[a.replace("{file}", str(file)) for a in argv]]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert match in line
