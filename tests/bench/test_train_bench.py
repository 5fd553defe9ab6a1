"""`graphrun bench train`'s step breakdown, from batch records as trainers write them."""

import pytest

from graphrun.bench.train import make_partitions, step_breakdown
from graphrun.placement.profile import BatchRecord
from graphrun.testing.graphs import community_graph


def test_step_breakdown_is_the_median_over_every_trainers_records(tmp_path) -> None:
    for rank, part in ((0, 0), (1, 1)):
        lines = [
            BatchRecord(
                rank=rank, partition=part, iteration=i, sample_s=0.01 * (i + 1), fetch_s=0.02,
                compute_s=0.1, structure_bytes={0: 5}, feature_bytes={0: 3_000_000, 1: 1_000_000},
                cache_bytes=2_000_000,
            ).to_json()
            for i in range(3)
        ]  # fmt: skip
        (tmp_path / f"trainer-{rank}.jsonl").write_text("\n".join(lines) + "\n")
    got = step_breakdown(tmp_path)
    assert got["sample_ms"] == 20.0 and got["fetch_ms"] == 20.0 and got["compute_ms"] == 100.0
    # trainer 0 (partition 0) got 1 MB from partition 1; trainer 1 got 3 MB from partition 0
    assert got["remote_feature_mb"] == 2.0 and got["local_feature_mb"] == 2.0
    assert got["cache_mb"] == 2.0
    assert step_breakdown(tmp_path / "none") == {}


@pytest.mark.integration
@pytest.mark.parametrize(
    ("mode", "method"),
    [
        ("single", "metis"),
        ("parallel", "kaminpar"),
        pytest.param("distributed", "xtrapulp", marks=pytest.mark.slow),  # rank processes
    ],
)
def test_the_partitions_trained_on_come_from_the_mode_asked(tmp_path, mode, method) -> None:
    from graphrun.partition import load_partition_config

    g = community_graph(400, 4000, num_communities=4, p_in=0.9, seed=1)
    cut = make_partitions(g, tmp_path, mode)
    cfg = load_partition_config(tmp_path / "parts")
    assert cfg["method"] == method and cfg["num_parts"] == 2
    assert cut == cfg["quality"]["edge_cut"] and 0 < cut < 0.5
