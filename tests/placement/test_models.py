from __future__ import annotations

import json
from importlib import resources

import pytest
import yaml

from graphrun.errors import SpecError
from graphrun.placement.cluster import GBPS, load_cluster
from graphrun.placement.job import load_job
from graphrun.placement.profile import (
    QUANTITIES,
    BatchRecord,
    builtin_profile,
    load_profile,
    profile_from_records,
    read_metrics,
    read_records,
    save_profile,
)


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def machine(name="m0", **kw):
    return {"name": name, "cpu": 8, "memory_gb": 64, "gpus": 1, **kw}


def test_cluster_loads_bandwidths_in_bytes_per_second(tmp_path):
    path = write(
        tmp_path,
        "c.yaml",
        {
            "kind": "Cluster",
            "machines": [
                machine("a", bandwidth_gbps=50),
                machine("b", egress_gbps=10, ingress_gbps=25),
            ],
        },
    )
    c = load_cluster(path)
    assert c.names == ("a", "b")
    assert c.egress == (50 * GBPS, 10 * GBPS)
    assert c.ingress == (50 * GBPS, 25 * GBPS)


@pytest.mark.parametrize(
    ("machines", "field"),
    [
        ([machine(egress_gbps=10)], r"machines\[0\]\.ingress_gbps: missing"),
        ([machine(bandwidth_gbps=10, cpu=-1)], r"machines\.0\.cpu"),
        ([machine(bandwidth_gbps=10, memory_gb=-5)], r"machines\.0\.memory_gb"),
        ([machine(bandwidth_gbps=0)], r"machines\.0\.bandwidth_gbps"),
        ([machine(bandwidth_gbps=1), machine(bandwidth_gbps=1)], r"machines\[1\]\.name"),
        ([machine(bandwidth_gbps=1, disk=3)], r"machines\.0\.disk"),
        ([], "machines"),
    ],
)
def test_bad_cluster_names_the_field(tmp_path, machines, field):
    path = write(tmp_path, "c.yaml", {"kind": "Cluster", "machines": machines})
    with pytest.raises(SpecError, match=field) as exc:
        load_cluster(path)
    assert "\n" not in str(exc.value) and str(path) in str(exc.value)


def test_job_loads_tasks_in_role_order(tmp_path):
    path = write(
        tmp_path,
        "j.yaml",
        {"kind": "PlacementJob", "partitions": 2, "trainers": 2, "samplers_per_trainer": 1},
    )
    job = load_job(path)
    assert tuple(map(str, job.roles)) == (
        "store:0",
        "store:1",
        "trainer:0",
        "trainer:1",
        "sampler:0:0",
        "sampler:1:0",
        "ps:0",
    )
    assert job.profile.name == "products"


def test_job_profile_path_is_relative_to_the_job_file(tmp_path):
    save_profile(builtin_profile("papers100m"), tmp_path / "mine.json")
    path = write(tmp_path, "j.yaml", {"partitions": 1, "trainers": 1, "profile": "mine.json"})
    assert load_job(path).profile.name == "papers100m"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"partitions": 0, "trainers": 1}, "partitions"),
        ({"partitions": 1, "trainers": 1, "sync": "gossip"}, "sync"),
        ({"partitions": 1, "trainers": 1, "parameter_servers": 0}, "parameter_servers"),
        (
            {"partitions": 1, "trainers": 1, "demands": {"store": {"cpu": -1}}},
            r"demands\.store\.cpu",
        ),
        ({"partitions": 1, "trainers": 1, "profile": "nope.json"}, "profile"),
    ],
)
def test_bad_job_names_the_field(tmp_path, data, field):
    with pytest.raises(SpecError, match=field):
        load_job(write(tmp_path, "j.yaml", data))


def test_builtin_profiles_have_every_quantity():
    for name in ("products", "papers100m"):
        prof = builtin_profile(name)
        assert set(prof.quantities) == set(QUANTITIES)
        assert prof["feature_own"].mean > prof["feature_other"].mean > 0


def test_profile_file_round_trip(tmp_path):
    prof = builtin_profile("products")
    save_profile(prof, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == prof
    bad = json.loads((tmp_path / "p.json").read_text())
    del bad["quantities"]["compute_s"]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(SpecError, match=r"quantities\.compute_s"):
        load_profile(tmp_path / "bad.json")


def test_profile_from_runtime_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = []
    for it in range(20):
        for rank in range(2):
            rec = BatchRecord(
                rank=rank,
                partition=rank,
                iteration=it,
                sample_s=0.01 * (1 + rank),
                fetch_s=0.002,
                compute_s=0.02,
                structure_bytes={0: 100, 1: 40},
                feature_bytes={rank: 1000, 1 - rank: 300},
                batch_bytes=500,
                grad_bytes=64,
            )
            lines.append(rec.to_json())
        lines.append(json.dumps({"kind": "epoch", "loss": 0.5}))
    path.write_text("\n".join(lines) + "\n")
    records = read_records(path)
    assert len(records) == 40 and records[1].rank == 1
    prof = profile_from_records(records, "run")
    assert set(prof["feature_own"].values) == {1000.0}
    assert set(prof["feature_other"].values) == {300.0}
    assert prof["sample_s"].mean == pytest.approx(0.015)
    assert set(prof["structure_own"].values) == {100.0, 40.0}


def test_bad_records_name_the_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"kind": "batch", "v": 1, "rank": 0}\n')
    with pytest.raises(SpecError, match=r"m\.jsonl:1: partition: missing"):
        read_records(path)
    path.write_text("not json\n")
    with pytest.raises(SpecError, match=r"m\.jsonl:1: not valid JSON"):
        read_records(path)


def test_records_and_profiles_written_before_the_structs_still_read(tmp_path):
    """The batch record became a msgspec Struct (its BatchCost first): a line as the
    hand-written ``to_json`` wrote it (``v`` second, ``cache_bytes`` late) reads the same,
    and a shipped profile saves to the very bytes it was read from."""
    old = (
        '{"kind":"batch","v":1,"rank":1,"partition":1,"iteration":3,"sample_s":0.5,'
        '"fetch_s":0.25,"compute_s":0.125,"structure_bytes":{"0":7,"1":2},'
        '"feature_bytes":{"0":40},"batch_bytes":9,"grad_bytes":8,"cache_bytes":5,"threads":2}\n'
        '{"kind":"serve","v":1,"part":0,"cpu_s":1.5,"reply_bytes":100}\n'
    )
    (tmp_path / "m.jsonl").write_text(old)
    (rec,), (serve,) = read_metrics([tmp_path / "m.jsonl"])
    assert rec == BatchRecord(
        rank=1, partition=1, iteration=3, sample_s=0.5, fetch_s=0.25, compute_s=0.125,
        structure_bytes={0: 7, 1: 2}, feature_bytes={0: 40}, batch_bytes=9, grad_bytes=8,
        cache_bytes=5, threads=2,
    )  # fmt: skip
    assert json.loads(rec.to_json()) == json.loads(old.splitlines()[0])
    assert serve.to_json() + "\n" == old.splitlines(keepends=True)[1]  # byte for byte
    shipped = resources.files("graphrun.placement").joinpath("profiles/products.json")
    save_profile(builtin_profile("products"), tmp_path / "p.json")
    assert (tmp_path / "p.json").read_text() == shipped.read_text()
