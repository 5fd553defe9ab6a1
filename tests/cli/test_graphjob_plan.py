"""``graphrun plan cluster.yaml job.yaml`` with a GraphJob spec, end to end."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from graphrun.cli import main
from graphrun.job.planning import STORE_OVERHEAD_GB, graphjob_to_placement
from graphrun.job.spec import job_roles, load_job, resolve_placement
from graphrun.names import RoleName
from graphrun.placement.plan import load_plan

NAMES = ["h0", "h1", "h2"]


def cluster(names: list[str] = NAMES) -> dict[str, Any]:
    bw = [50, 10, 10, 25]
    return {
        "apiVersion": "graphrun.io/v1alpha1",
        "kind": "Cluster",
        "machines": [
            {"name": n, "cpu": 24, "memory_gb": 64, "bandwidth_gbps": bw[i % 4]}
            for i, n in enumerate(names)
        ],
    }


def graphjob(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "graph": {"generator": {"name": "community", "params": {"nodes": 100_000}}},
        "partition": {"parts": 3},
        "runtime": {
            "machines": 3,
            "storeServersPerMachine": 2,
            "trainersPerMachine": 2,
            "samplerWorkersPerTrainer": 1,
        },
        "training": {"task": "node-classification"},
        "placement": {"planFile": "plan.yaml"},
    }
    return {
        "apiVersion": "graphrun.io/v1alpha1",
        "kind": "GraphJob",
        "metadata": {"name": "sage"},
        "spec": base | spec,
    }


def write(tmp_path: Path, job: dict[str, Any], clus: dict[str, Any]) -> tuple[Path, Path]:
    c, j = tmp_path / "cluster.yaml", tmp_path / "job.yaml"
    c.write_text(yaml.safe_dump(clus))
    j.write_text(yaml.safe_dump(job))
    return c, j


@pytest.mark.slow
def test_a_graphjob_plan_is_its_plan_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    c, j = write(tmp_path, graphjob(), cluster())
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(c), str(j), "-o", str(out), "--steps", "40"]) == 0
    assert "store memory: estimate from spec.graph" in capsys.readouterr().out
    job = load_job(j)
    roles = [r.id for r in job_roles(job.spec)]
    plan = load_plan(out, machines=NAMES, roles=roles, require_all=True)  # every role, no ps
    for p in range(3):  # a backup server runs beside its main server
        assert plan.assignments[f"store:{p}:1"] == plan.assignments[f"store:{p}"]
    for r in range(6):  # a sampler worker beside its trainer (it is part of its process tree)
        assert plan.assignments[f"sampler:{r}:0"] == plan.assignments[f"trainer:{r}"]
    placement = resolve_placement(job, tmp_path)  # the job's placement.planFile
    rename = dict(zip(NAMES, job.spec.machine_names, strict=True))
    assert placement == {RoleName.parse(role): rename[m] for role, m in plan.assignments.items()}
    # the plan records what it assumed: the cluster's capacities and each task's demand
    assert plan.capacity is not None and plan.demands is not None
    assert plan.capacity["h1"].cpu == 24 and plan.capacity["h1"].memory_gb == 64
    tasks = [f"store:{p}" for p in range(3)] + [f"trainer:{r}" for r in range(6)]
    assert sorted(plan.demands) == sorted(tasks)  # backups and samplers are in these
    assert plan.demands["trainer:0"].cpu == 4 + 2  # its sampler worker is part of it
    assert plan.demands["store:0"].memory_gb > STORE_OVERHEAD_GB
    for m in NAMES:
        on = plan.demand_on(m)
        assert on is not None and on.cpu <= 24 and on.memory_gb <= 64


def test_store_memory_comes_from_the_partition_directory(tmp_path: Path):
    data, parts = tmp_path / "data", tmp_path / "parts"
    assert main(["generate", "community", str(data), "--nodes", "3000", "--feat-dim", "16"]) == 0
    assert main(["partition", str(data), str(parts), "--parts", "2", "--method", "random"]) == 0
    spec = graphjob(
        graph={"dataset": "data"},
        partition={"parts": 2, "output": "parts"},
        runtime={"machines": 2},
    )
    c, j = write(tmp_path, spec, cluster(NAMES[:2]))
    conv = graphjob_to_placement(load_job(j), j, "products", 4)
    assert conv.store_memory_from == f"partition directory {parts}"
    for p in range(2):
        on_disk = sum(f.stat().st_size for f in (parts / f"part-{p}").rglob("*") if f.is_file())
        got = conv.job.tasks[p].demand[1]
        assert conv.job.tasks[p].role == RoleName.store(p)
        assert got == pytest.approx(on_disk / 1e9 + STORE_OVERHEAD_GB)
    assert conv.job.spec.trainers == 2 and conv.job.spec.samplers_per_trainer == 0
    assert conv.backups == {RoleName.store(0): (), RoleName.store(1): ()}
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(c), str(j), "-o", str(out), "--steps", "20"]) == 0
    assert set(map(str, resolve_placement(load_job(j), tmp_path))) == {
        "store:0",
        "store:1",
        "trainer:0",
        "trainer:1",
    }


def test_a_store_serving_features_from_disk_needs_its_cache_not_its_features(tmp_path: Path):
    data, parts = tmp_path / "data", tmp_path / "parts"
    assert main(["generate", "community", str(data), "--nodes", "3000", "--feat-dim", "16"]) == 0
    assert main(["partition", str(data), str(parts), "--parts", "2", "--method", "random"]) == 0
    disk = {"machines": 2, "storeFeatures": {"storage": "disk", "cacheMb": 0.1}}
    got = {}
    for name, runtime in (("memory", {"machines": 2}), ("disk", disk)):
        spec = graphjob(graph={"dataset": "data"}, partition={"parts": 2, "output": "parts"},
                        runtime=runtime)  # fmt: skip
        _, j = write(tmp_path, spec, cluster(NAMES[:2]))
        got[name] = graphjob_to_placement(load_job(j), j, "products", 4).job.tasks
    for p in range(2):
        feats = sum(f.stat().st_size for f in (parts / f"part-{p}" / "node").rglob("*.npy"))
        want = got["memory"][p].demand[1] - feats / 1e9 + 0.1 * 2**20 / 1e9
        assert got["disk"][p].demand[1] == pytest.approx(want)


def test_features_a_trainer_caches_whole_move_in_no_placement(tmp_path: Path) -> None:
    from graphrun.placement.workload import make_scenario

    data, parts = tmp_path / "data", tmp_path / "parts"
    assert main(["generate", "community", str(data), "--nodes", "3000", "--feat-dim", "16"]) == 0
    assert main(["partition", str(data), str(parts), "--parts", "2", "--method", "random"]) == 0
    table = 3000 * (16 * 4 + 8)  # float32 features and int64 labels of every node
    for budget_mb, cached in ((1, True), (0, False)):  # 0 turns the cache off
        assert table <= 2**20
        spec = graphjob(
            graph={"dataset": "data"},
            partition={"parts": 2, "output": "parts"},
            runtime={"machines": 2, "featureCacheMb": budget_mb},
        )
        _, j = write(tmp_path, spec, cluster(NAMES[:2]))
        conv = graphjob_to_placement(load_job(j), j, "products", 4)
        assert conv.job.spec.features_cached is cached
        feature = make_scenario(conv.job).feature
        assert bool(feature.sum() == 0) is cached  # the profile's feature bytes, or none
    spec["spec"]["graph"] = {"generator": {"name": "community", "params": {"nodes": 10**7}}}
    spec["spec"]["partition"] = {"parts": 2}
    spec["spec"]["runtime"]["featureCacheMb"] = 256  # 10M nodes of 64 floats do not fit
    _, j = write(tmp_path, spec, cluster(NAMES[:2]))
    assert not graphjob_to_placement(load_job(j), j, "products", 4).job.spec.features_cached


@pytest.mark.parametrize(
    ("job", "clus", "msg"),
    [
        (graphjob(), cluster(NAMES[:2]), r"cluster\.yaml: machines: the cluster has 2 machines"),
        (
            graphjob(graph={"dataset": "missing"}),
            cluster(),
            r"job\.yaml: spec\.graph\.dataset: .*missing does not exist",
        ),
        (
            graphjob(graph={"generator": {"name": "community", "params": {"nodes": "many"}}}),
            cluster(),
            r"spec\.graph\.generator\.params\.nodes: not a number",
        ),
        (
            graphjob(graph={"generator": {"name": "community", "params": {"nodes": 4e9}}}),
            cluster(),
            r"job\.yaml: store:0 needs \d+\.\d GB of memory \(estimate from spec\.graph\) "
            r"and the largest machine of .*cluster\.yaml has 64 GB",
        ),
        (graphjob(runtime={"machines": 0}), cluster(), r"spec\.runtime\.machines"),
    ],
)
def test_bad_graphjob_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], job: Any, clus: Any, msg: str
):
    c, j = write(tmp_path, job, clus)
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(c), str(j), "-o", str(out), "--steps", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("graphrun: error: ")
    assert re.search(msg, err), err
    assert not out.exists()


def test_bad_profile_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    c, j = write(tmp_path, graphjob(), cluster())
    argv = ["plan", str(c), str(j), "-o", str(tmp_path / "p.yaml"), "--steps", "5"]
    assert main([*argv, "--profile", "nope.json"]) == 2
    assert "--profile: " in capsys.readouterr().err


def test_inline_writes_the_job_with_the_plan_in_its_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = graphjob(placement={"planFile": "plan.yaml", "nodeLabel": "graphrun.io/machine"})
    c, j = write(tmp_path, spec, cluster())
    out, inline = tmp_path / "plan.yaml", tmp_path / "planned.yaml"
    argv = ["plan", str(c), str(j), "-o", str(out), "--steps", "20", "--inline", str(inline)]
    assert main(argv) == 0
    assert f"{inline}: {j} with the plan in spec.placement.plan" in capsys.readouterr().out
    planned = load_job(inline)
    assert planned.spec.placement.plan == load_plan(out)
    assert planned.spec.placement.plan_file is None
    assert planned.spec.placement.node_label == "graphrun.io/machine"  # kept
    # the same placement as the plan file gives the original job
    assert resolve_placement(planned) == resolve_placement(load_job(j), tmp_path)
    assert planned.spec.runtime == load_job(j).spec.runtime


def test_inline_needs_a_graphjob(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ex = Path(__file__).parents[2] / "examples" / "07-placement"
    argv = ["plan", str(ex / "cluster.yaml"), str(ex / "job.yaml"), "-o", str(tmp_path / "p")]
    assert main([*argv, "--steps", "5", "--inline", str(tmp_path / "j.yaml")]) == 2
    assert "--inline: " in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_small_machines_point_at_demand(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    # "store cpu 2 fits on no machine" did not say the demand is an estimate --demand sets
    small = cluster()
    for m in small["machines"]:
        m["cpu"] = 1
    c, j = write(tmp_path, graphjob(), small)
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(c), str(j), "-o", str(out), "--steps", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert re.search(r"demands\.store\.cpu: 2 fits on no machine .*lower it with --demand "
                     r"store=1,[\d.]+,0 ", err), err  # fmt: skip
    assert not out.exists()
    c, j = write(tmp_path, graphjob(), cluster())  # as the message says: it plans
    argv = ["plan", str(c), str(j), "-o", str(out), "--steps", "5", "--demand", "store=1,20"]
    assert main(argv) == 0


def test_the_search_says_where_it_stands(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    # 30 s of silence looked like a hang
    c, j = write(tmp_path, graphjob(), cluster())
    assert main(["plan", str(c), str(j), "-o", str(tmp_path / "p.yaml"), "--seconds", "1"]) == 0
    err = capsys.readouterr().err
    assert "graphrun plan: simulating the first placements, then searching for 1 s" in err
    assert re.search(r"graphrun plan: [\d.]+ s left: best makespan so far [\d.]+ s", err), err


def test_a_parameter_server_job_is_planned_with_its_ps_roles(tmp_path: Path):
    training = {"task": "node-classification", "sync": "ps"}
    runtime = {"machines": 3, "trainersPerMachine": 1, "parameterServers": 2}
    c, j = write(tmp_path, graphjob(training=training, runtime=runtime), cluster())
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(c), str(j), "-o", str(out), "--steps", "40"]) == 0
    job = load_job(j)
    roles = [r.id for r in job_roles(job.spec)]
    assert RoleName.ps(1) in roles
    plan = load_plan(out, machines=NAMES, roles=roles, require_all=True)  # ps:0, ps:1 too
    placement = resolve_placement(job, tmp_path)  # applies as is
    rename = dict(zip(NAMES, job.spec.machine_names, strict=True))
    assert placement[RoleName.ps(1)] == rename[plan.assignments["ps:1"]]


def test_inline_of_a_file_that_is_not_a_job_is_one_spec_error(tmp_path) -> None:
    """A job file that changed into a YAML list after it was planned failed as a
    TypeError (``data["spec"]`` of a list), not as the job file's error."""
    from graphrun.cli.plan import write_inline
    from graphrun.errors import SpecError

    job = tmp_path / "job.yaml"
    job.write_text("- not\n- a job\n")
    with pytest.raises(SpecError, match=r"job\.yaml: expected a mapping"):
        write_inline(job, None, tmp_path / "out.yaml")
    assert not (tmp_path / "out.yaml").exists()
