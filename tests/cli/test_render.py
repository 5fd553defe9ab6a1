"""`graphrun render`: every object the operator makes for a GraphJob, without a cluster.

Each example GraphJob renders, every object validates against the official schemas (as
tests/operator/test_builders.py validates the builders), and the objects are those the
operator's reconcile creates for the same job from its first step to training."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from graphrun.cli import main
from graphrun.errors import USER_ERROR_EXIT
from graphrun.job.spec import GraphJob, load_job, parse_job
from graphrun.operator import layout as L
from graphrun.operator.keys import curve_keypair
from graphrun.operator.observe import observe
from graphrun.operator.plan import Create
from graphrun.operator.reconcile import reconcile
from graphrun.operator.render import MADE_BY_OPERATOR, UID
from graphrun.operator.status import read_status
from graphrun.testing.kube import FakeNamespace
from graphrun.wire import KEY_FORMAT

ROOT = Path(__file__).resolve().parents[2]
K8S = kubernetes_validate.latest_version()
WORKLOAD_API_K8S = "1.36.0"  # the Kubernetes release whose schemas hold Workload v1alpha2
# scheduler CRDs not in the official schemas: their required fields
POD_GROUP_REQUIRED = ("minMember",)


def _example_jobs() -> list[Path]:
    found = []
    for path in sorted((ROOT / "examples" / "kubernetes").rglob("*.yaml")):
        docs = list(yaml.safe_load_all(path.read_text()))
        if len(docs) == 1 and isinstance(docs[0], dict) and docs[0].get("kind") == "GraphJob":
            found.append(path)
    return found


EXAMPLES = _example_jobs()


def _variant(tmp_path: Path, name: str, **spec: Any) -> Path:
    """examples/kubernetes/graphsage.yaml with ``spec`` sections replaced."""
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["metadata"]["name"] = name
    d["spec"].update(spec)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def _variants(tmp_path: Path) -> list[Path]:
    """What the examples leave out: an elastic job (its rendezvous pod), a Volcano gang
    with a launcher pod, and the Workload API's gang."""
    launcher = {"template": {"spec": {"containers": [{"name": "graphrun", "command": ["true"]}]}}}
    return [
        _variant(
            tmp_path, "elastic", partition={"parts": 3, "output": "elastic/parts"},
            runtime={"machines": 3, "replicas": 2, "elastic": {"minMachines": 2}},
        ),
        _variant(
            tmp_path, "gang", replicaSpecs={"launcher": launcher},
            runPolicy={"schedulingPolicy": {"provider": "volcano", "queue": "research"}},
        ),
        _variant(
            tmp_path, "workload", runPolicy={"schedulingPolicy": {"provider": "workload-api"}}
        ),
    ]  # fmt: skip


