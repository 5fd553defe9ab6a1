from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

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
