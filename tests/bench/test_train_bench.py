"""`graphrun bench train`'s step breakdown, from batch records as trainers write them."""

from graphrun.bench.train import step_breakdown
from graphrun.placement.profile import BatchRecord


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