def _render(path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> list[dict[str, Any]]:
    assert main(["render", str(path), *flags]) == 0
    out = capsys.readouterr().out
    docs = list(yaml.safe_load_all(out))
    assert all(isinstance(d, dict) for d in docs), out[:2000]
    return docs


def _validate(obj: dict[str, Any]) -> None:
    spec = obj.get("spec", {})
    if obj["apiVersion"].startswith("scheduling.k8s.io/") or "schedulingGroup" in spec:
        kubernetes_validate.validate(obj, WORKLOAD_API_K8S, strict=True)
    elif obj["kind"] == "PodGroup":  # Volcano's or scheduler-plugins' CRD
        assert obj["apiVersion"] in (
            "scheduling.volcano.sh/v1beta1",
            "scheduling.x-k8s.io/v1alpha1",
        )
        assert all(k in spec for k in POD_GROUP_REQUIRED), obj
    else:
        kubernetes_validate.validate(obj, K8S, strict=True)


def test_the_examples_cover_what_render_makes(tmp_path: Path) -> None:
    assert {p.name for p in EXAMPLES} >= {"graphsage.yaml", "distributed.yaml", "on-store.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(ROOT)) for p in EXAMPLES])
def test_every_example_renders_objects_that_validate(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = _render(path, capsys)
    for obj in docs:
        _validate(obj)
    job = load_job(path)
    kinds = [d["kind"] for d in docs]
    workers = [d for d in docs if d["metadata"]["name"].startswith(f"{job.name}-worker-")]
    assert len(workers) == len(L.worker_indices(job)) >= 1
    assert {"ConfigMap", "Service", "NetworkPolicy"} <= set(kinds)
    assert ("Secret" in kinds) == (job.spec.graph.store is None)
    partitioner = job.spec.graph.store is None and not L.partitions_on_workers(job)
    assert ("Job" in kinds) == partitioner


def test_what_the_examples_leave_out_renders_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elastic, gang, workload = _variants(tmp_path)
    rendezvous = [
        d for d in _render(elastic, capsys) if d["metadata"]["name"] == "elastic-rendezvous"
    ]
    assert len(rendezvous) == 1
    gang_docs = _render(gang, capsys)
    assert {"PodGroup", "Pod"} <= {d["kind"] for d in gang_docs}
    assert any(d["metadata"]["name"] == "gang-launcher" for d in gang_docs)
    workload_docs = _render(workload, capsys)
    assert "Workload" in {d["kind"] for d in workload_docs}
    for obj in [*rendezvous, *gang_docs, *workload_docs]:
        _validate(obj)


def _operator_creates(job: GraphJob, namespace: str) -> list[dict[str, Any]]:
    """What the operator's reconcile creates for ``job``, from its first step until it
    trains (the partitioner Job done, every pod running and ready)."""
    ns = FakeNamespace(now=datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
    owner, status, made = L.Owner(job.name, namespace, UID), {}, []
    for _ in range(8):
        ns.now += timedelta(seconds=1)
        seen = observe(ns.children(), owner.name, owner.uid)
        config, keys = L.OperatorConfig(), curve_keypair()
        plan = reconcile(job, owner, config, read_status(status), seen, ns.now, keys)
        made += [copy.deepcopy(a.obj) for a in plan.actions if isinstance(a, Create)]
        ns.apply(plan)
        status = plan.status
        if ("Job", f"{job.name}-partitioner") in ns.objects:
            ns.finish_job(f"{job.name}-partitioner")
        for pod in ns.pods():
            if pod["metadata"]["labels"].get(L.LABEL_REPLICA) != "partitioner":
                ns.set_pod(pod["metadata"]["name"], "Running", ready=True)
    assert status["phase"] == "Training", status
    return made


def _without_keys(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("data", "stringData")}


def test_render_gives_the_objects_the_operator_creates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in [ROOT / "examples" / "kubernetes" / "graphsage.yaml", *_variants(tmp_path)]:
        rendered = _render(path, capsys, "-n", "ml")
        made = _operator_creates(load_job(path), "ml")
        key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
        assert sorted(map(key, rendered)) == sorted(map(key, made)), path.name
        by_key = {key(o): o for o in made}
        for obj in rendered:
            if obj["kind"] == "Secret":
                assert _without_keys(obj) == _without_keys(by_key[key(obj)])
            else:
                assert obj == by_key[key(obj)], key(obj)


def test_the_secret_has_its_shape_and_no_key(capsys: pytest.CaptureFixture[str]) -> None:
    docs = _render(ROOT / "examples" / "kubernetes" / "graphsage.yaml", capsys)
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert "data" not in secret
    (content,) = secret["stringData"].values()
    key = yaml.safe_load(content)
    assert key["public"] == key["secret"] == MADE_BY_OPERATOR
    assert key["format"] == KEY_FORMAT


def test_output_directory_gets_one_file_per_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = ROOT / "examples" / "kubernetes" / "graphsage.yaml"
    printed = _render(job, capsys)
    out = tmp_path / "manifests"
    assert main(["render", str(job), "-o", str(out)]) == 0
    files = sorted(out.iterdir())
    assert [yaml.safe_load(f.read_text()) for f in files] == printed
    assert files[0].name == "00-secret-graphsage-keys.yaml"
    assert main(["render", str(job), "-o", str(out)]) == USER_ERROR_EXIT  # not empty now
    assert "must be a new or empty directory" in capsys.readouterr().err


def _bad(tmp_path: Path, edit: Any) -> Path:
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    edit(d["spec"])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda s: s["runtime"].update(machines=0), "spec.runtime.machines"),
        (lambda s: s["training"].update(epocs=3), "spec.training.epocs"),
        (lambda s: s.pop("sharedVolume"), "spec.sharedVolume"),
        (lambda s: s["placement"].update(planFile="plan.yaml"), "spec.placement.planFile"),
    ],
    ids=["bound", "typo", "operator-needs", "operator-refuses"],
)
def test_a_bad_spec_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, field: str
) -> None:
    path = _bad(tmp_path, lambda s: (s.setdefault("placement", {}), edit(s)))
    out = tmp_path / "manifests"
    assert main(["render", str(path), "-o", str(out)]) == USER_ERROR_EXIT
    got = capsys.readouterr()
    lines = got.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"graphrun: error: {path}: "), lines
    assert field in lines[0]
    assert got.out == "" and not out.exists()


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--gpus-per-node", "0"], "--gpus-per-node"),
        (["--gpus-per-node", "65"], "--gpus-per-node"),  # gpusPerMachine is at most 64
        (["-n", "Not_A_Namespace"], "--namespace"),
        (["-n", "other"], "--namespace"),  # the file says ml
        (["-o", ""], "-o"),
    ],
)
def test_bad_arguments_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    job = ROOT / "examples" / "kubernetes" / "kueue" / "graphsage.yaml"
    assert parse_job(yaml.safe_load(job.read_text())).metadata.namespace == "ml"
    assert main(["render", str(job), *argv]) == USER_ERROR_EXIT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"graphrun: error: {named}: "), lines
