"""The Kubernetes half of ``graphrun probe``: one short Job over the nodes a GraphJob may use.

For ``graphrun probe --hosts kubernetes --job JOB`` the CLI creates, in the job's namespace,
three objects named ``P = <job>-probe-<5 hex>`` (labelled ``graphrun.io/probe: P``)::

    Secret   P   the probe's key (32 random bytes, hex): the members tag every message
                 with it (:mod:`graphrun.measure.member`); read by the pods as an
                 environment variable, never written into the Job
    Service  P   headless: member i is P-i.P (published before it is ready)
    Job      P   Indexed, completions = parallelism = N (the job's runtime.machines or
                 --members), backoffLimit 0, activeDeadlineSeconds, ttlSecondsAfterFinished;
                 pod i runs `graphrun probe --member i --peers P-0.P:PORT,...`
                 (:mod:`graphrun.measure.member`) and writes its report to its
                 termination message

The pods go where the job's worker pods may go — the worker template's node selector,
tolerations, node affinity, image pull secrets and priority class, and its image — one
per node (a required pod anti-affinity on the probe label over
``kubernetes.io/hostname``). They need nothing of the API: no service account token,
no RBAC, no volumes; they run as the image's user without privileges, asking for little
CPU and memory and limited in memory only (the members measure their node: the CPU they
can get and the node's MemTotal).

:func:`read_members` turns the pods the API lists into the members' reports (the node
each ran on becomes its machine name) or one line naming the pod that failed;
:func:`run_probe` is the thin shell that creates, waits, reads and always deletes.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphrun.errors import HostError, KubeError
from graphrun.job.blame import culprit, lost_a_peer
from graphrun.job.spec import GraphJob
from graphrun.measure.member import KEY_BYTES, KEY_ENV, MemberReport
from graphrun.measure.probe import HostMeasure, LinkMeasure, assemble
from graphrun.operator.kube import Kube
from graphrun.operator.layout import OperatorConfig
from graphrun.operator.pods import PEER_GRACE

LABEL_PROBE = "graphrun.io/probe"
MANAGED_BY = {"app.kubernetes.io/managed-by": "graphrun-probe"}
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
INDEX_ENV = "GRAPHRUN_PROBE_INDEX"
CONTAINER = "probe"
MAX_MEMBERS = 100  # the reports of 100 members fit a termination message (4096 bytes)
PORT = 29500
IMAGE_UID = 10001  # the Dockerfile's user
TTL_SECONDS = 600  # the Job outlives a CLI that died before deleting it by this long
SCHEDULING_FIELDS = ("nodeSelector", "tolerations", "imagePullSecrets", "priorityClassName")


@dataclass(frozen=True)
class ProbeSpec:
    """One probe run: what the builders need, decided at the edge."""

    name: str
    namespace: str
    members: int
    image: str
    image_pull_policy: str = "IfNotPresent"
    seconds: float = 1.0
    timeout: int = 600
    scheduling: dict[str, Any] = field(default_factory=dict)  # pod spec fields to copy

    def host(self, index: int) -> str:
        return f"{self.name}-{index}.{self.name}"

    @property
    def selector(self) -> str:
        return f"{LABEL_PROBE}={self.name}"


def probe_spec(
    job: GraphJob,
    namespace: str,
    *,
    members: int | None = None,
    image: str | None = None,
    seconds: float = 1.0,
    timeout: int = 600,
    config: OperatorConfig | None = None,
    suffix: str | None = None,
) -> ProbeSpec:
    """The probe of the nodes ``job``'s worker pods may use (its worker template's
    scheduling fields and image; ``runtime.machines`` members unless ``members``)."""
    config = config or OperatorConfig()
    user = job.spec.replica_specs.worker
    pod = (user.template.get("spec") or {}) if user else {}
    containers = pod.get("containers") or [{}]
    main = next((c for c in containers if c.get("name") == "graphrun"), containers[0])
    scheduling = {k: copy.deepcopy(pod[k]) for k in SCHEDULING_FIELDS if pod.get(k)}
    node_affinity = (pod.get("affinity") or {}).get("nodeAffinity")
    if node_affinity:
        scheduling["affinity"] = {"nodeAffinity": copy.deepcopy(node_affinity)}
    return ProbeSpec(
        name=f"{job.name}-probe-{suffix or secrets.token_hex(3)[:5]}",
        namespace=namespace,
        members=members or job.spec.runtime.machines,
        image=image or main.get("image") or job.spec.image or config.image,
        image_pull_policy=(
            main.get("imagePullPolicy") or job.spec.image_pull_policy or config.image_pull_policy
        ),
        seconds=seconds,
        timeout=timeout,
        scheduling=scheduling,
    )


def _labels(spec: ProbeSpec) -> dict[str, str]:
    return {LABEL_PROBE: spec.name, **MANAGED_BY}


def _metadata(spec: ProbeSpec) -> dict[str, Any]:
    return {"name": spec.name, "namespace": spec.namespace, "labels": _labels(spec)}


def build_probe_secret(spec: ProbeSpec, key_hex: str) -> dict[str, Any]:
    """The probe's key, for its pods only (they take it as ``$GRAPHRUN_PROBE_KEY``)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec),
        "type": "Opaque",
        "data": {"key": base64.b64encode(key_hex.encode()).decode()},
    }


