"""The GraphJob's status, declared (``status`` of the custom resource) and computed.

:class:`GraphJobStatus` is every field the operator writes, declared once: the
reconciler reads the stored status into it (:func:`read_status`, one line naming the
field when it is not one) and writes the next one from it (:func:`status_patch`), and
the CRD's ``status`` schema is generated from it (:func:`graphrun.operator.crd.openapi_schema`).
``workflow`` keeps the shared state machine's state (phase, its conditions, restarts,
failure: :class:`graphrun.job.workflow.JobStatus`) so the next reconcile can continue
from it; the rest is for people and tools: ``phase``, the ``Created, Partitioning,
Running, Restarting, Suspended, Succeeded, Failed`` (and ``Queued``) conditions,
``reason``/``message`` of the current phase, start and completion times, per-replica pod
counts, each worker pod's partition step (``partitionPods``, partition.mode
distributed), the lost machines of an elastic job (``lostMachines``) and the Kueue
admission (``queue``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec

from graphrun.errors import WorkflowError
from graphrun.job.spec import GraphJob
from graphrun.job.workflow import (
    Condition,
    JobState,
    JobStatus,
    Phase,
    condition_type,
    parse_time,
    rfc3339,
)
from graphrun.operator.observe import Observed, PartitionStep
from graphrun.record import TookOver
from graphrun.wire import convert, to_builtins


class ReplicaCounts(msgspec.Struct, frozen=True, kw_only=True):
    """The pods of one replica type (``status.replicaStatuses.<Type>``)."""

    active: int = 0
    ready: int = 0
    succeeded: int = 0
    failed: int = 0


# how a worker pod was lost: it failed, is being deleted, or disappeared
LostHow = Literal["failed", "deleted", "disappeared"]


class LostMachine(msgspec.Struct, kw_only=True, rename="camel"):
    """One entry of ``status.lostMachines`` (runtime.elastic, :mod:`.elastic`)."""

    machine: str
    pod: str
    how: LostHow
    exit_code: int | None
    time: str  # RFC 3339
    took_over: TookOver
    replaced: bool = False  # True once the replacement pod is made
    replacement: str | None = None  # its name


class QueueState(msgspec.Struct, kw_only=True, rename="camel"):
    """The Kueue admission of a queued job (``status.queue``, :mod:`.queueing`)."""

    queued: bool = False
    queued_at: str | None = None  # RFC 3339
    admitted_at: str | None = None
    reason: str | None = None
    message: str | None = None

    def condition(self, now: datetime) -> Condition:
        """The ``Queued`` condition: True while the pods are gated, with Kueue's reason;
        False (``Admitted``) once Kueue removed the gates."""
        at = self.queued_at if self.queued else self.admitted_at
        return Condition(
            "Queued",
            "True" if self.queued else "False",
            self.reason or ("WaitingForAdmission" if self.queued else "Admitted"),
            self.message or "",
            parse_time(at) if at else now,
        )


class GraphJobStatus(msgspec.Struct, kw_only=True, rename="camel"):
    """``status`` of a GraphJob, as the operator writes it (a field that is None is left
    out; unknown ones are passed over when read: an older or newer operator's status
    reads)."""

    phase: Phase | None = None
    conditions: list[Condition] = msgspec.field(default_factory=list)
    restarts: int = 0
    reason: str | None = None
    message: str | None = None
    start_time: str | None = None  # RFC 3339
    completion_time: str | None = None
    workflow: JobStatus | None = None  # the state machine's own state
    partitioned: bool = False
    spec_hashes: dict[str, str] = msgspec.field(default_factory=dict)  # reconcile.PINNED
    partition_dir: str | None = None
    partition_pods: dict[str, PartitionStep] | None = None  # while partitioning
    replica_statuses: dict[str, ReplicaCounts] = msgspec.field(default_factory=dict)
    lost_machines: list[LostMachine] | None = None
    restarts_by_replica: dict[str, int] | None = None
    queue: QueueState | None = None
    cleaned_up: bool | None = None  # once finished: nothing left to clean up


# the fields that come from the workflow state (state_status)
FROM_STATE = (
    "phase", "conditions", "restarts", "reason", "message", "start_time", "completion_time",
    "workflow",
)  # fmt: skip


def read_status(raw: dict[str, Any] | None) -> GraphJobStatus:
    """A GraphJob's stored ``status`` (None or {}: a new job's) as its type; a
    WorkflowError naming the field when it is not one."""
    return convert(GraphJobStatus, raw or {}, "status", WorkflowError)


def status_patch(status: GraphJobStatus, cleared: tuple[str, ...] = ()) -> dict[str, Any]:
    """``status`` as the merge patch the handlers write: the fields that are set, and
    ``null`` for the ``cleared`` ones (wire names), which a merge patch removes."""
    out = {k: v for k, v in to_builtins(status).items() if v is not None}
    return {**out, **dict.fromkeys(cleared)}


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


def k8s_conditions(state: JobState) -> list[Condition]:
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
    return [by_type[t] for t in K8S_CONDITIONS if t in by_type]


def state_status(state: JobState) -> GraphJobStatus:
    """The status fields that come from the workflow state."""
    current = state.condition(condition_type(state.phase))
    return GraphJobStatus(
        phase=state.phase,
        conditions=k8s_conditions(state),
        restarts=state.restarts,
        workflow=state.status(),
        reason=current.reason if current else None,
        message=current.message if current else None,
        start_time=rfc3339(state.started_at) if state.started_at else None,
        completion_time=rfc3339(state.finished_at) if state.finished_at else None,
    )


def replica_statuses(observed: Observed) -> dict[str, ReplicaCounts]:
    out: dict[str, ReplicaCounts] = {}
    for replica, key in (
        ("partitioner", "Partitioner"),
        ("worker", "Worker"),
        ("launcher", "Launcher"),
    ):
        pods = observed.of(replica)
        if not pods:
            continue
        out[key] = ReplicaCounts(
            active=sum(p.phase in ("Pending", "Running") for p in pods),
            ready=sum(p.ready for p in pods),
            succeeded=sum(p.phase == "Succeeded" for p in pods),
            failed=sum(p.phase == "Failed" for p in pods),
        )
    return out


def settled(job: GraphJob, status: GraphJobStatus) -> bool:
    """A finished job with nothing left to do (no cleanup, no TTL): skip reconciling."""
    return (
        status.phase in (Phase.SUCCEEDED, Phase.FAILED)
        and bool(status.cleaned_up)
        and job.spec.run_policy.ttl_seconds_after_finished is None
    )
