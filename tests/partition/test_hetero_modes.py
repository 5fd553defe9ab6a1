"""A heterogeneous graph partitioned in every mode, from a chunked dataset whose second
chunk holds no node of the labelled type (``graphrun generate academic --chunks 2``):
the distributed mode crashed on that chunk's empty ``train_mask``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graphrun.cli import main
from graphrun.graph import Graph
from graphrun.graph.chunked import load_chunked_meta, read_chunks, save_chunked
from graphrun.graph.generate import GenParams, academic
from graphrun.partition import load_partition_config
from tests.partition.test_roundtrip import check_round_trip

MODES = {
    "metis": ["--mode", "single", "--method", "metis"],
    "random": ["--mode", "single", "--method", "random"],
    "parallel": ["--mode", "parallel", "--threads", "1"],
    "distributed": ["--mode", "distributed", "--timeout", "60"],
}


@pytest.fixture(scope="module")
def chunked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Graph, Path]:
    g = academic(GenParams(nodes=300, avg_degree=6, feat_dim=4, classes=3, seed=1))
    path = save_chunked(g, tmp_path_factory.mktemp("academic") / "chunks", 2)
    # the case that crashed: a chunk without a single row of the labelled type
    meta = load_chunked_meta(path)
    assert len(read_chunks(meta, [1]).ndata["paper"]["train_mask"]) == 0
    return g, path


@pytest.mark.parametrize(
    "mode",
    [
        "metis",
        "random",
        "parallel",
        pytest.param("distributed", marks=pytest.mark.integration),
    ],
)
def test_a_heterograph_partitions_in_every_mode(
    chunked: tuple[Graph, Path], tmp_path: Path, mode: str
) -> None:
    g, chunks = chunked
    out = tmp_path / "parts"
    args = ["partition", str(chunks), str(out), "--parts", "2", "--balance-train"]
    assert main([*args, *MODES[mode]]) == 0
    # every node owned once, per-type contiguous ranges, every edge once, every feature,
    # label and mask with its owner
    check_round_trip(g, out, 2, 1)
    cfg = load_partition_config(out)
    assert cfg["node_types"] == list(g.node_types)
    assert cfg["node_features"]["paper"]["train_mask"]["shape"] == [150]
    # both parts hold training nodes (--balance-train)
    book_train = [int(np.asarray(t).sum()) for t in _train_per_part(out)]
    assert all(n > 0 for n in book_train), book_train


def _train_per_part(out: Path) -> list[np.ndarray]:
    from graphrun.partition import load_partition

    return [load_partition(out, p).node_feats["paper"]["train_mask"] for p in range(2)]
