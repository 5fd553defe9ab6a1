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


def test_the_disk_run_is_compared_with_the_memory_run(tmp_path) -> None:
    """``--store-features both``: the disk job's spec asks for disk features with the
    cache given, and its record says how its epoch and losses compare with memory's."""
    import argparse

    import yaml

    from graphrun.bench.train import _job_yaml, register, storage_fields
    from graphrun.job.spec import load_job

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    ns = parser.parse_args(
        ["train", "--dataset", str(tmp_path), "--store-features", "both", "--disk-cache-mb", "2.5"]
    )
    path = _job_yaml(tmp_path, ns, storage="disk")
    feats = yaml.safe_load(path.read_text())["spec"]["runtime"]["storeFeatures"]
    assert feats == {"storage": "disk", "cacheMb": 2.5}
    assert load_job(path).spec.runtime.store_features.serve_args() == [
        "--features", "disk", "--disk-cache-mb", "2.5"
    ]  # fmt: skip
    memory = {"epoch_s": 2.0, "loss_all": [1.5, 1.25]}
    disk = {"epoch_s": 2.5, "loss_all": [1.5, 1.25]}
    assert storage_fields("memory", ns, memory, None) == {"store_features": "memory"}
    assert storage_fields("disk", ns, disk, memory) == {
        "store_features": "disk", "disk_cache_mb": 2.5, "epoch_ratio_to_memory": 1.25,
        "same_losses": True,
    }  # fmt: skip


def test_time_to_accuracy_skips_the_epochs_not_evaluated() -> None:
    """``--eval-last`` leaves epochs without ``test_acc``: the run used to end in a
    KeyError after training."""
    from graphrun.bench.train import _time_to

    assert _time_to([0.5, None, None, 0.9], [1.0, 2.0, 3.0, 4.0], 0.8) == 10.0
    assert _time_to([0.5, None], [1.0, 2.0], 0.8) is None
