from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from graphrun.cli import build_parser
from graphrun.errors import SpecError
from graphrun.job.spec import load_job, parse_job
from graphrun.operator.crd import crd_yaml, graphjob_crd, openapi_schema

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "jobs").glob("*.yaml")) + sorted(
    p
    for p in (ROOT / "examples" / "kubernetes").glob("*.yaml")
    if yaml.safe_load(p.read_text()).get("kind") == "GraphJob"
)
K8S_VERSION = kubernetes_validate.latest_version()
PRESERVE = "x-kubernetes-preserve-unknown-fields"


def structural_problems(node: dict[str, Any], path: str = "") -> list[str]:
    """The rules of a Kubernetes structural schema that our generator could break."""
    problems = []
    for key in ("$ref", "anyOf", "oneOf", "allOf", "const", "title", "default", "$defs"):
        if key in node:
            problems.append(f"{path or '/'}: has {key}")
    if "type" not in node and not node.get(PRESERVE) and "x-kubernetes-int-or-string" not in node:
        problems.append(f"{path or '/'}: no type")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties")
    if isinstance(node.get("exclusiveMinimum"), int | float) and not isinstance(
        node.get("exclusiveMinimum"), bool
    ):
        problems.append(f"{path}: numeric exclusiveMinimum")
    for name, child in node.get("properties", {}).items():
        problems += structural_problems(child, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        problems += structural_problems(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        problems += structural_problems(node["items"], f"{path}[]")
    return problems


def test_crd_is_a_valid_kubernetes_object() -> None:
    kubernetes_validate.validate(graphjob_crd(), K8S_VERSION, strict=True)


def test_schema_is_structural() -> None:
    assert structural_problems(openapi_schema()) == []


def test_crd_shape() -> None:
    crd = graphjob_crd()
    assert crd["metadata"]["name"] == "graphjobs.graphrun.io"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    cols = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert cols["Phase"] == ".status.phase"
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template = spec["properties"]["replicaSpecs"]["properties"]["worker"]["properties"]["template"]
    assert template == {"type": "object", PRESERVE: True, "description": template["description"]}
    tpm = spec["properties"]["runtime"]["properties"]["trainersPerMachine"]
    assert tpm["minimum"] == 0 and tpm["exclusiveMinimum"] is True
    parts = spec["properties"]["partition"]["properties"]["parts"]
    assert parts["type"] == "integer" and parts["nullable"] is True
    partition = spec["properties"]["partition"]["properties"]
    assert partition["method"]["enum"] == ["metis", "random", "kaminpar"]
    assert partition["mode"]["enum"] == ["single", "parallel", "distributed"]


def _validator() -> jsonschema.Draft4Validator:
    # OpenAPI v3.0 schemas use draft-4 style boolean exclusiveMinimum.
    return jsonschema.Draft4Validator(openapi_schema())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_examples_match_the_crd_schema(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    _validator().validate(doc)
    _validator().validate(load_job(path).to_dict())


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("runtime", "trainersPerMachine"), 0),
        (("partition", "method"), "spectral"),
        (("training", "fanouts"), [10, -5]),
        (("runPolicy", "cleanPodPolicy"), "Some"),
        (("placement", "nodeLabel"), "not a label"),
        (("placement", "plan"), {"machines": [], "assignments": {}}),
        (("placement", "plan"), {"kind": "GraphJob", "machines": ["a"], "assignments": {}}),
        (("placement", "plan"), {"machines": ["a"], "assignments": {"trainer:0": 1}}),
    ],
)
def test_crd_schema_rejects_what_the_model_rejects(where: tuple[str, str], value: Any) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "jobs" / "graphsage.yaml").read_text())
    bad = copy.deepcopy(doc)
    bad["spec"].setdefault(where[0], {})[where[1]] = value
    assert list(_validator().iter_errors(bad))


def test_deploy_copy_is_up_to_date() -> None:
    deployed = ROOT / "deploy" / "base" / "crd.yaml"
    assert deployed.read_text() == crd_yaml(), "run: python -m graphrun.operator.crd > " + str(
        deployed.relative_to(ROOT)
    )


@pytest.mark.parametrize("name", ["1st-job", "-job", "job-", "Job", "a" * 41, "job_1"])
def test_crd_refuses_names_a_service_cannot_take(name: str) -> None:
    # the operator's Service is <name>-workers, and Service names are DNS-1035 labels
    # (a letter first): "1st-job" passed the old pattern and broke at the API server
    doc = yaml.safe_load((ROOT / "examples" / "jobs" / "graphsage.yaml").read_text())
    doc["metadata"]["name"] = name
    assert list(_validator().iter_errors(doc))
    with pytest.raises(SpecError, match=r"metadata\.name"):
        parse_job(doc)


@pytest.mark.parametrize("name", ["a", "job-1", "x" * 40])
def test_crd_accepts_names_whose_children_are_legal(name: str) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "jobs" / "graphsage.yaml").read_text())
    doc["metadata"]["name"] = name
    _validator().validate(doc)
    from graphrun.operator import layout as L

    dns1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    for child in (L.service_name(name), L.partitioner_name(name), L.worker_name(name, 1023),
                  L.secret_name(name), L.configmap_name(name), L.launcher_name(name)):  # fmt: skip
        assert len(child) <= 63 and dns1035.match(child), child


