"""``graphrun probe --hosts kubernetes`` against kmock, a Kubernetes API mock on loopback:
the CLI creates the probe's Job and Service with the official client through a
kubeconfig; the test plays the Job controller and the kubelet (it makes the member pods,
on their nodes, with the statuses and termination messages they end with)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml

from graphrun.cli import main
from graphrun.errors import PEER_LOST_EXIT
from graphrun.measure.member import MemberReport
from graphrun.operator import probe as P
from graphrun.placement.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[2]
NS = "ml"
PODS = f"/api/v1/namespaces/{NS}/pods"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
SERVICES = f"/api/v1/namespaces/{NS}/services"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
VERBS = {"list", "watch", "get", "patch", "create", "delete"}


def declare(api: Any) -> None:
    kinds = [("v1/pods", "Pod"), ("v1/services", "Service"), ("v1/secrets", "Secret"),
             ("batch/v1/jobs", "Job")]  # fmt: skip
    for path, kind in kinds:
        api.resources[path] = kmock.ResourceInfo(kind=kind, namespaced=True, verbs=VERBS)


def kubeconfig(tmp_path: Path, url: str) -> Path:
    """A kubeconfig whose current context is the mock, in namespace ml."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "mock", "cluster": {"server": url}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "mock", "context": {"cluster": "mock", "user": "me", "namespace": NS}}
                ],
                "current-context": "mock",
            }
        )
    )
    return path


async def items(api: Any, path: str) -> list[dict[str, Any]]:
    async with api.get(path) as resp:
        return list((await resp.json()).get("items") or []) if resp.status == 200 else []


async def assert_nothing_left(api: Any) -> None:
    """The probe's Job, Service and Secret are all deleted, however it ended."""
    for path in (JOBS, SERVICES, SECRETS):
        assert await items(api, path) == [], path


async def the_job(api: Any, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not (jobs := await items(api, JOBS)):
        assert time.monotonic() < deadline, "the CLI made no Job"
        await asyncio.sleep(0.05)
    return jobs[0]


async def kubelet(api: Any, job: dict[str, Any], i: int, node: str, **terminated: Any) -> None:
    """Member ``i``'s pod, as the Job controller makes it and the kubelet ends it (or, on
    no ``node``, as the scheduler leaves it: Pending, unschedulable)."""
    tpl = job["spec"]["template"]
    status: dict[str, Any] = {
        "phase": "Succeeded" if terminated.get("exitCode", 0) == 0 else "Failed",
        "containerStatuses": [{"name": "probe", "state": {"terminated": terminated}}],
    }
    if not node:
        why = "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        status = {"phase": "Pending", "conditions": [{**cond, "message": why}]}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **tpl["metadata"],
            "name": f"{job['metadata']['name']}-{i}-q{i}x",
            "annotations": {P.INDEX_ANNOTATION: str(i)},
        },
        "spec": {**tpl["spec"], "nodeName": node, "hostname": f"{job['metadata']['name']}-{i}"},
        "status": status,
    }
    async with api.post(PODS, json=pod) as resp:
        assert resp.status == 200, await resp.text()


def report(i: int, n: int) -> str:
    links = tuple((j, 1.25e8 * (i + 1), 2e-4) for j in range(n) if j != i)
    return MemberReport(i, 2.0 + i, 0.01, 8 * 2**30, links).to_message()


