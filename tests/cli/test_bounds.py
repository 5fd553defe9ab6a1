"""Every count of a spec that sizes memory has an upper bound, checked up front: exit 2
and one line naming the field (``iterations: 1000000000`` was an 18 GB allocation killed
by the kernel; ``hidden: 10000000000`` an allocator traceback from every trainer)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from graphrun.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BIG = 10_000_000_000

JOB: dict[str, Any] = {
    "apiVersion": "graphrun.io/v1alpha1",
    "kind": "GraphJob",
    "metadata": {"name": "j"},
    "spec": {
        "graph": {"dataset": "data"},
        "runtime": {"machines": 2},
        "training": {"task": "node-classification"},
    },
}


def _with(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    d = out
    keys = path.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = value
    return out


def _one_line(capsys: pytest.CaptureFixture[str], pattern: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("graphrun: error: "), err
    assert re.search(pattern, err), err


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("spec.training.hidden", BIG, r"spec\.training\.hidden: .*less than or equal to 65536"),
        ("spec.training.batchSize", BIG, r"spec\.training\.batchSize"),
        ("spec.training.fanouts", [10, BIG], r"spec\.training\.fanouts\[1\]"),
        ("spec.training.fanouts", [5] * 17, r"spec\.training\.fanouts: .*at most 16"),
        ("spec.training.epochs", BIG, r"spec\.training\.epochs"),
        ("spec.training.embeddingDim", BIG, r"spec\.training\.embeddingDim"),
        ("spec.training.negativeSamples", BIG, r"spec\.training\.negativeSamples"),
        ("spec.training.evalNegatives", BIG, r"spec\.training\.evalNegatives"),
        ("spec.training.edgesPerEpoch", 1 << 50, r"spec\.training\.edgesPerEpoch"),
        ("spec.training.evalEvery", BIG, r"spec\.training\.evalEvery"),
        ("spec.training.evalSubset", 1 << 50, r"spec\.training\.evalSubset"),
        ("spec.training.seed", -1, r"spec\.training\.seed"),
        ("spec.training.seed", 1 << 70, r"spec\.training\.seed"),
        ("spec.partition.parts", BIG, r"spec\.partition\.parts"),
        ("spec.runtime.machines", 2000, r"spec\.runtime\.machines"),
        ("spec.runtime.trainersPerMachine", 100, r"spec\.runtime\.trainersPerMachine"),
        ("spec.runtime.samplerWorkersPerTrainer", 100, r"samplerWorkersPerTrainer"),
        ("spec.runtime.storeServersPerMachine", 100, r"storeServersPerMachine"),
        ("spec.runtime.featureCacheMb", BIG, r"spec\.runtime\.featureCacheMb"),
        ("spec.runPolicy.backoffLimit", BIG, r"spec\.runPolicy\.backoffLimit"),
        ("spec.runPolicy.activeDeadlineSeconds", BIG, r"activeDeadlineSeconds"),
        (
            "spec.graph",
            {"generator": {"name": "community", "params": {"nodes": 1 << 40}}},
            r"spec\.graph\.generator\.params\.nodes: 1\.09951e\+12 is more than",
        ),
    ],
)
def test_graphjob_counts_are_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any, named: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_with(JOB, field, value)))
    assert main(["run", str(path)]) == 2
    _one_line(capsys, named)
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_graphjob_processes_are_bounded_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _with(JOB, "spec.runtime", {"machines": 1024, "trainersPerMachine": 8})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path)]) == 2
    _one_line(capsys, r"spec\.runtime\.trainersPerMachine: .*8192 trainers, more than 4096")
    doc = _with(JOB, "spec.runtime", {"machines": 512, "samplerWorkersPerTrainer": 40})
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path)]) == 2
    _one_line(capsys, r"spec\.runtime: 21504 processes")


def _plan(tmp_path: Path, cluster: Any, job: Any, *flags: str) -> int:
    c, j = tmp_path / "cluster.yaml", tmp_path / "job.yaml"
    c.write_text(yaml.safe_dump(cluster))
    j.write_text(yaml.safe_dump(job))
    out = tmp_path / "plan.yaml"
    code = main(["plan", str(c), str(j), "-o", str(out), "--steps", "2", *flags])
    assert not out.exists() or code == 0
    return code


CLUSTER = yaml.safe_load((EXAMPLES / "07-placement" / "cluster.yaml").read_text())
PJOB = yaml.safe_load((EXAMPLES / "07-placement" / "job.yaml").read_text())


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("iterations", 1_000_000_000, r"iterations: .*less than or equal to 1000"),
        ("trainers", BIG, r"trainers: "),
        ("partitions", BIG, r"partitions: "),
        ("samplers_per_trainer", BIG, r"samplers_per_trainer: "),
        ("parameter_servers", BIG, r"parameter_servers: "),
        ("prefetch", BIG, r"prefetch: "),
        ("demands.store.memory_gb", float("inf"), r"demands\.store\.memory_gb: "),
    ],
)
def test_placement_job_counts_are_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any, named: str
) -> None:
    assert _plan(tmp_path, CLUSTER, _with(PJOB, field, value)) == 2
    _one_line(capsys, named)


def test_placement_job_tasks_times_iterations_are_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = {**PJOB, "trainers": 64, "iterations": 1000}  # 4 + 64 x 3 + 2 tasks
    assert _plan(tmp_path, CLUSTER, job) == 2
    _one_line(capsys, r"iterations: 1000 iterations of 198 tasks .* at most 252 for this job")


def test_cluster_counts_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = CLUSTER["machines"][0]
    many = {**CLUSTER, "machines": [{**m, "name": f"m{i}"} for i in range(1025)]}
    assert _plan(tmp_path, many, PJOB) == 2
    _one_line(capsys, r"machines: .*at most 1024")
    gpus = _with(CLUSTER, "machines", [{**m, "gpus": BIG}])
    assert _plan(tmp_path, gpus, PJOB) == 2
    _one_line(capsys, r"machines\.0\.gpus: ")
    inf = _with(CLUSTER, "machines", [{**m, "cpu": float("inf")}])
    assert _plan(tmp_path, inf, PJOB) == 2
    _one_line(capsys, r"machines\.0\.cpu: ")


def test_graphjob_plan_iterations_are_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _with(JOB, "spec.graph", {"generator": {"name": "community", "params": {}}})
    assert _plan(tmp_path, CLUSTER, job, "--iterations", "1000000000") == 2
    _one_line(capsys, r"--iterations: must be in \[1, 1000\]")
    many = _with(job, "spec.runtime", {"machines": 4, "trainersPerMachine": 64})
    assert _plan(tmp_path, CLUSTER, many, "--iterations", "1000") == 2
    _one_line(capsys, r"--iterations: 1000 iterations of 260 tasks")


def _deep(levels: int) -> str:
    return "a: " + "[" * levels + "]" * levels + "\n"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (_deep(100_000), r"nested deeper than 64 levels"),  # RecursionError in the parser
        (_deep(200), r"nested deeper than 64 levels"),
        # a billion laughs: nine aliases of nine aliases of ... of one value
        (
            "a: &a [x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n"
                for i in range(8)
            ),
            r"more than 1000000 values",
        ),
        ("a: [" + "1, " * 6_000_000 + "]\n", r"larger than 16 MiB"),
    ],
    ids=["deep-100k", "deep-200", "aliases", "large"],
)
@pytest.mark.parametrize("command", ["run", "plan"])
def test_hostile_yaml_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, text: str, named: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    if command == "run":
        argv = ["run", str(bad)]
    else:
        good = tmp_path / "job.yaml"
        good.write_text(yaml.safe_dump(PJOB))
        argv = ["plan", str(bad), str(good), "-o", str(tmp_path / "plan.yaml")]
    assert main(argv) == 2
    _one_line(capsys, re.escape(str(bad)) + ": " + named)


def test_a_hostile_profile_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)  # json.loads: RecursionError
    job = _with(JOB, "spec.graph", {"generator": {"name": "community", "params": {}}})
    assert _plan(tmp_path, CLUSTER, job, "--profile", str(deep)) == 2
    _one_line(capsys, r"--profile: .*deep\.json: nested deeper than 64 levels")


def test_a_hostile_dataset_metadata_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "graph.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["partition", str(data), str(tmp_path / "parts"), "--parts", "2"]) == 2
    _one_line(capsys, r"graph\.json: nested too deeply to be dataset metadata")
