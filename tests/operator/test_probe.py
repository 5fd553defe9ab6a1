"""The probe Job's manifests (validated against the official schemas) and the reading of
its pods; the CLI against the API mock is in tests/cli/test_probe_kubernetes.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from graphrun.errors import PEER_LOST_EXIT, HostError
from graphrun.job.spec import GraphJob, parse_job
from graphrun.measure.member import MemberReport
from graphrun.operator import probe as P

ROOT = Path(__file__).resolve().parents[2]
K8S = kubernetes_validate.latest_version()
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}


def job(**worker_spec: Any) -> GraphJob:
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["spec"]["runtime"]["machines"] = 3
    d["spec"]["partition"]["parts"] = 3
    d["spec"]["replicaSpecs"]["worker"]["template"]["spec"].update(worker_spec)
    return parse_job(d)


def spec(**worker_spec: Any) -> P.ProbeSpec:
    return P.probe_spec(job(**worker_spec), "ml", seconds=0.5, timeout=300, suffix="ab12c")


def test_manifests_are_valid_kubernetes_objects() -> None:
    s = spec(nodeSelector={"pool": "gnn"})
    for obj in (P.build_probe_job(s), P.build_probe_service(s), P.build_probe_secret(s, "ab")):
        kubernetes_validate.validate(obj, K8S, strict=True)


def test_the_job_is_indexed_one_pod_per_member_and_bounded_in_time() -> None:
    j = P.build_probe_job(spec())["spec"]
    assert j["completionMode"] == "Indexed"
    assert j["completions"] == j["parallelism"] == 3  # runtime.machines
    assert j["backoffLimit"] == 0
    assert j["activeDeadlineSeconds"] > 300 and j["ttlSecondsAfterFinished"] > 0
    (c,) = j["template"]["spec"]["containers"]
    assert c["command"] == [
        "graphrun", "probe", "--member", "$(GRAPHRUN_PROBE_INDEX)", "--peers",
        "graphsage-probe-ab12c-0.graphsage-probe-ab12c:29500,"
        "graphsage-probe-ab12c-1.graphsage-probe-ab12c:29500,"
        "graphsage-probe-ab12c-2.graphsage-probe-ab12c:29500",
        "--seconds", "0.5", "--timeout", "300",
    ]  # fmt: skip
    index, key = c["env"]
    ref = index["valueFrom"]["fieldRef"]["fieldPath"]
    assert ref == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    # the key comes from the probe's Secret, never written into the Job itself
    assert key == {
        "name": "GRAPHRUN_PROBE_KEY",
        "valueFrom": {"secretKeyRef": {"name": "graphsage-probe-ab12c", "key": "key"}},
    }
    assert j["template"]["spec"]["subdomain"] == "graphsage-probe-ab12c"
    assert c["image"] == "ghcr.io/graphrun/graphrun:0.1.0"


def test_one_member_per_node_by_required_anti_affinity() -> None:
    s = spec()
    pod = P.build_probe_job(s)["spec"]["template"]
    (term,) = pod["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == {P.LABEL_PROBE: s.name}
    assert pod["metadata"]["labels"][P.LABEL_PROBE] == s.name  # the pods match it
    svc = P.build_probe_service(s)["spec"]
    assert svc["clusterIP"] == "None" and svc["selector"] == {P.LABEL_PROBE: s.name}


def test_least_privilege_no_token_no_account_no_volumes_no_privileges() -> None:
    pod = P.build_probe_job(spec())["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod and "volumes" not in pod
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "volumeMounts" not in c
    assert c["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert c["resources"]["limits"] == {"memory": "2Gi"}  # no CPU limit: they measure the node


def test_pods_go_where_the_workers_may_go() -> None:
    s = spec(
        nodeSelector={"pool": "gnn"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [ZONE]}]
                }
            },
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
        },
        imagePullSecrets=[{"name": "registry"}],
        containers=[{"name": "graphrun", "image": "registry.example/graphrun:dev"}],
    )
    pod = P.build_probe_job(s)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gnn"}
    assert pod["tolerations"][0]["key"] == "gpu"
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [ZONE]}]
    assert set(pod["affinity"]) == {"nodeAffinity", "podAntiAffinity"}  # not the workers' pods
    assert pod["containers"][0]["image"] == "registry.example/graphrun:dev"


def test_names_fit_a_hostname_for_the_longest_job_and_most_members() -> None:
    d = job().model_dump(by_alias=True, exclude_none=True)
    d["metadata"]["name"] = "j" * 40  # JOB_NAME_MAX
    s = P.probe_spec(parse_job(d), "ml", members=100)
    assert len(f"{s.name}-99") <= 63
    assert P.build_probe_service(s)["metadata"]["name"][0].isalpha()


# --- reading the pods ---------------------------------------------------------------------


def pod(s: P.ProbeSpec, i: int, phase: str, node: str = "", **terminated: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if terminated:
        status["containerStatuses"] = [{"name": "probe", "state": {"terminated": terminated}}]
    return {
        "metadata": {"name": f"{s.name}-{i}-x", "labels": {P.LABEL_PROBE: s.name}},
        "spec": {"nodeName": node} if node else {},
        "status": status,
    }


def report(i: int, n: int = 3) -> str:
    links = tuple((j, 1.25e8 * (i + 1), 1e-4) for j in range(n) if j != i)
    return MemberReport(i, 4.0, 0.01, 16 * 2**30, links).to_message()


def test_members_done_become_machines_named_after_their_nodes() -> None:
    s = spec()
    pods = [pod(s, i, "Succeeded", f"node-{i}", exitCode=0, message=report(i)) for i in range(3)]
    pods.append({**pod(s, 5, "Succeeded"), "metadata": {"name": "other", "labels": {}}})
    members = P.read_members(pods, s)
    assert not members.failure and sorted(members.done) == [0, 1, 2]
    out = P.cluster_of(members, s)
    machines = out["cluster"]["machines"]
    assert [m["name"] for m in machines] == ["node-0", "node-1", "node-2"]
    assert [m["egress_gbps"] for m in machines] == [1.0, 2.0, 3.0]
    assert machines[0]["ingress_gbps"] == 3.0 and machines[0]["memory_gb"] == 16.0
    assert set(out["measured"]["pairs"]) == {
        f"node-{a}->node-{b}" for a in range(3) for b in range(3) if a != b
    }


def test_the_member_that_failed_by_itself_is_blamed_not_those_that_lost_it() -> None:
    s = spec()
    lost = "graphrun: error: probe member 0: member 2 (x:1): no connection (refused)"
    pods = [
        pod(s, 0, "Failed", "node-0", exitCode=PEER_LOST_EXIT, message=lost),
        pod(s, 1, "Running", "node-1"),
        pod(s, 2, "Failed", "node-2", exitCode=137, reason="OOMKilled"),
    ]
    members = P.read_members(pods, s)
    assert members.failure == f"probe pod {s.name}-2-x on node-2 failed (exit code 137): OOMKilled"
    alone = P.read_members(pods[:2], s)
    assert alone.failure.endswith(f"(exit code {PEER_LOST_EXIT}): {lost}")


def test_a_failed_job_without_a_failed_pod_and_the_reasons_pods_wait() -> None:
    s = spec()
    unschedulable = pod(s, 1, "Pending")
    unschedulable["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules.",
        }
    ]
    members = P.read_members([unschedulable], s)
    assert members.waiting == [
        f"{s.name}-1-x (Unschedulable: 0/2 nodes are available: 2 node(s) didn't match "
        "pod anti-affinity rules.)"
    ]
    job = {"status": {"conditions": [{"type": "Failed", "status": "True",
                                      "reason": "DeadlineExceeded"}]}}  # fmt: skip
    assert P.read_members([], s, job).failure == f"probe Job {s.name} failed: DeadlineExceeded"


def test_two_members_on_one_node_or_a_missing_member_are_refused() -> None:
    s = spec()
    pods = [pod(s, i, "Succeeded", "node-0", exitCode=0, message=report(i)) for i in range(3)]
    with pytest.raises(HostError, match="members 0 and 1 both ran on node node-0"):
        P.cluster_of(P.read_members(pods, s), s)
    with pytest.raises(HostError, match=r"no report from member\(s\) 2"):
        P.cluster_of(P.read_members(pods[:2], s), s)
    garbled = copy.deepcopy(pods[0])
    garbled["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = "oops"
    with pytest.raises(HostError, match=f"probe pod {s.name}-0-x on node-0: the termination"):
        P.read_members([garbled], s)


class FakeKube:
    """The calls run_probe makes, recorded; ``fail`` raises from one of them."""

    def __init__(self, fail: dict[str, BaseException]) -> None:
        self.fail = fail
        self.calls: list[tuple[str, str]] = []

    def _call(self, what: str, name: str) -> None:
        self.calls.append((what, name))
        if what in self.fail:
            raise self.fail[what]

    def create(self, namespace: str, obj: dict[str, Any]) -> None:
        self._call(f"create {obj['kind']}", obj["metadata"]["name"])

    def delete(self, namespace: str, kind: str, name: str) -> None:
        self._call(f"delete {kind}", name)

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self._call("list", selector)
        return []

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


@pytest.mark.parametrize(
    "fail",
    [
        {"list": KeyboardInterrupt()},
        {"create Job": P.KubeError("create Job ml/x: 403 Forbidden")},
        {"list": KeyboardInterrupt(), "delete Job": P.KubeError("delete Job: 500")},
    ],
    ids=["interrupted", "create-refused", "delete-fails-too"],
)
def test_the_probe_deletes_its_objects_however_it_ends(fail: dict[str, Any]) -> None:
    s = spec()
    kube = FakeKube(fail)
    first = next(iter(fail.values()))
    with pytest.raises(type(first)) as got:
        P.run_probe(kube, s, sleep=lambda _: None)
    assert got.value is first  # not masked by a failing delete
    assert kube.calls[-3:] == [
        ("delete Job", s.name), ("delete Service", s.name), ("delete Secret", s.name)
    ]  # fmt: skip


def test_the_probe_times_out_and_deletes() -> None:
    s = spec()
    kube = FakeKube({})
    now = iter(range(0, 10_000, 100))
    with pytest.raises(HostError, match=r"0 of 3 members done after 300s .*: no pods yet"):
        P.run_probe(kube, s, clock=lambda: next(now), sleep=lambda _: None)
    assert kube.calls[-3:] == [
        ("delete Job", s.name), ("delete Service", s.name), ("delete Secret", s.name)
    ]  # fmt: skip


def test_a_report_of_the_most_members_fits_a_termination_message() -> None:
    n = P.MAX_MEMBERS
    links = tuple((j, 123.456e9 + j, 1.23456789e-4) for j in range(n - 1))  # 1 Tbit/s
    assert len(MemberReport(n - 1, 256.0, 0.01, 2**42, links).to_message()) <= 4096
