"""The GraphJob's status as Kubernetes shows it, from the workflow state and the pods.

``status.workflow`` keeps the shared state machine's state (phase, its conditions,
restarts, failure) so the next reconcile can continue from it; the rest is for people
and tools: ``phase``, the ``Created, Partitioning, Running, Restarting, Suspended,
Succeeded, Failed`` conditions, ``reason``/``message`` of the current phase, start and
completion times and per-replica pod counts (and, while the worker pods partition in
partition.mode distributed, ``partitionPods``: each pod's step, see :mod:`.reconcile`).
"""

from __future__ import annotations

from typing import Any, Literal

from graphrun.job.spec import GraphJob
from graphrun.job.workflow import Condition, JobState, Phase, rfc3339
from graphrun.operator.observe import Observed
from graphrun.wire import to_builtins


def condition_type(phase: Phase) -> str:
    return "Created" if phase is Phase.PENDING else phase.value


K8S_CONDITIONS = (
    "Created",
    "Partitioning",
    "Running",
    "Restarting",
    "Suspended",
    "Succeeded",
    "Failed",
)
RUNNING_PHASES = ("Distributing", "Serving", "Training")


def k8s_conditions(state: JobState) -> list[dict[str, str]]:
    """The workflow's conditions as the GraphJob reports them: Distributing, Serving and
    Training are one ``Running`` condition (reason and message of the latest)."""
    by_type = {c.type: c for c in state.conditions}
    running = [by_type[t] for t in RUNNING_PHASES if t in by_type]
    if running:
        # the current phase wins a tie (Serving ends when Training starts)
        latest = max(running, key=lambda c: (c.time, c.status == "True"))
        status: Literal["True", "False"] = (
            "True" if state.phase.value in RUNNING_PHASES else "False"
        )
        by_type["Running"] = Condition(
            "Running", status, latest.reason, latest.message, latest.time
        )
    return [to_builtins(by_type[t]) for t in K8S_CONDITIONS if t in by_type]


def state_status(state: JobState) -> dict[str, Any]:
    out: dict[str, Any] = {
        "phase": state.phase.value,
        "conditions": k8s_conditions(state),
        "restarts": state.restarts,
        "workflow": state.to_dict(),
    }
    current = state.condition(condition_type(state.phase))
    if current is not None:
        out["reason"], out["message"] = current.reason, current.message
    if state.started_at:
        out["startTime"] = rfc3339(state.started_at)
    if state.finished_at:
        out["completionTime"] = rfc3339(state.finished_at)
    return out


def replica_statuses(observed: Observed) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for replica, key in (
        ("partitioner", "Partitioner"),
        ("worker", "Worker"),
        ("launcher", "Launcher"),
    ):
        pods = observed.of(replica)
        if not pods:
            continue
        out[key] = {
            "active": sum(p.phase in ("Pending", "Running") for p in pods),
            "ready": sum(p.ready for p in pods),
            "succeeded": sum(p.phase == "Succeeded" for p in pods),
            "failed": sum(p.phase == "Failed" for p in pods),
        }
    return out


def settled(job: GraphJob, status: dict[str, Any]) -> bool:
    """A finished job with nothing left to do (no cleanup, no TTL): skip reconciling."""
    return (
        status.get("phase") in ("Succeeded", "Failed")
        and bool(status.get("cleanedUp"))
        and job.spec.run_policy.ttl_seconds_after_finished is None
    )
