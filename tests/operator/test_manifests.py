"""Every manifest the docs and the Kubernetes examples show renders and validates:
core objects against the official schemas, GraphJobs against the CRD and the spec,
Kueue's objects by their required fields (their CRDs are not in the official schemas)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from graphrun.job.spec import parse_job
from graphrun.operator.builders import check_supported
from graphrun.operator.crd import openapi_schema

ROOT = Path(__file__).resolve().parents[2]
K8S = kubernetes_validate.latest_version()
KUEUE_REQUIRED = {
    "ResourceFlavor": [],
    "ClusterQueue": [("spec", "resourceGroups")],
    "LocalQueue": [("spec", "clusterQueue")],
    "WorkloadPriorityClass": [("value",)],
}


def _docs_manifests() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for md in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", md.read_text(), re.S)):
            if not re.search(r"^apiVersion:", block, re.M):
                continue  # a fragment (a few fields of a spec), not a manifest
            for doc in yaml.safe_load_all(block):
                if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc:
                    out.append((f"{md.name}[{i}]:{doc['kind']}", doc))
    for path in sorted((ROOT / "examples" / "kubernetes").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for item in (doc or {}).get("items", [doc]) if doc else []:  # a List, or one
                rel = path.relative_to(ROOT / "examples" / "kubernetes")
                out.append((f"{rel}:{item['kind']}", item))
    return out


MANIFESTS = _docs_manifests()


@pytest.mark.parametrize(("where", "doc"), MANIFESTS, ids=[m[0] for m in MANIFESTS])
def test_manifest_validates(where: str, doc: dict[str, Any]) -> None:
    group = doc["apiVersion"].split("/")[0]
    if doc["kind"] == "GraphJob":
        jsonschema.Draft4Validator(openapi_schema()).validate(doc)
        job = parse_job(doc, source=where)
        if not where.startswith("README"):  # the README's jobs are for graphrun run
            check_supported(job)
    elif group == "kueue.x-k8s.io":
        assert doc["apiVersion"] == "kueue.x-k8s.io/v1beta1", where
        for path in KUEUE_REQUIRED[doc["kind"]]:
            node: Any = doc
            for key in path:
                assert key in node, f"{where}: {'.'.join(path)} missing"
                node = node[key]
    elif group == "serving.kserve.io":  # docs/serving.md: KServe's CRD has no schema here
        pod = doc["spec"]["predictor"]
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
             "spec": {"containers": pod["containers"], "volumes": pod.get("volumes", [])}},
            K8S, strict=True,
        )  # fmt: skip
    else:
        kubernetes_validate.validate(doc, K8S, strict=True)


def test_the_kueue_example_is_covered() -> None:
    kinds = {w.split(":")[-1] for w, _ in MANIFESTS if w.startswith("kueue/")}
    assert {"GraphJob", "ClusterQueue", "LocalQueue"} <= kinds
