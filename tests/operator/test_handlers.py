"""The real kopf handlers through whole lifecycles against kmock, a Kubernetes API mock
speaking HTTP on loopback: kopf watches and patches over HTTP, the operator calls it
with the official client. The test plays the parts of a cluster that kmock does not
have: the Job controller (a pod per Job), the kubelet (pod phases) and the garbage
collector (children of deleted owners).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kmock
import kopf
import pytest
import pytest_asyncio
import yaml
from kubernetes import client

from graphrun.errors import PEER_LOST_EXIT
from graphrun.operator import layout as L
from graphrun.operator.handlers import OperatorContext, on_spec_change, register
from graphrun.operator.kube import Kube

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

ROOT = Path(__file__).resolve().parents[2]
NS = "ml"
GJ = f"/apis/graphrun.io/v1alpha1/namespaces/{NS}/graphjobs"
PATHS = {
    "Pod": f"/api/v1/namespaces/{NS}/pods",
    "Secret": f"/api/v1/namespaces/{NS}/secrets",
    "ConfigMap": f"/api/v1/namespaces/{NS}/configmaps",
    "Service": f"/api/v1/namespaces/{NS}/services",
    "Event": f"/api/v1/namespaces/{NS}/events",
    "Job": f"/apis/batch/v1/namespaces/{NS}/jobs",
    "NetworkPolicy": f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies",
}
VERBS = {"list", "watch", "get", "patch", "create", "delete"}
KEEP_REQUESTS = 20  # of kmock's history, far more than are ever being handled at once


def declare(api: Any) -> None:
    res = api.resources
    res["graphrun.io/v1alpha1/graphjobs"] = kmock.ResourceInfo(
        kind="GraphJob", namespaced=True, verbs=VERBS, subresources={"status"}
    )
    for path, kind in [
        ("v1/pods", "Pod"),
        ("v1/secrets", "Secret"),
        ("v1/configmaps", "ConfigMap"),
        ("v1/services", "Service"),
        ("v1/events", "Event"),
        ("batch/v1/jobs", "Job"),
        ("networking.k8s.io/v1/networkpolicies", "NetworkPolicy"),
    ]:
        res[path] = kmock.ResourceInfo(kind=kind, namespaced=True, verbs=VERBS)
    res["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs=VERBS)
    res["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs=VERBS
    )


class Cluster:
    """The test's view of the mock API, plus the controllers kmock does not run."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.deleted_uids: set[str] = set()

    async def get(self, path: str) -> Any:
        async with self.api.get(path) as resp:
            return await resp.json() if resp.status == 200 else None

    async def items(self, kind: str) -> list[dict[str, Any]]:
        body = await self.get(PATHS[kind])
        return list((body or {}).get("items") or [])

    async def names(self, kind: str, replica: str | None = None) -> list[str]:
        return sorted(
            o["metadata"]["name"]
            for o in await self.items(kind)
            if replica is None or o["metadata"].get("labels", {}).get(L.LABEL_REPLICA) == replica
        )

    async def graphjob(self, name: str = "graphsage") -> dict[str, Any]:
        return dict(await self.get(f"{GJ}/{name}") or {})

    async def status(self, name: str = "graphsage") -> dict[str, Any]:
        return dict((await self.graphjob(name)).get("status") or {})

    async def create_graphjob(self, doc: dict[str, Any]) -> None:
        doc = copy.deepcopy(doc)
        doc["metadata"].update(
            namespace=NS, uid=f"uid-{doc['metadata']['name']}", resourceVersion="1"
        )
        async with self.api.post(GJ, json=doc) as resp:
            assert resp.status == 200, await resp.text()

    async def patch(self, path: str, body: dict[str, Any]) -> None:
        async with self.api.patch(
            path, json=body, headers={"Content-Type": "application/merge-patch+json"}
        ) as resp:
            assert resp.status == 200, await resp.text()

    async def delete(self, path: str) -> None:
        async with self.api.delete(path) as resp:
            assert resp.status in (200, 404), await resp.text()

    async def set_pod(
        self, name: str, phase: str, ready: bool = False, exit_code: int = 0, message: str = ""
    ) -> None:
        state: dict[str, Any] = {"running": {}}
        if phase in ("Succeeded", "Failed"):
            state = {"terminated": {"exitCode": exit_code, "message": message}}
        status = {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "graphrun", "state": state}],
        }
        await self.patch(f"{PATHS['Pod']}/{name}/status", {"status": status})

    async def set_partition(
        self, name: str, state: str, exit_code: int = 0, message: str = ""
    ) -> None:
        """The kubelet for a worker pod's ``partition`` init container (partition.mode
        distributed): ``running``, or ``terminated`` — then the main container starts or
        the pod fails."""
        init: dict[str, Any] = {"running": {}}
        phase = "Pending"
        if state == "terminated":
            done = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            init = {"terminated": {"exitCode": exit_code, "message": message, "finishedAt": done}}
            phase = "Running" if exit_code == 0 else "Failed"
        status = {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "False"}],
            "initContainerStatuses": [{"name": L.PARTITION_CONTAINER, "state": init}],
            "containerStatuses": [{"name": "graphrun", "state": {"waiting": {}}}],
        }
        await self.patch(f"{PATHS['Pod']}/{name}/status", {"status": status})

    async def finish_partitioner(self, ok: bool = True) -> None:
        (pod,) = await self.names("Pod", "partitioner")
        await self.set_pod(pod, "Succeeded" if ok else "Failed", exit_code=0 if ok else 1)
        cond = {"type": "Complete" if ok else "Failed", "status": "True"}
        await self.patch(
            f"{PATHS['Job']}/graphsage-partitioner/status", {"status": {"conditions": [cond]}}
        )

    async def controllers(self) -> None:
        """The Job controller and the garbage collector, forever (cancelled by the test)."""
        while True:
            jobs = {j["metadata"]["name"]: j for j in await self.items("Job")}
            pods = await self.items("Pod")
            owners = {p["metadata"].get("labels", {}).get("job-name") for p in pods}
            for name, job in jobs.items():
                if name not in owners:
                    tpl = job["spec"]["template"]
                    meta = copy.deepcopy(tpl.get("metadata", {}))
                    meta["labels"]["job-name"] = name
                    meta["name"] = f"{name}-{int(time.monotonic() * 1000) % 100000}"
                    meta["ownerReferences"] = [{"kind": "Job", "name": name, "uid": f"job-{name}"}]
                    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": tpl["spec"]}
                    async with self.api.post(PATHS["Pod"], json=pod) as resp:
                        assert resp.status == 200
            for p in pods:  # garbage collection of a deleted Job's pods
                owner = p["metadata"].get("labels", {}).get("job-name")
                if owner and owner not in jobs:
                    await self.delete(f"{PATHS['Pod']}/{p['metadata']['name']}")
            self.forget()
            await asyncio.sleep(0.05)

    def forget(self) -> None:
        """Drops all but the newest requests from kmock's history. kmock keeps every
        request for assertions and matches each new one to its reactions by scanning
        that whole history once per reaction (``RawHandler._handle``): the hundreds of
        requests of a lifecycle made these tests quadratic, half of the file's CPU. The
        tests that run the controllers assert on objects and statuses, never on requests."""
        history = getattr(self.api, "_requests", None)  # kmock's own list, not its API
        if isinstance(history, list) and len(history) > 2 * KEEP_REQUESTS:
            del history[:-KEEP_REQUESTS]


