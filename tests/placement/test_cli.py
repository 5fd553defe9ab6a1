from __future__ import annotations

import pytest
import yaml

from graphrun.cli import main
from graphrun.placement.plan import load_plan
from graphrun.placement.profile import BatchRecord, load_profile

CLUSTER = {
    "apiVersion": "graphrun.io/v1alpha1",
    "kind": "Cluster",
    "machines": [
        {"name": f"m{i}", "cpu": 32, "memory_gb": 256, "gpus": 2, "bandwidth_gbps": b}
        for i, b in enumerate([50, 50, 10, 10])
    ],
}
JOB = {
    "apiVersion": "graphrun.io/v1alpha1",
    "kind": "PlacementJob",
    "partitions": 4,
    "trainers": 4,
    "samplers_per_trainer": 1,
    "parameter_servers": 2,
    "iterations": 3,
    "demands": {"store": {"cpu": 2, "memory_gb": 100}},
}


def files(tmp_path, cluster=CLUSTER, job=JOB):
    c, j = tmp_path / "cluster.yaml", tmp_path / "job.yaml"
    c.write_text(yaml.safe_dump(cluster))
    j.write_text(yaml.safe_dump(job))
    return c, j


def test_plan_writes_a_loadable_plan(tmp_path, capsys):
    c, j = files(tmp_path)
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(c), str(j), "-o", str(out), "--steps", "50"]) == 0
    plan = load_plan(out, machines=[f"m{i}" for i in range(4)])
    assert len(plan.assignments) == 4 + 4 + 4 + 2
    assert "simulated time" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("cluster", "job", "msg"),
    [
        (
            {**CLUSTER, "machines": [{"name": "m0", "cpu": 8, "memory_gb": 8}]},
            JOB,
            r"machines\[0\]\.egress_gbps: missing",
        ),
        (
            {**CLUSTER, "machines": [{**CLUSTER["machines"][0], "cpu": -2}]},
            JOB,
            r"machines\.0\.cpu",
        ),
        (CLUSTER, {**JOB, "demands": {"trainer": {"gpus": 4}}}, r"demands\.trainer\.gpus"),
        (CLUSTER, {**JOB, "kind": "GraphJob"}, r"job\.yaml: metadata: Field required"),
    ],
)
def test_plan_bad_input_is_one_line_exit_2(tmp_path, capsys, cluster, job, msg):
    c, j = files(tmp_path, cluster, job)
    assert main(["plan", str(c), str(j), "-o", str(tmp_path / "p.yaml"), "--steps", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("graphrun: error: ")
    assert __import__("re").search(msg, err)
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize(
    ("flags", "msg"),
    [
        (["--seconds", "-1"], "--seconds: must be > 0"),
        (["--steps", "-5"], "--steps: must be >= 1"),
        (["--steps", "5", "--beta", "nan"], "--beta: must be > 0 and finite"),
        (["--steps", "5", "--tempering", "inf"], "--tempering: betas must be > 0"),
        (["--steps", "5", "--seed", "-1"], "--seed: must be >= 0"),
        (["--steps", "5", "--demand", "worker=1,2"], "--demand worker=1,2: the kind must be"),
        (["--steps", "5", "--demand", "trainer=1"], "--demand trainer=1: give KIND=CPU"),
        (["--steps", "5", "--demand", "trainer=-1,2"], "--demand trainer=-1,2: give KIND"),
    ],
)
def test_bad_search_flags_are_refused(tmp_path, capsys, flags, msg):
    """--steps -5 and --beta nan were accepted."""
    c, j = files(tmp_path)
    assert main(["plan", str(c), str(j), "-o", str(tmp_path / "p.yaml"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err
    assert not (tmp_path / "p.yaml").exists()


def test_demands_on_the_command_line_replace_the_job_s(tmp_path):
    """A cluster of 0.6-core hosts fits no 4-core trainer: --demand makes the plan."""
    small = {**CLUSTER, "machines": [{**m, "cpu": 0.6, "memory_gb": 4, "gpus": 0}
                                     for m in CLUSTER["machines"]]}  # fmt: skip
    job = {**JOB, "samplers_per_trainer": 0, "sync": "allreduce", "parameter_servers": 0}
    c, j = files(tmp_path, small, job)
    out = tmp_path / "p.yaml"
    assert main(["plan", str(c), str(j), "-o", str(out), "--steps", "5"]) == 2
    argv = ["plan", str(c), str(j), "-o", str(out), "--steps", "5"]
    assert main([*argv, "--demand", "trainer=0,1", "--demand", "store=0,1.5"]) == 0
    plan = load_plan(out, machines=[f"m{i}" for i in range(4)])
    assert plan.demands["trainer:0"].memory_gb == 1 and plan.demands["store:3"].cpu == 0


def test_unwritable_plan_output_and_binary_metrics_are_one_line(tmp_path, capsys):
    c, j = files(tmp_path)
    rc = main(["plan", str(c), str(j), "-o", "/proc/graphrun/plan.yaml", "--steps", "5"])
    err = capsys.readouterr().err
    assert rc != 0 and err.count("\n") == 1 and "/proc/graphrun/plan.yaml" in err
    binary = tmp_path / "m.jsonl"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    assert main(["profile", str(binary), "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a UTF-8 text file" in err


def rec(r, i, compute_s, structure, feature):
    return BatchRecord(
        rank=r, partition=r, iteration=i, sample_s=0.02, fetch_s=0.01, compute_s=compute_s,
        structure_bytes=structure, feature_bytes=feature, batch_bytes=50, grad_bytes=8,
    )  # fmt: skip


def test_profile_from_a_metrics_file(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    recs = [
        rec(r, i, 0.03, {0: 10, 1: 5}, {r: 900, 1 - r: 100}) for i in range(5) for r in range(2)
    ]
    metrics.write_text("".join(x.to_json() + "\n" for x in recs))
    out = tmp_path / "prof.json"
    assert main(["profile", str(metrics), "-o", str(out)]) == 0
    prof = load_profile(out)
    assert prof.name == "prof" and prof["compute_s"].mean == pytest.approx(0.03)
    assert "10 batch records" in capsys.readouterr().out
    assert main(["profile", str(tmp_path / "missing.jsonl"), "-o", str(out)]) == 2


def test_profile_leaves_out_the_warm_up_batches(tmp_path, capsys):
    """Measured epochs leave out the first; a profile that kept its slower batches
    over-predicted every later epoch."""
    metrics = tmp_path / "metrics.jsonl"
    recs = [  # iterations 1-2 warm up: 3x the compute time
        rec(r, i, 0.09 if i <= 2 else 0.03, {0: 10}, {r: 900})
        for i in range(1, 7)
        for r in range(2)
    ]
    metrics.write_text("".join(x.to_json() + "\n" for x in recs))
    out = tmp_path / "prof.json"
    assert main(["profile", str(metrics), "-o", str(out), "--skip", "2"]) == 0
    assert load_profile(out)["compute_s"].mean == pytest.approx(0.03)
    assert "8 batch records" in capsys.readouterr().out
    for bad, msg in (("-1", "--skip: must be >= 0"), ("6", "--skip 6: leaves no batch")):
        assert main(["profile", str(metrics), "-o", str(out), "--skip", bad]) == 2
        assert msg in capsys.readouterr().err


def test_example_plans(tmp_path):
    from pathlib import Path

    ex = Path(__file__).parents[2] / "examples" / "07-placement"
    out = tmp_path / "plan.yaml"
    argv = ["plan", str(ex / "cluster.yaml"), str(ex / "job.yaml"), "-o", str(out)]
    assert main([*argv, "--steps", "20"]) == 0
    assert load_plan(out).machines == ["m0", "m1", "m2", "m3"]


def test_plan_tempering_options(tmp_path, capsys):
    c, j = files(tmp_path)
    out = tmp_path / "plan.yaml"
    base = ["plan", str(c), str(j), "-o", str(out), "--steps", "40"]
    assert main([*base, "--tempering"]) == 0  # a single chain
    assert main([*base, "--tempering", "20", "400"]) == 0
    capsys.readouterr()
    assert main([*base, "--tempering", "0"]) == 2
    assert "betas must be > 0" in capsys.readouterr().err


def test_a_graphjob_plan_is_never_slower_than_colocation(tmp_path, capsys):
    # A 2-machine GraphJob, one fast and one slow NIC: IFS (3.91 s simulated) was much
    # slower than co-location (1.24 s), and a short budget spent on compiling the
    # simulator left the chain 0 steps, so `graphrun plan` wrote the IFS placement.
    from pathlib import Path

    cluster = {
        "machines": [
            {"name": "m0", "cpu": 8, "memory_gb": 32, "bandwidth_gbps": 10},
            {"name": "m1", "cpu": 8, "memory_gb": 32, "bandwidth_gbps": 1},
        ]
    }
    job = yaml.safe_load((Path(__file__).parents[2] / "examples/jobs/graphsage.yaml").read_text())
    c, j = files(tmp_path, cluster, job)
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(c), str(j), "-o", str(out), "--steps", "1"]) == 0
    line = capsys.readouterr().out
    got = float(line.split("simulated time for 8 iterations: ")[1].split(" s")[0])
    colocation = float(line.split("co-location ")[1].split(" s")[0])
    assert got <= colocation, line