def build_probe_service(spec: ProbeSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_PROBE: spec.name},
            "ports": [{"name": "probe", "port": PORT, "targetPort": PORT, "protocol": "TCP"}],
        },
    }


def member_argv(spec: ProbeSpec) -> list[str]:
    """The members' command; the kubelet puts each pod's index in ``$(INDEX_ENV)``."""
    peers = ",".join(f"{spec.host(i)}:{PORT}" for i in range(spec.members))
    return [
        "graphrun", "probe", "--member", f"$({INDEX_ENV})", "--peers", peers,
        "--seconds", f"{spec.seconds:g}", "--timeout", str(spec.timeout),
    ]  # fmt: skip


def build_probe_job(spec: ProbeSpec) -> dict[str, Any]:
    """The Indexed Job: one member per node, least privilege, bounded in time."""
    pod: dict[str, Any] = copy.deepcopy(spec.scheduling)
    anti = {
        "labelSelector": {"matchLabels": {LABEL_PROBE: spec.name}},
        "topologyKey": "kubernetes.io/hostname",
    }
    pod.setdefault("affinity", {})["podAntiAffinity"] = {
        "requiredDuringSchedulingIgnoredDuringExecution": [anti]
    }
    index_ref = f"metadata.annotations['{INDEX_ANNOTATION}']"
    pod |= {
        "restartPolicy": "Never",
        "subdomain": spec.name,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": IMAGE_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": CONTAINER,
                "image": spec.image,
                "imagePullPolicy": spec.image_pull_policy,
                "command": member_argv(spec),
                "env": [
                    {"name": INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": index_ref}}},
                    {
                        "name": KEY_ENV,
                        "valueFrom": {"secretKeyRef": {"name": spec.name, "key": "key"}},
                    },
                ],
                "ports": [{"name": "probe", "containerPort": PORT, "protocol": "TCP"}],
                "resources": {
                    "requests": {"cpu": "100m", "memory": "256Mi"},
                    "limits": {"memory": "2Gi"},  # torch, and a busy process per core
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(spec),
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.members,
            "parallelism": spec.members,
            "backoffLimit": 0,
            "activeDeadlineSeconds": spec.timeout + 60,  # the CLI gives up first
            "ttlSecondsAfterFinished": TTL_SECONDS,
            "template": {"metadata": {"labels": _labels(spec)}, "spec": pod},
        },
    }


# --- reading the pods --------------------------------------------------------------------


@dataclass(frozen=True)
class Members:
    """What the pods say so far: each finished member's node and report, the pods still
    waiting (with the scheduler's or kubelet's reason), and a failure line or "";
    ``bystander``: the failure only lost a peer and a member has not ended yet (the one
    that failed by itself may still report)."""

    done: dict[int, tuple[str, MemberReport]]
    waiting: list[str]
    failure: str = ""
    bystander: bool = False


def _terminated(pod: dict[str, Any]) -> dict[str, Any]:
    """The probe container's ``terminated`` state (the first container's), or {}."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    cs = next((c for c in statuses if c.get("name") == CONTAINER), statuses[0])
    return dict((cs.get("state") or {}).get("terminated") or {})


def _waiting_reason(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason', 'unscheduled')}: {cond.get('message', '')}".strip()
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason', 'waiting')}: {waiting.get('message', '')}".strip()
    return status.get("phase") or "Pending"


def _failure(pod: dict[str, Any]) -> tuple[int | None, str]:
    """(exit code, one line) of a failed pod."""
    name = pod["metadata"]["name"]
    node = (pod.get("spec") or {}).get("nodeName") or "no node"
    term = _terminated(pod)
    code = term.get("exitCode")
    text = (term.get("message") or "").strip().splitlines()
    reason = text[-1] if text else term.get("reason") or (pod.get("status") or {}).get("reason")
    what = "no exit code" if code is None else f"exit code {code}"
    return code, f"probe pod {name} on {node} failed ({what}): {reason or 'no reason given'}"


def read_members(
    pods: Sequence[dict[str, Any]], spec: ProbeSpec, job: dict[str, Any] | None = None
) -> Members:
    """The members' state from the probe's pods (and its Job's conditions). A failed pod
    is blamed before the members that only lost it (exit PEER_LOST_EXIT), by the rule
    of :mod:`graphrun.job.blame`."""
    done: dict[int, tuple[str, MemberReport]] = {}
    waiting, failed = [], []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL_PROBE) != spec.name:
            continue
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Failed":
            failed.append(_failure(pod))
        elif phase == "Succeeded":
            node = (pod.get("spec") or {}).get("nodeName") or meta["name"]
            report = MemberReport.from_message(
                _terminated(pod).get("message") or "", f"probe pod {meta['name']} on {node}"
            )
            done[report.index] = (node, report)
        else:
            waiting.append(f"{meta['name']} ({_waiting_reason(pod)})")
    if failed:
        code, line = culprit(failed, lambda f: (f[0], f[1], None)) or failed[0]
        ended = len(done) + len(failed) >= spec.members
        return Members(done, waiting, line, bystander=lost_a_peer(code, line) and not ended)
    for cond in ((job or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            why = ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
            return Members(done, waiting, f"probe Job {spec.name} failed: {why or 'no reason'}")
    return Members(done, waiting)


def cluster_of(members: Members, spec: ProbeSpec) -> dict[str, Any]:
    """Every member's report as the cluster file (machines named after their nodes)."""
    missing = sorted(set(range(spec.members)) - set(members.done))
    if missing:
        raise HostError(f"probe: no report from member(s) {', '.join(map(str, missing))}")
    nodes = {i: members.done[i][0] for i in range(spec.members)}
    seen: dict[str, int] = {}
    for i, node in nodes.items():
        if node in seen:
            raise HostError(
                f"probe: members {seen[node]} and {i} both ran on node {node} "
                "(the probe's pod anti-affinity was not honoured)"
            )
        seen[node] = i
    hosts, links = [], []
    for i in range(spec.members):
        r = members.done[i][1]
        hosts.append(HostMeasure(nodes[i], r.cores, r.kernel_s, r.memory_bytes))
        for j, rate, latency in r.links:
            if j not in nodes:
                raise HostError(f"probe: member {i} reports a link to member {j}, not a member")
            links.append(LinkMeasure(nodes[i], nodes[j], rate, latency))
    return assemble(hosts, links)


# --- the shell -----------------------------------------------------------------------------


def run_probe(
    kube: Kube,
    spec: ProbeSpec,
    *,
    poll: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Create the probe's Service and Job, wait (up to ``spec.timeout``) for every member,
    delete both whatever happens (an error deleting is raised only when nothing else
    went wrong first); the :func:`graphrun.measure.probe.assemble` result."""
    try:
        result = _create_and_wait(kube, spec, poll, clock, sleep)
    except BaseException:  # an interrupt too: leave nothing behind
        with contextlib.suppress(KubeError):
            _delete(kube, spec)
        raise
    _delete(kube, spec)
    return result


def _create_and_wait(
    kube: Kube,
    spec: ProbeSpec,
    poll: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> dict[str, Any]:
    ns = spec.namespace
    kube.create(ns, build_probe_secret(spec, secrets.token_hex(KEY_BYTES)))
    kube.create(ns, build_probe_service(spec))
    kube.create(ns, build_probe_job(spec))
    deadline, culprit_by = clock() + spec.timeout, None
    while True:
        pods, job = kube.list_pods(ns, spec.selector), kube.get_job(ns, spec.name)
        members = read_members(pods, spec, job)
        if members.failure:
            # a member that only lost a peer: the peer that failed by itself is blamed
            # if it reports within PEER_GRACE, as the operator waits for a job's pods
            culprit_by = culprit_by or clock() + PEER_GRACE.total_seconds()
            if not members.bystander or min(culprit_by, deadline) <= clock():
                raise HostError(members.failure)
        if len(members.done) == spec.members:
            return cluster_of(members, spec)
        if clock() >= deadline:
            left = "; ".join(members.waiting) or "no pods yet"
            raise HostError(
                f"probe: {len(members.done)} of {spec.members} members done after "
                f"{spec.timeout}s (--timeout); waiting: {left[:600]}"
            )
        sleep(poll)


def _delete(kube: Kube, spec: ProbeSpec) -> None:
    """Delete the Job (its pods with it), the Service and the Secret, each tried; the
    first error."""
    errors = []
    for kind in ("Job", "Service", "Secret"):
        try:
            kube.delete(spec.namespace, kind, spec.name)
        except KubeError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
