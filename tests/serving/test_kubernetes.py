"""examples/kubernetes/serving.yaml: valid Kubernetes, probes on the protocol's health
routes, a command the CLI takes, and the job it serves a job the endpoint answers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from graphrun.cli import build_parser
from graphrun.job.spec import load_job
from graphrun.serving.model import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
K8S = kubernetes_validate.latest_version()


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples/kubernetes/serving.yaml").read_text())
    return doc


def test_the_serving_manifest_is_valid_kubernetes_with_probes_on_the_health_routes() -> None:
    doc = _doc()
    assert [i["kind"] for i in doc["items"]] == ["Service", "Deployment"]
    for item in doc["items"]:
        kubernetes_validate.validate(item, K8S, strict=True)
    (c,) = doc["items"][1]["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    args = build_parser().parse_args(c["command"][1:])
    assert args.host == "0.0.0.0" and args.token_file == Path("/token/token")  # off loopback
    assert args.port == c["ports"][0]["containerPort"]


def test_it_serves_the_on_store_job_whose_addresses_name_the_store() -> None:
    job = load_job(ROOT / "examples/kubernetes/on-store.yaml")
    spec = ModelSpec.of(job)
    assert spec.name == "sage" and spec.fanouts == (25, 10)
    assert job.spec.graph.store is not None and len(job.spec.graph.store.addresses) == 2
    (c,) = _doc()["items"][1]["spec"]["template"]["spec"]["containers"]
    assert f"--checkpoint=/data/{job.spec.training.checkpoint_dir}" in c["command"]


def test_the_kserve_predictor_in_the_docs_runs_a_command_the_cli_takes() -> None:
    text = (ROOT / "docs/serving.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "InferenceService" in b)
    (c,) = yaml.safe_load(block)["spec"]["predictor"]["containers"]
    args = build_parser().parse_args(c["command"][1:])
    assert args.port == c["ports"][0]["containerPort"] == 8080  # KServe's port
    assert (
        args.token_file is not None and c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    )
