"""End to end on a real cluster (kind, k3d, ...): runs only with ``-m k8s`` and KUBECONFIG.

    kind create cluster --name graphrun
    export KUBECONFIG="$HOME/.kube/config"
    python -m pytest -m k8s tests/operator/test_e2e_k8s.py          # control plane only
    # and with the graphrun image loaded into the cluster, a whole training run:
    docker build -t ghcr.io/graphrun/graphrun:0.1.0 .
    kind load docker-image ghcr.io/graphrun/graphrun:0.1.0 --name graphrun
    GRAPHRUN_E2E_IMAGE=ghcr.io/graphrun/graphrun:0.1.0 \
        python -m pytest -m k8s tests/operator/test_e2e_k8s.py

The operator runs in this process (kopf in a thread, logged in through KUBECONFIG);
each test gets a fresh namespace, deleted afterwards. See docs/kubernetes.md.
"""

from __future__ import annotations

import asyncio
import copy
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG is not set"),
]

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "graphrun.io", "v1alpha1", "graphjobs"


@pytest.fixture(scope="module")
def api() -> Any:
    from kubernetes import client, config

    config.load_kube_config(config_file=os.environ["KUBECONFIG"])
    return client.ApiClient()


@pytest.fixture(scope="module")
def crd(api: Any) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from graphrun.operator.crd import CRD_NAME, graphjob_crd

    ext = client.ApiextensionsV1Api(api)
    body = graphjob_crd()
    try:
        current = ext.read_custom_resource_definition(CRD_NAME)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(CRD_NAME, body)
    except ApiException as exc:
        if exc.status != 404:
            raise
        ext.create_custom_resource_definition(body)
    wait_for(lambda: _established(ext, CRD_NAME), 60, "CRD established")


def _established(ext: Any, name: str) -> bool:
    conds = ext.read_custom_resource_definition(name).status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conds)


@pytest.fixture
def namespace(api: Any, crd: None) -> Iterator[str]:
    from kubernetes import client

    core = client.CoreV1Api(api)
    name = f"graphrun-e2e-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture
def operator(api: Any, namespace: str) -> Iterator[None]:
    import kopf

    from graphrun.operator.handlers import OperatorContext, register
    from graphrun.operator.kube import Kube

    ctx = OperatorContext(kube=Kube(api), resync_seconds=2.0)
    registry = kopf.OperatorRegistry()
    register(registry, ctx)
    stop = threading.Event()

    def run() -> None:
        asyncio.run(
            kopf.operator(
                registry=registry, standalone=True, namespaces=[namespace], stop_flag=stop
            )
        )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout}s")
        time.sleep(1)


def example(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["runPolicy"] = {"backoffLimit": 0, "startupDeadlineSeconds": 60}
    return dict(doc)


def create(api: Any, ns: str, doc: dict[str, Any]) -> None:
    from kubernetes import client

    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc)


def status(api: Any, ns: str, name: str) -> dict[str, Any]:
    from kubernetes import client

    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )
    return dict(obj.get("status") or {})


def test_api_server_rejects_an_invalid_spec(api: Any, namespace: str) -> None:
    from kubernetes.client.exceptions import ApiException

    doc = example("bad")
    doc["spec"]["runtime"]["trainersPerMachine"] = 0
    with pytest.raises(ApiException) as info:
        create(api, namespace, doc)
    assert info.value.status == 422
    assert "trainersPerMachine" in str(info.value.body)


def test_children_are_accepted_and_a_missing_image_fails_the_job(
    api: Any, namespace: str, operator: None
) -> None:
    from kubernetes import client

    doc = example("noimage")
    doc["spec"]["image"] = "ghcr.io/graphrun/does-not-exist:0"
    create(api, namespace, doc)
    core = client.CoreV1Api(api)
    wait_for(
        lambda: status(api, namespace, "noimage").get("phase") == "Partitioning", 60, "Partitioning"
    )
    names = {s.metadata.name for s in core.list_namespaced_secret(namespace).items}
    assert "noimage-keys" in names
    svc = core.read_namespaced_service("noimage-workers", namespace)
    assert svc.spec.cluster_ip == "None"
    wait_for(lambda: status(api, namespace, "noimage").get("phase") == "Failed", 180, "Failed")
    failed = next(
        c for c in status(api, namespace, "noimage")["conditions"] if c["type"] == "Failed"
    )
    assert failed["reason"] in ("ImagePullBackOff", "ErrImagePull", "StartupDeadlineExceeded")
    events = core.list_namespaced_event(
        namespace, field_selector="involvedObject.kind=GraphJob,involvedObject.name=noimage"
    ).items
    assert any(e.reason == "JobCreated" for e in events)


@pytest.mark.skipif(not os.environ.get("GRAPHRUN_E2E_IMAGE"), reason="GRAPHRUN_E2E_IMAGE not set")
def test_graphsage_trains_to_success(api: Any, namespace: str, operator: None) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    pvc = yaml.safe_load((ROOT / "examples" / "kubernetes" / "pvc.yaml").read_text())
    core.create_namespaced_persistent_volume_claim(namespace, pvc)
    doc = example("sage")
    doc["spec"]["image"] = os.environ["GRAPHRUN_E2E_IMAGE"]
    doc["spec"]["imagePullPolicy"] = "IfNotPresent"
    doc["spec"]["training"]["epochs"] = 2
    doc["spec"]["graph"]["generator"]["params"] = {"nodes": 5000, "avgDegree": 10, "seed": 0}
    doc["spec"]["runPolicy"]["startupDeadlineSeconds"] = 300
    small = copy.deepcopy(doc)
    small["spec"]["replicaSpecs"] = {}  # no resource requests on a small cluster
    create(api, namespace, small)
    final = wait_for(
        lambda: (
            status(api, namespace, "sage").get("phase") in ("Succeeded", "Failed")
            and status(api, namespace, "sage")
        ),
        1200,
        "finished",
    )
    assert final["phase"] == "Succeeded", final.get("message")
    assert final["replicaStatuses"]["Worker"]["succeeded"] == 2


@pytest.mark.skipif(not os.environ.get("GRAPHRUN_E2E_IMAGE"), reason="GRAPHRUN_E2E_IMAGE not set")
def test_probe_measures_the_nodes_and_leaves_nothing(api: Any, namespace: str, tmp_path) -> None:
    """`graphrun probe --hosts kubernetes` over one node per member (a kind cluster has
    one node: one member, measured to itself)."""
    from kubernetes import client

    from graphrun.cli import main
    from graphrun.placement.cluster import load_cluster

    nodes = client.CoreV1Api(api).list_node().items
    doc = example("probed")
    doc["spec"]["replicaSpecs"] = {}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    out = tmp_path / "cluster.yaml"
    argv = ["probe", "--hosts", "kubernetes", "--job", str(job), "-n", namespace, "-o", str(out)]
    argv += ["--members", str(min(len(nodes), 2)), "--image", os.environ["GRAPHRUN_E2E_IMAGE"]]
    assert main([*argv, "--kubeconfig", os.environ["KUBECONFIG"], "--timeout", "600"]) == 0
    c = load_cluster(out)
    assert set(c.names) <= {n.metadata.name for n in nodes} and all(x > 0 for x in c.egress)
    assert client.BatchV1Api(api).list_namespaced_job(namespace).items == []