async def eventually(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {check.__doc__ or check}")
        await asyncio.sleep(0.05)


def example(**run_policy: Any) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    doc["spec"]["runPolicy"] = {"backoffLimit": 0, **run_policy}
    return dict(doc)


def run_operator(registry: kopf.OperatorRegistry, stop: threading.Event) -> None:
    """kopf in its own thread and event loop (as in a real deployment): kmock keeps
    serving on the test's loop, and kopf's shutdown touches only its own tasks."""
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True
    settings.posting.enabled = False
    settings.watching.reconnect_backoff = 0.1
    settings.queueing.exit_timeout = 0.5
    asyncio.run(
        kopf.operator(
            registry=registry, settings=settings, standalone=True, namespaces=[NS], stop_flag=stop
        )
    )


@pytest_asyncio.fixture
async def cluster(kmock: Any, request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    declare(kmock)
    url = str(kmock.url).rstrip("/")
    ctx = OperatorContext(
        kube=Kube(client.ApiClient(client.Configuration(host=url))),
        resync_seconds=getattr(request, "param", 0.3),
    )
    registry = kopf.OperatorRegistry()
    register(registry, ctx)
    stop = threading.Event()
    thread = threading.Thread(target=run_operator, args=(registry, stop), daemon=True)
    thread.start()
    c = Cluster(kmock)
    helpers = asyncio.create_task(c.controllers())
    try:
        yield c
    finally:
        helpers.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await helpers
        stop.set()
        await asyncio.to_thread(thread.join, 60)
        assert not thread.is_alive(), "the operator did not stop"


def n_workers(c: Cluster, n: int = 2) -> Callable[[], Any]:
    async def check() -> list[str] | None:
        names = await c.names("Pod", "worker")
        return names if len(names) == n else None

    check.__doc__ = f"{n} worker pods"
    return check


def phase_is(c: Cluster, phase: str) -> Callable[[], Any]:
    """The status once in ``phase``: what it says then (a phase the job passes through
    moves on, and a status read after the wait may be the next phase's)."""

    async def check() -> dict[str, Any] | None:
        status = await c.status()
        return status if status.get("phase") == phase else None

    check.__doc__ = f"phase {phase}"
    return check


async def test_create_partition_run_succeed(cluster: Cluster) -> None:
    c = cluster
    await c.create_graphjob(example(cleanPodPolicy="Running"))
    await eventually(phase_is(c, "Partitioning"))
    assert await c.names("Secret") == ["graphsage-keys"]
    assert await c.names("ConfigMap") == ["graphsage-config"]
    assert await c.names("Service") == ["graphsage-workers"]
    await eventually(lambda: c.names("Pod", "partitioner"))
    assert await c.names("Pod", "worker") == []  # workers wait for the partitions
    await c.finish_partitioner()
    await eventually(phase_is(c, "Serving"))
    workers = await eventually(n_workers(c))
    assert workers == ["graphsage-worker-0", "graphsage-worker-1"]
    for w in workers:
        await c.set_pod(w, "Running", ready=True)
    await eventually(phase_is(c, "Training"))
    for w in workers:
        await c.set_pod(w, "Succeeded")
    await eventually(phase_is(c, "Succeeded"))
    status = await c.status()
    types = {cond["type"]: cond["status"] for cond in status["conditions"]}
    assert types == {
        "Created": "True",
        "Partitioning": "False",
        "Running": "False",
        "Succeeded": "True",
    }
    assert status["replicaStatuses"]["Worker"]["succeeded"] == 2
    for kind in ("Secret", "ConfigMap", "Service", "Pod", "Job"):
        for obj in await c.items(kind):
            if obj["metadata"].get("labels", {}).get(L.LABEL_REPLICA) == "partitioner":
                continue  # owned by the Job
            (ref,) = obj["metadata"]["ownerReferences"]
            assert ref["uid"] == "uid-graphsage" and ref["kind"] == "GraphJob"
    reasons = [e["reason"] for e in await c.items("Event")]
    for reason in ("JobCreated", "JobStarted", "PartitionCompleted", "StoreServersReady"):
        assert reason in reasons
    assert "TrainingCompleted" in reasons


async def test_worker_failure_restart_then_fail(cluster: Cluster) -> None:
    c = cluster
    await c.create_graphjob(example(backoffLimit=1))
    await eventually(lambda: c.names("Pod", "partitioner"))
    await c.finish_partitioner()
    workers = await eventually(n_workers(c))
    line = "graphrun: job failed: trainer:1 on m1 failed (exit code 3): RuntimeError: nan loss"
    await c.set_pod(workers[1], "Failed", exit_code=1, message=line)
    await eventually(lambda: _restarts(c, 1))

    async def recreated() -> bool:
        pods = [
            p
            for p in await c.items("Pod")
            if p["metadata"]["labels"].get(L.LABEL_REPLICA) == "worker"
        ]
        return len(pods) == 2 and all(
            p["spec"]["containers"][0]["args"][-1] == "--resume" for p in pods
        )

    await eventually(recreated)
    warnings = [e for e in await c.items("Event") if e["type"] == "Warning"]
    (restart,) = [e for e in warnings if e["reason"] == "RoleFailed"]
    assert restart["message"].endswith(
        "Serving -> Restarting: trainer:1 on m1 failed (exit code 3): RuntimeError: nan loss"
    )
    assert restart["involvedObject"]["name"] == "graphsage"
    await c.set_pod("graphsage-worker-0", "Failed", exit_code=137, message="OOMKilled")
    await eventually(phase_is(c, "Failed"))
    failed = next(x for x in (await c.status())["conditions"] if x["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert failed["message"] == "worker:m0 on m0 failed (exit code 137): OOMKilled"


async def test_distributed_partitioning_on_the_worker_pods(cluster: Cluster) -> None:
    """partition.mode distributed: no partitioner Job; the worker pods partition (their
    init container), a rank failing by itself restarts the job naming it, then they
    partition again, serve and train."""
    c = cluster
    doc = example(backoffLimit=1)
    doc["spec"]["partition"]["mode"] = "distributed"
    doc["spec"]["partition"].pop("method")
    await c.create_graphjob(doc)
    await eventually(phase_is(c, "Partitioning"))
    w0, w1 = await eventually(n_workers(c))
    assert await c.names("Job") == [] and await c.names("Pod", "partitioner") == []
    for w in (w0, w1):
        await c.set_partition(w, "running")

    async def steps() -> dict[str, str] | None:
        pods = (await c.status()).get("partitionPods")
        return pods if pods == {w0: "Partitioning", w1: "Partitioning"} else None

    await eventually(steps)
    message = (await c.status())["message"]
    assert message == f"2 worker pods partition together: {w0} Partitioning, {w1} Partitioning"
    lost = "graphrun: error: rank 0: barrier failed (Connection closed by peer)"
    await c.set_partition(w0, "terminated", PEER_LOST_EXIT, lost)  # it only lost rank 1
    await c.set_partition(w1, "terminated", 137, "Killed")
    await eventually(lambda: _restarts(c, 1))
    # The blame is in the Warning event: the Restarting condition's message moves on to
    # "restart 1: roles start again" as soon as the pods are gone (kmock deletes at once).
    warnings = [e for e in await c.items("Event") if e["type"] == "Warning"]
    (restart,) = [e for e in warnings if e["reason"] == "RoleFailed"]
    assert restart["message"].endswith(
        "Partitioning -> Restarting: partitioner:1 on m1 failed (exit code 137): Killed"
    )

    async def fresh_workers() -> list[str] | None:
        pods = await c.items("Pod")
        waiting = [p["metadata"]["name"] for p in pods if not p.get("status", {}).get("phase")]
        return waiting if len(waiting) == 2 else None  # made again, not yet run

    await eventually(fresh_workers)
    await eventually(phase_is(c, "Partitioning"))
    for w in (w0, w1):
        await c.set_partition(w, "terminated")
    await eventually(phase_is(c, "Serving"))
    for w in (w0, w1):
        await c.set_pod(w, "Running", ready=True)
    await eventually(phase_is(c, "Training"))
    for w in (w0, w1):
        await c.set_pod(w, "Succeeded")
    await eventually(phase_is(c, "Succeeded"))
    assert (await c.status())["partitioned"] is True
    events = await c.items("Event")
    reasons = [e["reason"] for e in events]
    for reason in ("PodPartitioning", "PodPartitionFailed", "PodPartitioned", "PartitionCompleted"):
        assert reason in reasons
    failed_steps = [e["message"] for e in events if e["reason"] == "PodPartitionFailed"]
    assert (
        f"pod {w0} (machine m0, rank 0 of 2) failed while partitioning (exit code 3) "
        "(it lost a peer)" in failed_steps
    )
    assert await c.names("Job") == []


async def _restarts(c: Cluster, n: int) -> bool:
    return (await c.status()).get("restarts") == n


async def test_suspend_and_resume(cluster: Cluster) -> None:
    c = cluster
    await c.create_graphjob(example())
    await eventually(lambda: c.names("Pod", "partitioner"))
    await c.finish_partitioner()
    await eventually(n_workers(c))
    await c.patch(f"{GJ}/graphsage", {"spec": {"runPolicy": {"suspend": True}}})
    await eventually(phase_is(c, "Suspended"))

    async def no_workers() -> bool:
        return await c.names("Pod", "worker") == []

    await eventually(no_workers)
    await c.patch(f"{GJ}/graphsage", {"spec": {"runPolicy": {"suspend": False}}})
    await eventually(phase_is(c, "Serving"))
    await eventually(n_workers(c))
    status = await c.status()
    suspended = next(x for x in status["conditions"] if x["type"] == "Suspended")
    assert suspended["status"] == "False" and suspended["reason"] == "JobResumed"


async def test_failure_with_clean_pod_policy_all_then_deletion(cluster: Cluster) -> None:
    c = cluster
    await c.create_graphjob(example(cleanPodPolicy="All"))
    await eventually(lambda: c.names("Pod", "partitioner"))
    await c.finish_partitioner()
    workers = await eventually(n_workers(c))
    await c.set_pod(workers[0], "Failed", exit_code=2)
    await eventually(phase_is(c, "Failed"))

    async def all_gone() -> bool:
        return await c.names("Pod") == [] and await c.names("Job") == []

    await eventually(all_gone)
    # Deleting the GraphJob: the API server's garbage collector removes its children
    # (owner references); the operator must not make new ones.
    await c.delete(f"{GJ}/graphsage")
    for kind in ("Secret", "ConfigMap", "Service"):
        for name in await c.names(kind):
            await c.delete(f"{PATHS[kind]}/{name}")
    await asyncio.sleep(1.0)  # three resync periods
    for kind in ("Secret", "ConfigMap", "Service", "Pod", "Job"):
        assert await c.names(kind) == []


@pytest.mark.parametrize("cluster", [600.0], indirect=True)
async def test_deadline_fires_on_time_between_resyncs(cluster: Cluster) -> None:
    # The plan's requeue_after wakes the job at its deadline; the 10-minute resync
    # would have failed it 10 minutes late. On a busy machine the 3 s may pass before
    # the job trains (it used to wait for Training then, and time out): it is driven
    # only while it has not failed, and the deadline is all that is asserted.
    c = cluster
    t0 = time.monotonic()
    await c.create_graphjob(example(activeDeadlineSeconds=3))

    def or_failed(check: Callable[[], Any]) -> Callable[[], Any]:
        async def either() -> Any:
            return "Failed" if await phase_is(c, "Failed")() else await check()

        either.__doc__ = f"{check.__doc__ or check} or phase Failed"
        return either

    if await eventually(or_failed(lambda: c.names("Pod", "partitioner"))) != "Failed":
        await c.finish_partitioner()
        workers = await eventually(or_failed(n_workers(c)))
        for w in [] if workers == "Failed" else workers:
            await c.set_pod(w, "Running", ready=True)
    await eventually(phase_is(c, "Failed"), timeout=30)
    assert time.monotonic() - t0 < 60  # not the resync's 600 s
    failed = next(x for x in (await c.status())["conditions"] if x["type"] == "Failed")
    assert failed["reason"] == "DeadlineExceeded"


async def test_invalid_spec_fails_naming_the_field(cluster: Cluster) -> None:
    c = cluster
    doc = example()
    doc["spec"]["placement"] = {"planFile": "plan.yaml"}
    await c.create_graphjob(doc)
    await eventually(phase_is(c, "Failed"))
    failed = next(x for x in (await c.status())["conditions"] if x["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.placement.planFile: the operator cannot read files" in failed["message"]
    await asyncio.sleep(0.7)
    assert await c.names("Pod") == [] and await c.names("Secret") == []


async def test_stuck_image_pull_fails_after_the_startup_deadline(cluster: Cluster) -> None:
    """The pod is stuck first, then its deadline passes (its creation is moved back):
    the other order — deadline first — is a plain StartupDeadlineExceeded, which the
    pod event of the timestamp patch used to produce now and then."""
    c = cluster
    await c.create_graphjob(example(startupDeadlineSeconds=60))
    pod = (await eventually(lambda: c.names("Pod", "partitioner")))[0]
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    await c.patch(
        f"{PATHS['Pod']}/{pod}/status",
        {
            "status": {
                "phase": "Pending",
                "containerStatuses": [{"name": "graphrun", "state": waiting}],
            }
        },
    )
    stamp = "2020-01-01T00:00:00Z"  # created long ago: past its deadline
    await c.patch(f"{PATHS['Pod']}/{pod}", {"metadata": {"creationTimestamp": stamp}})
    await eventually(phase_is(c, "Failed"))
    failed = next(x for x in (await c.status())["conditions"] if x["type"] == "Failed")
    assert failed["reason"] == "ImagePullBackOff"


async def test_graphrun_operator_command(kmock: Any, tmp_path: Path) -> None:
    """`graphrun operator --kubeconfig` as a process: logs in with the kubeconfig, runs
    a GraphJob to Partitioning, and stops cleanly on SIGTERM."""
    declare(kmock)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
                "users": [{"name": "test", "user": {"token": "test-token"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
                "current-context": "kmock",
            }
        )
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "graphrun", "operator", "--kubeconfig", str(kubeconfig),
        "--all-namespaces", "--resync", "0.3",
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        c = Cluster(kmock)
        await c.create_graphjob(example())
        await eventually(phase_is(c, "Partitioning"), timeout=60)
        assert await c.names("Secret") == ["graphsage-keys"]
        auth = [r.headers.get("Authorization") for r in kmock if r.headers.get("User-Agent")]
        assert "Bearer test-token" in auth
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()[-2000:]


def planned(**placement: Any) -> dict[str, Any]:
    """Three machines; the plan puts both stores on node-a and every trainer on node-b,
    so the third machine (node-idle) runs nothing."""
    doc = example()
    doc["spec"]["runtime"] = {"machines": 3, "trainersPerMachine": 1}
    plan = {
        "machines": ["node-a", "node-b", "node-idle"],
        "assignments": {
            "store:0": "node-a",
            "store:1": "node-a",
            "trainer:0": "node-b",
            "trainer:1": "node-b",
            "trainer:2": "node-b",
        },
    }
    doc["spec"]["placement"] = {"plan": plan, **placement}
    return doc


async def test_plan_lifecycle(cluster: Cluster) -> None:
    c = cluster
    await c.create_graphjob(planned(nodeLabel="graphrun.io/machine"))
    await eventually(lambda: c.names("Pod", "partitioner"))
    await c.finish_partitioner()
    workers = await eventually(n_workers(c, 2))
    assert workers == ["graphsage-worker-0", "graphsage-worker-1"]
    pods = {p["metadata"]["name"]: p for p in await c.items("Pod")}
    for name, node, roles in [
        ("graphsage-worker-0", "node-a", "store:0,store:1"),
        ("graphsage-worker-1", "node-b", "trainer:0,trainer:1,trainer:2"),
    ]:
        affinity = pods[name]["spec"]["affinity"]["nodeAffinity"]
        (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term["matchExpressions"] == [
            {"key": "graphrun.io/machine", "operator": "In", "values": [node]}
        ]
        assert pods[name]["metadata"]["annotations"][L.ANNOTATION_ROLES] == roles
    for w in workers:
        await c.set_pod(w, "Running", ready=True)
    await eventually(phase_is(c, "Training"))
    for w in workers:
        await c.set_pod(w, "Succeeded")
    await eventually(phase_is(c, "Succeeded"))
    assert (await c.status())["replicaStatuses"]["Worker"]["succeeded"] == 2
    assert await c.names("Pod", "worker") == workers  # never a pod for node-idle


async def test_planned_worker_pods_request_their_machines_resources(cluster: Cluster) -> None:
    c = cluster
    doc = planned(resources={"node-a": {"limits": {"memory": "64Gi"}}})
    plan = doc["spec"]["placement"]["plan"]
    plan["capacity"] = {m: {"cpu": 32, "memory_gb": 128} for m in plan["machines"]}
    plan["demands"] = {
        "store:0": {"cpu": 2, "memory_gb": 30},
        "store:1": {"cpu": 2, "memory_gb": 30},
    }
    plan["demands"].update({f"trainer:{r}": {"cpu": 8, "memory_gb": 1.2} for r in range(3)})
    await c.create_graphjob(doc)
    await eventually(lambda: c.names("Pod", "partitioner"))
    await c.finish_partitioner()
    await eventually(n_workers(c, 2))
    pods = {p["metadata"]["name"]: p for p in await c.items("Pod")}
    resources = {
        n: p["spec"]["containers"][0]["resources"] for n, p in pods.items() if "worker" in n
    }
    assert resources == {
        "graphsage-worker-0": {
            "requests": {"cpu": "4", "memory": "60G"},
            "limits": {"memory": "64Gi"},
        },
        "graphsage-worker-1": {
            "requests": {"cpu": "24", "memory": "3600M"},
            "limits": {"memory": "4Gi"},
        },
    }


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        (
            {"planFile": "plan.yaml"},
            "spec.placement.planFile: the operator cannot read files from your machine; "
            "put the plan inline as spec.placement.plan",
        ),
        (
            {"plan": {"machines": ["a", "b"], "assignments": {"trainer:9": "a"}}},
            "spec.placement.plan.assignments.trainer:9: the job has no such role",
        ),
        (
            {"plan": {"machines": ["a"], "assignments": {"trainer:0": "a"}}},
            "spec.placement.plan.machines: plan has 1 machines, the job has 2",
        ),
        (
            {
                "plan": {
                    "machines": ["a", "b"],
                    "assignments": {"store:0": "a", "store:1": "a"},
                    "capacity": {"a": {"cpu": 8, "memory_gb": 16}},
                    "demands": {"store:0": {"memory_gb": 10}, "store:1": {"memory_gb": 10}},
                }
            },
            "spec.placement.plan.capacity.a.memory_gb: the roles on a (store:0, store:1) "
            "need 20, the machine has 16",
        ),
        (
            {
                "plan": {
                    "machines": ["a", "b"],
                    "assignments": {},
                    "capacity": {"a": {"cpu": 8, "memory_gb": 16}},
                },
                "resources": {"a": {"requests": {"cpu": "9"}}},
            },
            "spec.placement.resources.a.requests.cpu: 9 of cpu is more than plan machine a has",
        ),
    ],
)
async def test_bad_plan_fails_naming_the_field(
    cluster: Cluster, placement: dict[str, Any], message: str
) -> None:
    c = cluster
    doc = example()
    doc["spec"]["placement"] = placement
    await c.create_graphjob(doc)
    await eventually(phase_is(c, "Failed"))
    failed = next(x for x in (await c.status())["conditions"] if x["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert message in failed["message"]
    assert await c.names("Pod") == []


async def test_an_unreachable_api_server_is_a_temporary_error() -> None:
    # nothing listens on port 1: the real client fails to connect; kopf must retry soon
    # (a TemporaryError with a delay), not spend its default backoff or give up
    cfg = client.Configuration(host="http://127.0.0.1:1")
    cfg.retries = 0
    ctx = OperatorContext(kube=Kube(client.ApiClient(cfg)), resync_seconds=10.0)
    with pytest.raises(kopf.TemporaryError) as info:
        await asyncio.to_thread(on_spec_change, ctx, NS, "graphsage")
    assert info.value.delay == 5.0


async def test_managed_by_another_controller_is_left_alone(cluster: Cluster) -> None:
    c = cluster
    doc = example()
    doc["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    await c.create_graphjob(doc)
    ours = example()
    ours["metadata"]["name"] = "ours"
    ours["spec"]["managedBy"] = "graphrun.io/graphrun-operator"
    ours["spec"]["partition"]["output"] = "ours/parts"
    await c.create_graphjob(ours)

    async def ours_started() -> bool:
        return (await c.status("ours")).get("phase") == "Partitioning"

    await eventually(ours_started)
    await asyncio.sleep(1.0)  # several resyncs (0.3 s)
    assert await c.status("graphsage") == {}  # no status, no children, no events
    for kind in ("Secret", "ConfigMap", "Service", "Pod", "Job", "NetworkPolicy"):
        owners = {o["metadata"].get("labels", {}).get(L.LABEL_JOB) for o in await c.items(kind)}
        assert "graphsage" not in owners, kind
    involved = {e["involvedObject"]["name"] for e in await c.items("Event")}
    assert "graphsage" not in involved


async def test_kueue_admission_eviction_and_requeue(cluster: Cluster) -> None:
    """The test plays Kueue: it removes the gates (admission), then marks the pods
    TerminationTarget and deletes them (eviction)."""
    c = cluster
    doc = example()
    doc["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    await c.create_graphjob(doc)
    await eventually(lambda: c.names("Pod", "partitioner"))
    assert await c.names("NetworkPolicy") == ["graphsage-pods"]
    await c.finish_partitioner()
    workers = await eventually(n_workers(c))

    async def queued() -> dict[str, Any] | None:
        conds = {x["type"]: x for x in (await c.status()).get("conditions", [])}
        q = conds.get("Queued")
        return q if q and q["status"] == "True" else None

    q = await eventually(queued)
    assert q["reason"] == "WaitingForAdmission" and "team-a" in q["message"]
    for w in workers:
        pod = await c.get(f"{PATHS['Pod']}/{w}")
        assert pod["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
        await c.patch(f"{PATHS['Pod']}/{w}", {"spec": {"schedulingGates": []}})

    async def admitted() -> bool:
        conds = {x["type"]: x for x in (await c.status()).get("conditions", [])}
        return conds.get("Queued", {}).get("reason") == "Admitted"

    await eventually(admitted)
    for w in workers:
        await c.set_pod(w, "Running", ready=True)
    await eventually(phase_is(c, "Training"))
    for w in workers:  # Kueue marks the pods, then deletes them (they terminate)
        cond = {
            "type": "TerminationTarget", "status": "True", "reason": "StoppedByKueue",
            "message": "Preempted to accommodate a higher priority Workload",
        }  # fmt: skip
        await c.patch(
            f"{PATHS['Pod']}/{w}/status",
            {"status": {"phase": "Running", "conditions": [cond]}},
        )
    # read as the phase was seen: the operator deletes the evicted pods (kmock at once)
    # and then queues the job again, which moves the Suspended condition on
    status = await eventually(phase_is(c, "Suspended"))
    suspended = next(x for x in status["conditions"] if x["type"] == "Suspended")
    assert suspended["reason"] == "Evicted" and "Preempted" in suspended["message"]
    for w in workers:  # the grace period is over
        await c.delete(f"{PATHS['Pod']}/{w}")

    async def requeued() -> bool:
        pods = [
            p for p in await c.items("Pod")
            if p["metadata"]["labels"].get(L.LABEL_REPLICA) == "worker"
            and not p["metadata"].get("deletionTimestamp")
        ]  # fmt: skip
        return len(pods) == 2 and all(
            p["spec"].get("schedulingGates")
            and p["spec"]["containers"][0]["args"][-1] == "--resume"
            for p in pods
        )

    await eventually(requeued)
    await eventually(queued)
    reasons = [e["reason"] for e in await c.items("Event")]
    for reason in ("Queued", "Admitted", "Evicted", "Requeued"):
        assert reason in reasons, reasons


async def test_parameter_servers_get_their_planned_worker_pod(cluster: Cluster) -> None:
    """training.sync ps: the plan puts ps:0 on the machine that would otherwise be idle,
    so it gets a worker pod of its own (running `graphrun worker`, which starts ps:0)."""
    c = cluster
    doc = planned(nodeLabel="graphrun.io/machine")
    doc["spec"]["training"] = {**doc["spec"]["training"], "sync": "ps", "staleness": 2}
    doc["spec"]["placement"]["plan"]["assignments"]["ps:0"] = "node-idle"
    await c.create_graphjob(doc)
    await eventually(lambda: c.names("Pod", "partitioner"))
    await c.finish_partitioner()
    workers = await eventually(n_workers(c, 3))
    pods = {p["metadata"]["name"]: p for p in await c.items("Pod")}
    assert pods["graphsage-worker-2"]["metadata"]["annotations"][L.ANNOTATION_ROLES] == "ps:0"
    hosts = json.loads((await c.items("ConfigMap"))[0]["data"]["hosts.json"])
    assert hosts["endpoints"]["ps:0"].startswith("graphsage-worker-2.")
    for w in workers:
        await c.set_pod(w, "Running", ready=True)
    await eventually(phase_is(c, "Training"))
    for w in workers:
        await c.set_pod(w, "Succeeded")
    await eventually(phase_is(c, "Succeeded"))


async def elastic_training(c: Cluster) -> list[str]:
    """An elastic job (3 machines, replicas 2, minMachines 2) created and brought to
    Training: partitioned, its 3 worker pods and its rendezvous pod running and ready;
    returns the worker pods' names."""
    doc = example()
    doc["spec"]["partition"]["parts"] = 3
    doc["spec"]["runtime"].update(machines=3, replicas=2, elastic={"minMachines": 2})
    await c.create_graphjob(doc)
    await eventually(lambda: c.names("Pod", "partitioner"))
    await c.finish_partitioner()
    workers = await eventually(n_workers(c, 3))
    (rdv,) = await eventually(lambda: c.names("Pod", "rendezvous"))
    for w in [*workers, rdv]:
        await c.set_pod(w, "Running", ready=True)
    await eventually(phase_is(c, "Training"))
    return list(workers)


async def test_elastic_job_goes_on_without_a_deleted_worker_pod(cluster: Cluster) -> None:
    """runtime.elastic: worker 1's pod deleted while the job trains is a lost machine:
    reported, not made again, and the job succeeds once the other workers finish."""
    c = cluster
    await elastic_training(c)
    await c.delete(f"{PATHS['Pod']}/graphsage-worker-1")

    async def lost() -> list[dict[str, Any]]:
        return list((await c.status()).get("lostMachines") or [])

    (entry,) = await eventually(lost)
    assert (entry["machine"], entry["pod"]) == ("m1", "graphsage-worker-1")
    assert entry["replaced"] is True and entry["replacement"] == "graphsage-worker-1"
    assert entry["tookOver"]["partitions"] == {"partition 1": "store:1:r on m2"}
    event = next(e for e in await c.items("Event") if e["reason"] == "MachineLost")
    assert event["type"] == "Warning"
    assert event["message"].startswith("machine m1 lost: pod graphsage-worker-1 ")
    assert any(e["reason"] == "MachineReplaced" for e in await c.items("Event"))
    await asyncio.sleep(1.0)  # a few resyncs (0.3 s): the pod is made again, once
    assert await c.names("Pod", "worker") == [f"graphsage-worker-{i}" for i in range(3)]
    pod = await c.get(f"{PATHS['Pod']}/graphsage-worker-1")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["GRAPHRUN_ELASTIC_JOIN"] == "1"  # its trainers join; no store servers
    status = await c.status()
    assert status["phase"] == "Training" and status["restarts"] == 0
    assert len(status["lostMachines"]) == 1
    for w in ("graphsage-worker-0", "graphsage-worker-2"):
        await c.set_pod(w, "Succeeded")
    await asyncio.sleep(1.0)
    assert (await c.status())["phase"] == "Training"  # the replacement still trains
    await c.set_pod("graphsage-worker-1", "Succeeded")
    await eventually(phase_is(c, "Succeeded"))
    status = await c.status()
    assert status["restarts"] == 0 and [e["machine"] for e in status["lostMachines"]] == ["m1"]


async def test_elastic_job_suspended_annotates_its_pods_before_deleting_them(
    cluster: Cluster,
) -> None:
    """A suspend stops the whole job: the worker pods are annotated graphrun.io/stop: job
    (a merge patch) before they are deleted, so their workers checkpoint rather than
    leave alone (graphrun.machine.stopmark)."""
    c = cluster
    workers = await elastic_training(c)
    seen: dict[str, dict[str, str]] = {}  # each pod's annotations when last seen
    done = threading.Event()

    async def watch() -> None:
        while not done.is_set():
            for p in await c.items("Pod"):
                seen[p["metadata"]["name"]] = dict(p["metadata"].get("annotations") or {})
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    await c.patch(f"{GJ}/graphsage", {"spec": {"runPolicy": {"suspend": True}}})

    async def no_workers() -> bool:
        return await c.names("Pod", "worker") == []

    await eventually(no_workers)
    done.set()
    await watcher
    for w in workers:
        assert seen[w].get("graphrun.io/stop") == "job", (w, seen[w])
        assert seen[w].get("graphrun.io/stop-at"), seen[w]  # deleted MARK_LEAD after it
    assert (await c.status())["phase"] == "Suspended"


async def test_elastic_job_survives_trainer_0s_pod_not_its_rendezvous_pod(
    cluster: Cluster,
) -> None:
    """The rendezvous is served by its own pod: losing trainer 0's worker pod is a lost
    machine the job goes on without (made again, in join mode); losing the rendezvous
    pod fails the attempt (backoffLimit 0: the job)."""
    c = cluster
    await elastic_training(c)
    svc = await c.get(f"{PATHS['Service']}/graphsage-workers")
    assert svc["spec"]["selector"] == {L.LABEL_JOB: "graphsage"}  # its DNS name too
    config = await c.get(f"{PATHS['ConfigMap']}/graphsage-config")
    hosts = json.loads(config["data"]["hosts.json"])
    assert hosts["rendezvous"].startswith("graphsage-rendezvous.graphsage-workers.ml.svc.")
    assert hosts["rendezvous_external"] is True
    await c.delete(f"{PATHS['Pod']}/graphsage-worker-0")  # m0 runs trainer 0

    async def lost() -> list[dict[str, Any]]:
        return list((await c.status()).get("lostMachines") or [])

    (entry,) = await eventually(lost)
    assert (entry["machine"], entry["replaced"]) == ("m0", True)
    await eventually(n_workers(c, 3))
    status = await c.status()
    assert status["phase"] == "Training" and status["restarts"] == 0
    await c.delete(f"{PATHS['Pod']}/graphsage-rendezvous")
    await eventually(phase_is(c, "Failed"))
    failed = next(x for x in (await c.status())["conditions"] if x["type"] == "Failed")
    assert "rendezvous on graphsage-rendezvous failed" in failed["message"]
    assert "the rendezvous pod graphsage-rendezvous disappeared" in failed["message"]

    async def pods_gone() -> bool:  # cleanPodPolicy Running: the workers and it go
        return await c.names("Pod", "worker") == [] and await c.names("Pod", "rendezvous") == []

    await eventually(pods_gone)


async def test_a_live_job_s_stores_log_on_the_shared_volume(
    cluster: Cluster, tmp_path: Path
) -> None:
    """spec.live: the ConfigMap's job gives the store servers' log directory on the
    shared volume (a PersistentVolumeClaim), and the worker pod's launch passes each
    main server and replica its partition's directory (--live-dir)."""
    from graphrun.machine.roles import load_job_launch

    c = cluster
    doc = example()
    doc["spec"]["live"] = {"follow": "head"}
    doc["spec"]["runtime"] = {**doc["spec"]["runtime"], "replicas": 2}
    await c.create_graphjob(doc)
    await eventually(lambda: c.names("ConfigMap"))
    (cm,) = await c.items("ConfigMap")
    job = yaml.safe_load(cm["data"]["job.yaml"])
    assert job["spec"]["live"]["logDir"] == "/data/runs/graphsage/live"
    for name, text in cm["data"].items():
        (tmp_path / name).write_text(text)
    launch = load_job_launch(tmp_path / "job.yaml", "0", tmp_path / "hosts.json", None)
    dirs = {}
    for r in launch.of_kind("store"):
        if "--backup-of" not in r.argv:
            dirs[str(r.role)] = r.argv[r.argv.index("--live-dir") + 1]
    assert dirs == {"store:0": "/data/runs/graphsage/live/0",
                    "store:1:r": "/data/runs/graphsage/live/1"}  # fmt: skip
    assert launch.live_dirs == ("/data/runs/graphsage/live/0", "/data/runs/graphsage/live/1")


async def test_a_live_log_off_the_shared_volume_is_refused(cluster: Cluster) -> None:
    c = cluster
    doc = example()
    doc["spec"]["live"] = {"logDir": "/var/lib/graphrun"}
    await c.create_graphjob(doc)
    await eventually(phase_is(c, "Failed"))
    failed = next(x for x in (await c.status())["conditions"] if x["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.live.logDir: '/var/lib/graphrun' is not on the shared volume" in failed["message"]
    assert await c.names("Pod") == []