def test_the_store_manifest_is_valid_kubernetes() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphstore.yaml").read_text())
    assert [i["kind"] for i in doc["items"]] == ["Service", "StatefulSet"]
    for item in doc["items"]:
        kubernetes_validate.validate(item, K8S_VERSION, strict=True)
    pod = doc["items"][1]["spec"]["template"]["spec"]
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"  # not the container's 64 MiB /dev/shm


def test_the_live_store_manifest_logs_each_pod_on_a_claim_of_its_own() -> None:
    text = (ROOT / "examples" / "kubernetes" / "graphstore-live.yaml").read_text()
    doc = yaml.safe_load(text)
    assert [i["kind"] for i in doc["items"]] == ["Service", "StatefulSet"]
    for item in doc["items"]:
        kubernetes_validate.validate(item, K8S_VERSION, strict=True)
    sts = doc["items"][1]["spec"]
    (claim,) = sts["volumeClaimTemplates"]
    (c,) = sts["template"]["spec"]["containers"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    line = c["args"][0].removeprefix("exec graphrun ").replace('"${HOSTNAME##*-}"', "1")
    args = build_parser().parse_args(shlex.split(line))
    assert args.func.__module__ == "graphrun.cli.serve" and args.part == 1
    assert str(args.live_dir) == mounts[claim["metadata"]["name"]]["mountPath"]
    assert not mounts[claim["metadata"]["name"]].get("readOnly")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]


# --- status -----------------------------------------------------------------------------


def _as_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """A structural OpenAPI v3 node as draft-4 JSON Schema that, like the API server's
    pruning, keeps no field the schema does not declare: ``nullable`` as a null type, an
    object with properties closed."""
    out = dict(node)
    if out.pop("nullable", False):
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if "properties" in out:
        out["properties"] = {k: _as_json_schema(v) for k, v in out["properties"].items()}
        out["additionalProperties"] = False
    elif isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _as_json_schema(out["additionalProperties"])
    if "items" in out:
        out["items"] = _as_json_schema(out["items"])
    return out


def _statuses() -> list[dict[str, Any]]:
    """Statuses the reconciler writes: elastic (a lost machine, replaced), partitioning
    on the worker pods, queued by Kueue, failed."""
    from tests.operator.test_kueue import queued_harness, to_queued
    from tests.operator.test_reconcile import distributed, elastic

    out = []
    h = elastic(runPolicy={"backoffLimit": 0})
    h.ns.set_pod("graphsage-worker-2", "Failed", exit_code=137)
    h.step()
    out.append(h.status)
    h.step()
    out.append(h.status)
    h = distributed()
    h.step()
    h.step()
    out.append(h.status)
    h = queued_harness()
    to_queued(h)
    out.append(h.status)
    h = elastic(3, runPolicy={"backoffLimit": 0})
    h.ns.delete("Pod", "graphsage-worker-1")
    h.step()
    out.append(h.status)
    return [json.loads(json.dumps(s)) for s in out]  # as the API server keeps it


def test_the_status_schema_is_declared() -> None:
    status = openapi_schema()["properties"]["status"]
    assert structural_problems(status) == []
    assert PRESERVE not in yaml.safe_dump(status)  # every field declared, nothing open
    lost = status["properties"]["lostMachines"]["items"]["properties"]
    assert lost["how"]["enum"] == ["deleted", "disappeared", "failed"]
    assert lost["tookOver"]["properties"]["partitions"]["additionalProperties"] == {
        "type": "string"
    }


def test_every_status_the_operator_writes_matches_the_crd() -> None:
    schema = _as_json_schema(openapi_schema()["properties"]["status"])
    statuses = _statuses()
    assert {"lostMachines", "partitionPods", "queue", "workflow"} <= {
        k for s in statuses for k in s
    }  # the cases cover what is there to cover
    for status in statuses:
        jsonschema.Draft4Validator(schema).validate(status)


def test_a_status_reads_back_as_it_was_written() -> None:
    from graphrun.operator.status import read_status, status_patch

    for status in _statuses():
        again = json.loads(json.dumps(status_patch(read_status(status))))
        assert again == {k: v for k, v in status.items() if v is not None}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"lostMachines": [{"machine": 3}]}, "lostMachines[0].machine"),
        ({"queue": {"queued": "yes"}}, "queue.queued"),
        ({"partitionPods": {"w": "Sleeping"}}, "partitionPods[...]"),
        ({"workflow": {"phase": "Training", "conditions": [], "restarts": -1}}, "restarts"),
    ],
)
def test_a_malformed_status_is_one_line_naming_the_field(raw: dict[str, Any], field: str) -> None:
    from graphrun.errors import WorkflowError
    from graphrun.operator.status import read_status

    with pytest.raises(WorkflowError, match=rf"^status: [^\n]*{re.escape(field)}") as info:
        read_status(raw)
    assert "\n" not in str(info.value)
