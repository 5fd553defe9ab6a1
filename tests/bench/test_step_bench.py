"""``graphrun bench step`` on a small graph: every variant runs on the same batches."""

from __future__ import annotations

import json
from collections.abc import Iterator
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


def test_the_fetch_is_timed_with_the_earlier_batches_dropped() -> None:
    """As in training, a timed batch is gone before the one after the next is built (kept,
    each fetch wrote fresh pages: 3.7x the CPU); then the same number of batches is kept."""
    import weakref
    from types import SimpleNamespace

    from graphrun.bench import step

    class Rows:  # a batch's tensors
        pass

    alive: weakref.WeakSet[Rows] = weakref.WeakSet()
    most: list[int] = []

    class Data:
        def loader(self, *args: object) -> Iterator[SimpleNamespace]:
            while True:
                rows = Rows()  # built while the loader still holds the one before
                alive.add(rows)
                most.append(len(alive))
                yield SimpleNamespace(data=rows, cost=SimpleNamespace(sample_s=0.0))

    batches, costs = step._batches(Data(), [2], 10, 6)
    assert len(batches) == len(costs) == 6
    assert max(most[:6]) <= 2, most


def test_step_bench_prints_the_roofline_of_each_phase(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphrun.bench import roofline

    monkeypatch.setattr(roofline, "MATMUL_SHAPES", ((64, 64, 64),))  # small peaks: a test
    monkeypatch.setattr(roofline, "STREAM_MB", 8)
    graph = community(GenParams(nodes=2000, avg_degree=10, feat_dim=16, classes=4, seed=0))
    save_dataset(graph, tmp_path / "g")
    argv = ["bench", "step", "--dataset", str(tmp_path / "g"), "--batches", "2"]
    argv += ["--batch-size", "50", "--fanouts", "5,3", "--hidden", "16", "--precision", "fp32"]
    assert main([*argv, "--no-allreduce"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["phase"]: r for r in out["phases"]}
    assert list(rows) == [
        "sample", "fetch", "aggregate[0]", "dense[0]", "aggregate[1]", "aggregate_grad[1]",
        "dense[1]", "backward", "optimizer",
    ]  # fmt: skip
    assert all(r["ms"] > 0 for r in rows.values())
    nodes, edges = out["nodes_per_hop"], out["edges_per_hop"]
    # layer 0 computes the seeds and hop 1 from the edges of hops 1 and 2 (16 -> 16)
    n_dst, nnz = nodes[0] + nodes[1], edges[0] + edges[1]
    assert rows["dense[0]"]["gflop"] == round(2 * n_dst * 2 * 16 * 16 / 1e9, 4)
    assert rows["aggregate[0]"]["gflop"] == round(2 * nnz * 16 / 1e9, 4)
    assert rows["aggregate[0]"]["gathered_mb"] == round(4 * 16 * nnz / 1e6, 3)
    assert rows["sample"]["items"] == sum(edges) and rows["sample"]["items_per_s"] > 0
    assert out["precision"] == "fp32" and out["peak"]["fp32_gflops"] > 0
    assert out["peak"]["read_gbps"] > 0 and out["peak"]["copy_gbps"] > 0
    assert out["peak"]["gather_gbps"] > 0
    for name in ("aggregate[0]", "aggregate[1]", "aggregate_grad[1]"):
        assert rows[name]["of_peak"] > 0 and rows[name]["of_gather_peak"] > 0, name
    # the mean's backward: the fp32 gradient of layer 1's 16-wide input rows written once
    grad = rows["aggregate_grad[1]"]
    assert grad["gathered_mb"] == round(2 * 4 * 16 * edges[0] / 1e6, 3)
    for name in ("aggregate[0]", "dense[0]", "backward"):
        assert rows[name]["of_peak"] > 0, name
    assert rows["optimizer"]["of_peak"] is not None and rows["fetch"]["of_peak"] is not None


def test_a_bf16_roofline_fetches_and_counts_its_rows_in_bf16(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In bf16 the roofline's batches come as a bf16 trainer's do: ``fetch`` moves two
    bytes a feature (and the int64 labels), and layer 0's mean reads bf16 rows."""
    from graphrun.bench import roofline

    monkeypatch.setattr(roofline, "MATMUL_SHAPES", ((64, 64, 64),))
    monkeypatch.setattr(roofline, "STREAM_MB", 8)
    graph = community(GenParams(nodes=2000, avg_degree=10, feat_dim=16, classes=4, seed=0))
    save_dataset(graph, tmp_path / "g")
    argv = ["bench", "step", "--dataset", str(tmp_path / "g"), "--batches", "2", "--no-allreduce"]
    argv += ["--batch-size", "50", "--fanouts", "5,3", "--hidden", "16", "--precision", "bf16"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["phase"]: r for r in out["phases"]}
    nodes, edges = sum(out["nodes_per_hop"]), out["edges_per_hop"]
    assert out["precision"] == "bf16"
    assert rows["fetch"]["mb"] == round((2 * 16 + 8) * nodes / 1e6, 3)
    assert rows["aggregate[0]"]["gathered_mb"] == round(2 * 16 * (edges[0] + edges[1]) / 1e6, 3)


@pytest.mark.integration
def test_the_allreduce_phase_is_two_gloo_processes() -> None:
    from graphrun.bench.roofline import allreduce_phase
    from graphrun.testing.procs import torch_processes

    phase = allreduce_phase(1000, repeats=3, processes=torch_processes())  # forked, not spawned
    assert phase.name == "allreduce" and phase.seconds > 0 and phase.bytes == 8000


def test_step_bench_with_too_few_batches_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = community(GenParams(nodes=2000, avg_degree=10, feat_dim=16, classes=4, seed=0))
    save_dataset(graph, tmp_path / "g")
    argv = ["bench", "step", "--dataset", str(tmp_path / "g"), "--batches", "50"]
    assert main([*argv, "--batch-size", "500"]) == 2  # it was a traceback (an empty median)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--batches: the training split makes" in line


def test_a_mean_must_move_each_row_it_reads_once_in_either_precision() -> None:
    """``mb`` of an aggregation: the distinct source rows read once in the dtype the layer
    is handed, the CSR, the means in theirs. A bf16 layer's cast of its fp32 rows is not
    counted (it was: 6 bytes a feature more, a bf16 mean looked 1.8x the rate of an fp32
    one of the same time)."""
    import torch

    from graphrun.bench.roofline import LayerInput, mean_bytes

    x = torch.randn(10, 8)  # rows 7..9 read by no edge
    ei = torch.tensor([[3, 4, 3, 5, 6, 3], [0, 0, 1, 1, 2, 2]])
    li = LayerInput(x, ei, 3)
    csr = 8 * 6 + 8 * 4
    assert mean_bytes(li, torch.float32) == 4 * 8 * 4 + 4 * 8 * 3 + csr
    assert mean_bytes(li, torch.bfloat16) == 4 * 8 * 4 + 2 * 8 * 3 + csr
    handed_bf16 = LayerInput(x.bfloat16(), ei, 3)  # rows fetched in bf16: half the bytes
    assert mean_bytes(handed_bf16, torch.bfloat16) == 2 * 8 * 4 + 2 * 8 * 3 + csr
