"""``graphrun bench cost``: the fit recovers known coefficients, bad rows are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphrun.cli import main

MIB = 2**20
# bytes and CPU seconds per node, edge and feature byte, and each host's constant
MEMORY = {"node": 120.0, "edge": 24.0, "feature": 1.5, "constant": 300 * MIB}
CPU = {"node": 2e-6, "edge": 5e-7, "feature": 1e-8, "constant": 4.0}
GRAPHS = [(2_000_000, 80_000_000, 100), (4_000_000, 160_000_000, 100),
          (4_000_000, 40_000_000, 128), (4_000_000, 40_000_000, 16)]  # fmt: skip


def cost(coef: dict[str, float], nodes: float, edges: float, dim: int, hosts: int) -> float:
    share = {"node": nodes / hosts, "edge": edges / hosts, "feature": 4 * dim * nodes / hosts}
    return coef["constant"] + sum(coef[t] * share[t] for t in share)


def row(stage: str, nodes: int, edges: int, dim: int, hosts: int) -> dict[str, object]:
    return {
        "stage": stage, "nodes": nodes, "edges": edges, "feat_dim": dim, "hosts": hosts,
        "peak_mb": cost(MEMORY, nodes, edges, dim, hosts) / MIB,
        "cpu_s": cost(CPU, nodes, edges, dim, hosts) * hosts, "wall_s": 1.0,
    }  # fmt: skip


def write_rows(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_cost(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict]:
    assert main(["bench", "cost", *argv]) == 0
    return [json.loads(x) for x in capsys.readouterr().out.splitlines()]


def test_the_fit_is_exact_on_rows_of_a_known_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [row("serve", n, e, d, h) for (n, e, d), h in zip(GRAPHS, (2, 2, 8, 2), strict=True)]
    rows += [row("generate", n, e, d, 1) for n, e, d in GRAPHS]
    path = write_rows(tmp_path / "rows.jsonl", rows)
    serve, generate = run_cost(capsys, str(path), "--nodes", "1e8", "--edges", "1.5e9",
                               "--feat-dim", "128", "--hosts", "8", "16")  # fmt: skip
    assert serve["memory"] == {
        "bytes_per_node": 120.0, "bytes_per_edge": 24.0, "bytes_per_feature_byte": 1.5,
        "constant_mib": 300.0,
    }  # fmt: skip
    assert serve["cpu"] == {"us_per_node": 2.0, "us_per_edge": 0.5,
                            "us_per_feature_byte": 0.01, "constant_s": 4.0}  # fmt: skip
    assert serve["max_rel_residual"]["memory"] < 1e-9
    for got, hosts in zip(serve["projection"], (8, 16), strict=True):
        assert got["hosts"] == hosts and got["edges_per_host"] == round(1.5e9 / hosts)
        want = cost(MEMORY, 1e8, 1.5e9, 128, hosts) / 2**30
        assert got["peak_gib"] == pytest.approx(want, abs=0.006)
        assert got["cpu_s"] == pytest.approx(cost(CPU, 1e8, 1.5e9, 128, hosts), abs=0.06)
    # a stage measured on one host only runs on one: projected there, whatever --hosts
    assert [p["hosts"] for p in generate["projection"]] == [1]
    assert generate["projection"][0]["peak_gib"] == pytest.approx(
        cost(MEMORY, 1e8, 1.5e9, 128, 1) / 2**30, abs=0.006
    )


def test_fewer_terms_fit_rows_that_cannot_tell_four_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two sizes of one shape (same degree and width) fix an edge term and a constant
    only; with all four terms the command names the stage and stops."""
    path = write_rows(tmp_path / "rows.jsonl", [row("train", *GRAPHS[0], 2),
                                                row("train", *GRAPHS[1], 2)])  # fmt: skip
    assert main(["bench", "cost", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert str(path) in line and "stage 'train'" in line and "rank 2 of 4" in line
    (train,) = run_cost(capsys, str(path), "--terms", "edge,constant")
    # the node and feature terms are folded into the per-edge bytes at degree 40
    per_edge = MEMORY["edge"] + (MEMORY["node"] + 400 * MEMORY["feature"]) / 40
    assert train["memory"]["bytes_per_edge"] == pytest.approx(per_edge, abs=0.01)
    assert train["memory"]["constant_mib"] == 300.0


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "rows.jsonl: no rows"),
        ('{"stage": "x"', "rows.jsonl:1: not JSON"),
        ('{"stage": "x", "nodes": 5, "edges": 1, "feat_dim": 1, "hosts": 1, "cpu_s": 1}',
         "rows.jsonl:1: peak_mb: missing"),
        ('{"stage": "x", "nodes": 0, "edges": 1, "feat_dim": 1, "hosts": 1, "peak_mb": 1, '
         '"cpu_s": 1}', "rows.jsonl:1: nodes: Expected `int` >= 1"),
        ('{"stage": "x", "nodes": 5, "edges": 1, "feat_dim": 1, "hosts": 1, "peak_mb": '
         '"a lot", "cpu_s": 1}', "rows.jsonl:1: peak_mb: Expected `float`"),
        ("[1, 2]", "rows.jsonl:1: Expected `object`"),
        ('{"stage": "x", "nodes": 5, "edges": 1, "feat_dim": 1, "hosts": 1, "peak_mb": '
         'Infinity, "cpu_s": 1}', "rows.jsonl:1: peak_mb: Expected `float` <= "),
    ],
)  # fmt: skip
def test_a_bad_row_is_one_line_naming_the_file_and_field(
    text: str, match: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(text + "\n")
    assert main(["bench", "cost", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert match in line


def test_a_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "cost", str(tmp_path / "gone.jsonl")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "gone.jsonl: cannot read" in line


def test_the_recorded_rows_fit_as_benchmarks_readme_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``benchmarks/cost-rows.jsonl`` stays readable, and the fit that
    benchmarks/README.md projects papers100M from misses no row by 7.5% in memory."""
    rows = Path(__file__).parents[2] / "benchmarks" / "cost-rows.jsonl"
    fits = run_cost(capsys, str(rows), "--terms", "edge,feature,constant")
    assert [f["stage"] for f in fits] == ["generate", "partition-parallel",
                                          "partition-distributed", "serve", "train-epoch",
                                          "evaluate", "partition-parallel-unchunked"]  # fmt: skip
    assert all(f["rows"] == 4 and f["max_rel_residual"]["memory"] < 0.075 for f in fits)
    assert [p["hosts"] for p in fits[2]["projection"]] == [8, 16]