async def probe(api: Any, tmp_path: Path, *extra: str) -> tuple[asyncio.Task[int], dict[str, Any]]:
    """``graphrun probe --hosts kubernetes`` of the example job, running in a thread
    against the mock; the Job it made."""
    declare(api)
    config = kubeconfig(tmp_path, str(api.url).rstrip("/"))
    argv = ["probe", "--hosts", "kubernetes", "--job", str(ROOT / "examples" / "kubernetes" /
            "graphsage.yaml"), "--kubeconfig", str(config), "-o", str(tmp_path / "c.yaml"),
            "--timeout", "60", *extra]  # fmt: skip
    done = asyncio.create_task(asyncio.to_thread(main, argv))
    return done, await the_job(api)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_probe_job_reports_become_the_cluster_file_and_everything_is_deleted(
    kmock: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done, job = await probe(kmock, tmp_path)
    assert job["metadata"]["name"].startswith("graphsage-probe-")
    assert job["spec"]["completions"] == 2  # the example's runtime.machines
    (svc,) = await items(kmock, SERVICES)
    assert svc["metadata"]["name"] == job["metadata"]["name"]
    (secret,) = await items(kmock, SECRETS)  # the probe's key, a fresh one per probe
    assert secret["metadata"]["name"] == job["metadata"]["name"]
    assert len(base64.b64decode(secret["data"]["key"])) == 64  # 32 bytes, hex
    for i, node in enumerate(["gpu-node-7", "cpu-node-2"]):
        await kubelet(kmock, job, i, node, exitCode=0, message=report(i, 2))
    assert await asyncio.wait_for(done, 30) == 0
    out = capsys.readouterr()
    c = load_cluster(tmp_path / "c.yaml")  # what graphrun plan reads
    assert c.names == ("gpu-node-7", "cpu-node-2") and c.cpu == (2.0, 3.0)
    assert [e * 8 / 1e9 for e in c.egress] == [1.0, 2.0]
    assert json.loads(out.out)["pairs"]["cpu-node-2->gpu-node-7"]["latency_ms"] == 0.2
    assert f"Job {NS}/{job['metadata']['name']}" in out.err
    await assert_nothing_left(kmock)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_failed_member_fails_the_probe_in_one_line_naming_pod_and_node(
    kmock: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done, job = await probe(kmock, tmp_path, "--members", "3")
    lost = "graphrun: error: probe member 0: member 1 (x:29500): no connection"
    await kubelet(kmock, job, 0, "node-a", exitCode=PEER_LOST_EXIT, message=lost)
    # the probe polls every second: it sees the member that lost its peer first, and
    # waits for the peer that failed by itself (it blamed member 0 under load before)
    await asyncio.sleep(2.5)
    await kubelet(kmock, job, 1, "node-b", exitCode=1, message="Traceback...\nImportError: torch")
    assert await asyncio.wait_for(done, 30) == 1
    err = capsys.readouterr().err.strip().splitlines()
    name = job["metadata"]["name"]
    assert err[-1] == (
        f"graphrun: error: probe pod {name}-1-q1x on node-b failed (exit code 1): "
        "ImportError: torch"
    )
    assert not (tmp_path / "c.yaml").exists()
    await assert_nothing_left(kmock)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_member_that_only_lost_its_peer_is_blamed_once_no_culprit_reports(
    kmock: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.setattr(P, "PEER_GRACE", timedelta(seconds=1.5))
    done, job = await probe(kmock, tmp_path, "--members", "3")
    lost = "graphrun: error: probe member 0: member 1 (x:29500): no connection"
    await kubelet(kmock, job, 0, "node-a", exitCode=PEER_LOST_EXIT, message=lost)
    assert await asyncio.wait_for(done, 30) == 1
    name = job["metadata"]["name"]
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"graphrun: error: probe pod {name}-0-q0x on node-a failed (exit code "
        f"{PEER_LOST_EXIT}): {lost}"
    )
    await assert_nothing_left(kmock)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_members_that_never_run_time_out_naming_why_they_wait(
    kmock: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done, job = await probe(kmock, tmp_path, "--timeout", "2")
    await kubelet(kmock, job, 0, "node-a", exitCode=0, message=report(0, 2))
    await kubelet(kmock, job, 1, "")
    assert await asyncio.wait_for(done, 30) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (
        f"graphrun: error: probe: 1 of 2 members done after 2s (--timeout); waiting: "
        f"{job['metadata']['name']}-1-q1x (Unschedulable: 0/2 nodes are available: "
        "2 node(s) didn't match pod anti-affinity rules.)"
    )
    await assert_nothing_left(kmock)


def test_bad_input_is_one_line_naming_the_file_and_field(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "job.yaml"
    doc = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    doc["spec"]["runtime"]["machines"] = 0
    bad.write_text(yaml.safe_dump(doc))
    out = tmp_path / "c.yaml"
    argv = ["probe", "--hosts", "kubernetes", "-o", str(out)]
    assert main([*argv, "--job", str(bad), "--kubeconfig", str(tmp_path / "none")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"graphrun: error: {bad}: spec.runtime.machines: ")
    assert main(argv) == 2
    assert "--job: give it exactly with --hosts kubernetes" in capsys.readouterr().err
    assert main([*argv, "--job", str(bad), "--members", "0"]) == 2
    assert "--members: must be 1 to 100" in capsys.readouterr().err
    assert main(["probe", "--member", "3", "--peers", "a:1,b:2"]) == 2
    assert "--member: 3 is not an index of the 2 peers" in capsys.readouterr().err
    assert not out.exists()
