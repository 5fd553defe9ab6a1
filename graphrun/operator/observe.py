"""What the operator sees of a job's children, as typed values (parsed from API dicts).

Only the fields reconcile needs: pod phase, readiness, waiting reason, exit code and
termination message of the main container, and of the ``partition`` init container
(partition.mode distributed); the partitioner Job's outcome.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from graphrun.machine.stopmark import JOB_WIDE, STOP_ANNOTATION, STOP_AT_ANNOTATION
from graphrun.names import RoleName
from graphrun.operator import layout as L
from graphrun.operator import queueing as Q

# The last line `graphrun worker` prints when a role failed (graphrun.errors.JobFailed).
FAILED_LINE = re.compile(
    r"(?P<role>[\w:.-]+) on (?P<machine>\S+) failed \((?:exit code (?P<code>-?\d+)|no exit code)\)"
    r"(?:: (?P<reason>.*))?$"
)

# where a worker pod of partition.mode distributed is (status.partitionPods)
PartitionStep = Literal["Waiting", "Partitioning", "Partitioned", "Failed"]


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class PodView:
    name: str
    replica: str
    index: int | None
    phase: str
    ready: bool = False
    created: datetime | None = None
    deleting: bool = False
    waiting_reason: str = ""
    waiting_message: str = ""
    unschedulable: str = ""
    exit_code: int | None = None
    termination_message: str = ""
    finished_at: datetime | None = None  # when its container terminated
    init: str = ""  # the partition init container: "", "waiting", "running", "terminated"
    init_exit_code: int | None = None
    init_message: str = ""
    init_finished: datetime | None = None
    gated: bool = False  # Kueue's scheduling gate is on: not admitted yet
    stopped: str = ""  # Kueue stopped it (condition TerminationTarget): its message
    stop_marked: bool = False  # annotated graphrun.io/stop: job (graphrun.machine.stopmark)
    stop_marked_at: datetime | None = None  # graphrun.io/stop-at: when

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def started(self) -> bool:
        """Past scheduling and image pulls: a container (or the partition step) ran."""
        return self.phase != "Pending" or self.init in ("running", "terminated")

    @property
    def partition_step(self) -> PartitionStep:
        """Where a worker pod of partition.mode distributed is: Waiting (not started),
        Partitioning (its rank runs), Partitioned (done) or Failed."""
        if self.init == "terminated":
            return "Partitioned" if self.init_exit_code == 0 else "Failed"
        if self.phase in ("Running", "Succeeded"):
            return "Partitioned"
        if self.phase == "Failed":
            return "Failed"
        return "Partitioning" if self.init == "running" else "Waiting"

    def failure(self) -> tuple[RoleName | None, str | None, int | None, str]:
        """(role, machine, exit code, message) from the termination message: the role the
        worker named (read here, the message's one reader), or ``partitioner:<index>`` if
        its partition step failed; Nones otherwise."""
        if self.init == "terminated" and self.init_exit_code != 0:
            last = [ln for ln in self.init_message.strip().splitlines() if ln.strip()][-1:]
            return RoleName.partitioner(self.index), None, self.init_exit_code, "".join(last)
        lines = [ln for ln in self.termination_message.strip().splitlines() if ln.strip()]
        for line in reversed(lines):
            m = FAILED_LINE.search(line)
            if m and RoleName.is_valid(m["role"]):
                code = int(m["code"]) if m["code"] is not None else None
                return RoleName.parse(m["role"]), m["machine"], code, m["reason"] or ""
        return None, None, self.exit_code, lines[-1] if lines else ""


@dataclass(frozen=True)
class JobView:
    """The partitioner's batch/v1 Job."""

    name: str
    complete: bool = False
    failed: bool = False
    deleting: bool = False
    message: str = ""


@dataclass(frozen=True)
class Observed:
    """Every child the operator found for one GraphJob."""

    kinds: frozenset[str] = frozenset()  # "Secret", "ConfigMap", "Service", "PodGroup"
    partitioner: JobView | None = None
    pods: tuple[PodView, ...] = field(default_factory=tuple)
    # Kueue's (reason, message) for the job's pod group not admitted yet, from its
    # Workload (kueue.x-k8s.io); None when the operator could not read one
    admission: tuple[str, str] | None = None

    def of(self, replica: str) -> list[PodView]:
        return [p for p in self.pods if p.replica == replica]

    def workers(self) -> dict[int, PodView]:
        return {p.index: p for p in self.pods if p.replica == "worker" and p.index is not None}


def _container_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return next(
        (s for s in statuses if s.get("name") == L.CONTAINER), statuses[0] if statuses else {}
    )


def _init_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("initContainerStatuses") or []
    return next((s for s in statuses if s.get("name") == L.PARTITION_CONTAINER), {})


def pod_view(pod: dict[str, Any]) -> PodView:
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    lab = meta.get("labels", {})
    index = lab.get(L.LABEL_INDEX)
    cs = _container_status(pod)
    init = _init_status(pod).get("state") or {}
    init_term = init.get("terminated") or {}
    # while the partition step has not run, its image pull is what the pod waits for
    waiting = init.get("waiting") or cs.get("state", {}).get("waiting") or {}
    term = cs.get("state", {}).get("terminated") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    sched = conds.get("PodScheduled", {})
    stop = conds.get(Q.STOPPED, {})
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    unsched = sched.get("message", "") if sched.get("reason") == "Unschedulable" else ""
    return PodView(
        name=meta.get("name", ""),
        replica=lab.get(L.LABEL_REPLICA, ""),
        index=int(index) if index is not None and str(index).isdigit() else None,
        phase=status.get("phase") or "Pending",
        ready=conds.get("Ready", {}).get("status") == "True",
        created=_time(meta.get("creationTimestamp")),
        deleting=bool(meta.get("deletionTimestamp")),
        waiting_reason=waiting.get("reason", ""),
        waiting_message=waiting.get("message", ""),
        unschedulable=unsched,
        exit_code=term.get("exitCode"),
        termination_message=term.get("message", ""),
        finished_at=_time(term.get("finishedAt")),
        init=next((k for k in ("terminated", "running", "waiting") if k in init), ""),
        init_exit_code=init_term.get("exitCode"),
        init_message=init_term.get("message", ""),
        init_finished=_time(init_term.get("finishedAt")),
        gated=any(g.get("name") == Q.GATE for g in gates),
        stopped=(stop.get("message") or stop.get("reason") or Q.STOPPED)
        if stop.get("status") == "True"
        else "",
        stop_marked=(meta.get("annotations") or {}).get(STOP_ANNOTATION) == JOB_WIDE,
        stop_marked_at=_time((meta.get("annotations") or {}).get(STOP_AT_ANNOTATION)),
    )


def job_view(job: dict[str, Any]) -> JobView:
    conds = job.get("status", {}).get("conditions") or []
    done = {c.get("type"): c for c in conds if c.get("status") == "True"}
    failed = done.get("Failed", {})
    return JobView(
        name=job.get("metadata", {}).get("name", ""),
        complete="Complete" in done,
        failed="Failed" in done,
        deleting=bool(job.get("metadata", {}).get("deletionTimestamp")),
        message=": ".join(x for x in (failed.get("reason"), failed.get("message")) if x),
    )


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


def _ours(obj: dict[str, Any], name: str, uid: str) -> bool:
    """Owned by the GraphJob, or a pod of its partitioner Job (owned by that Job)."""
    if owned_by(obj, uid):
        return True
    lab = obj.get("metadata", {}).get("labels") or {}
    return (
        obj.get("kind") == "Pod"
        and lab.get(L.LABEL_JOB) == name
        and lab.get(L.LABEL_REPLICA) == "partitioner"
    )


def observe(children: Iterable[dict[str, Any]], name: str, uid: str) -> Observed:
    """Sort API objects (of any kind, with ``kind`` set) into an :class:`Observed`."""
    kinds: set[str] = set()
    partitioner: JobView | None = None
    pods: list[PodView] = []
    admission: tuple[str, str] | None = None
    for obj in children:
        if str(obj.get("apiVersion", "")).startswith(Q.WORKLOAD_API[0] + "/"):
            admission = Q.kueue_reason(obj)  # Kueue's Workload: owned by the pods, not us
            continue
        if not _ours(obj, name, uid):
            continue
        kind = obj.get("kind", "")
        if kind == "Pod":
            pods.append(pod_view(obj))
        elif kind == "Job":
            partitioner = job_view(obj)
        elif not obj.get("metadata", {}).get("deletionTimestamp"):
            kinds.add(kind)
    pods.sort(key=lambda p: (p.replica, p.index if p.index is not None else -1, p.name))
    return Observed(frozenset(kinds), partitioner, tuple(pods), admission)
