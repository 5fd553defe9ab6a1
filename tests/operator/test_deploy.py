"""deploy/: every manifest valid against the official schemas, least-privilege RBAC,
the kustomize base and the Helm chart consistent with each other and with the CRD."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from graphrun.operator.crd import crd_yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "graphrun-operator"
K8S = kubernetes_validate.latest_version()


def base_objects() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "base").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def render_chart(
    release: str = "graphrun", namespace: str = "graphrun-system", **overrides: Any
) -> list[dict[str, Any]]:
    """Render the chart's templates with the small subset of Helm they use:
    ``{{ .Values.a.b }}``, ``{{ .Release.Name|Namespace }}``,
    ``{{- toYaml .Values.x | nindent N }}`` and ``{{- if .Values.x }} .. {{- else }} ..
    {{- end }}`` (not nested)."""
    values = {**yaml.safe_load((CHART / "values.yaml").read_text()), **overrides}
    scope = {"Values": values, "Release": {"Name": release, "Namespace": namespace}}

    def lookup(path: str) -> Any:
        node: Any = scope
        for part in path.strip(".").split("."):
            node = node[part]
        return node

    def to_yaml(m: re.Match[str]) -> str:
        text = yaml.safe_dump(lookup(m[1]), default_flow_style=False).rstrip("\n")
        if text in ("{}", "[]"):
            return " " + text
        pad = " " * int(m[2])
        return "".join("\n" + pad + line for line in text.splitlines())

    docs = []
    for path in sorted((CHART / "templates").glob("*.yaml")):
        text = path.read_text()
        text = re.sub(  # "{{-" trims the whitespace before it, as Helm does
            r"\s*\{\{- if (\S+) \}\}(.*?)(?:\s*\{\{- else \}\}(.*?))?\s*\{\{- end \}\}",
            lambda m: m[2] if lookup(m[1]) else (m[3] or ""),
            text,
            flags=re.S,
        )
        text = re.sub(r"\s*\{\{- toYaml (\S+) \| nindent (\d+) \}\}", to_yaml, text)
        text = re.sub(r"\{\{ (\.\S+) \}\}", lambda m: str(lookup(m[1])), text)
        assert "{{" not in text, f"{path}: template construct the test cannot render"
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


@pytest.mark.parametrize(
    "obj", base_objects(), ids=lambda o: f"{o['kind']}-{o['metadata']['name']}"
)
def test_base_objects_are_valid(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S, strict=True)


def test_base_crd_is_generated() -> None:
    assert (DEPLOY / "base" / "crd.yaml").read_text() == crd_yaml()
    assert (CHART / "crds" / "graphjobs.graphrun.io.yaml").read_text() == crd_yaml()


def _rules(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (role,) = [o for o in objs if o["kind"] == "ClusterRole"]
    return list(role["rules"])


def test_rbac_is_least_privilege() -> None:
    rules = _rules(base_objects())
    granted = {
        (group, res, verb)
        for r in rules
        for group in r["apiGroups"]
        for res in r["resources"]
        for verb in r["verbs"]
    }
    resources = {res for _, res, _ in granted}
    assert not {"pods/exec", "pods/attach", "pods/portforward", "nodes", "*"} & resources
    assert not any(verb == "*" for _, _, verb in granted)
    assert not {("", "secrets", v) for v in ("update", "patch", "delete", "watch")} & granted
    assert ("", "pods", "create") in granted and ("batch", "jobs", "create") in granted
    assert ("graphrun.io", "graphjobs/status", "patch") in granted


def _grants(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for r in rules:
        for group in r["apiGroups"]:
            for res in r["resources"]:
                out.setdefault((group, res), set()).update(r["verbs"])
    return out


def test_rbac_grants_exactly_what_the_new_objects_need() -> None:
    """NetworkPolicies, the Workload API's objects and Kueue's Workloads: the verbs the
    operator uses (graphrun.operator.kube.RIGHTS), no more, in every install."""
    from graphrun.operator.kube import RIGHTS

    namespaced = [o for o in render_chart(watchNamespace="ml") if o["kind"] == "Role"]
    for rules in (_rules(base_objects()), _rules(render_chart()), namespaced[0]["rules"]):
        granted = _grants(rules)
        for key, verbs in RIGHTS.items():
            assert granted.get(key) == set(verbs), key
    assert ("kueue.x-k8s.io", "workloads") in RIGHTS  # read only: Kueue owns them


def test_operator_image_and_service_account_match() -> None:
    objs = base_objects()
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    (sa,) = [o for o in objs if o["kind"] == "ServiceAccount"]
    (binding,) = [o for o in objs if o["kind"] == "ClusterRoleBinding"]
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == binding["subjects"][0]["name"]
    assert pod["containers"][0]["args"][0] == "operator"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_renders_everything() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(out) if d)
    assert kinds == sorted(o["kind"] for o in base_objects())


@pytest.mark.parametrize(
    "obj", render_chart(), ids=lambda o: f"{o['kind']}-{o['metadata']['name']}"
)
def test_helm_objects_are_valid(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S, strict=True)


def test_helm_rbac_matches_the_base() -> None:
    assert _rules(render_chart()) == _rules(base_objects())


@pytest.mark.parametrize(
    "obj",
    render_chart(watchNamespace="ml"),
    ids=lambda o: f"namespaced-{o['kind']}-{o['metadata']['name']}",
)
def test_namespaced_helm_objects_are_valid(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S, strict=True)


def test_a_namespaced_install_has_no_cluster_wide_rights_but_reading_the_crd() -> None:
    """The chart bound a ClusterRole granting secrets get/list/create cluster-wide even
    when the operator watched one namespace."""
    objs = render_chart(watchNamespace="ml")
    (role,) = [o for o in objs if o["kind"] == "Role"]
    (binding,) = [o for o in objs if o["kind"] == "RoleBinding"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "ml"
    assert {tuple(r["resources"]) for r in role["rules"]} >= {("secrets", "services")}
    (cluster,) = [o for o in objs if o["kind"] == "ClusterRole"]
    assert cluster["rules"] == [
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
         "verbs": ["get", "list", "watch"]}
    ]  # fmt: skip
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=ml" in args and "--all-namespaces" not in args
    # the rules in the namespace are the cluster install's, less what only kopf's
    # cluster-wide scanning needs
    wide = [r for r in _rules(base_objects()) if r["resources"][0] not in
            ("customresourcedefinitions", "namespaces")]  # fmt: skip
    assert role["rules"] == wide


def test_helm_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "graphrun-operator"
    (dep,) = [o for o in render_chart() if o["kind"] == "Deployment"]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["operator", "--liveness=http://0.0.0.0:8080/healthz"]
    assert "--all-namespaces" in args
