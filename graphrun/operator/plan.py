"""What one reconcile pass decides, and the scratch it decides on.

:class:`Plan` is what :func:`graphrun.operator.reconcile.reconcile` returns: the actions
(objects to create or delete, pods to mark, events to emit), the status to write and
when to look again; the kopf handlers carry it out (:mod:`.handlers`). :class:`Run` is
the mutable scratch of one pass that the phase handlers (:mod:`.reconcile`), the pods'
helpers (:mod:`.pods`) and the hooks share. A :class:`Hook` is a concern that joins
every step at fixed points — admission by Kueue (:mod:`.admission`), elastic membership
(:mod:`.elastic`) — so the phase machine does not spell them out (Kubeflow Trainer's
runtime plugins are the model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from graphrun.job.spec import GraphJob, ReplicaGroup
from graphrun.job.workflow import Event, EventKind, JobState, Phase, condition_type, transition
from graphrun.names import RoleName
from graphrun.operator import layout as L
from graphrun.operator.observe import Observed, PartitionStep, PodView
from graphrun.operator.status import LostMachine, QueueState

K = EventKind


@dataclass(frozen=True)
class Create:
    obj: dict[str, Any]


@dataclass(frozen=True)
class Delete:
    api_version: str
    kind: str
    name: str


@dataclass(frozen=True)
class MarkStop:
    """Annotate pod ``name`` ``graphrun.io/stop: job`` before deleting it with the others
    (:func:`graphrun.operator.layout.uses_stop_mark`), and when (``graphrun.io/stop-at``):
    its worker then stops with the whole job (exact checkpoint) instead of leaving alone."""

    name: str
    at: str  # RFC 3339


@dataclass(frozen=True)
class Emit:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class DeleteGraphJob:
    """ttlSecondsAfterFinished has passed: delete the GraphJob (children follow)."""


Action = Create | Delete | MarkStop | Emit | DeleteGraphJob


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    status: dict[str, Any]  # the merge patch of the GraphJob's status (status_patch)
    requeue_after: float | None = None


@dataclass
class Run:
    """Mutable scratch of one reconcile pass (never escapes it)."""

    job: GraphJob
    owner: L.Owner
    config: L.OperatorConfig
    observed: Observed
    now: datetime
    state: JobState
    partitioned: bool
    spec_hashes: dict[str, str] = field(default_factory=dict)
    partition_dir_before: str = ""
    pod_steps_before: dict[str, PartitionStep] = field(default_factory=dict)  # partitionPods
    pod_steps: dict[str, PartitionStep] | None = None
    actions: list[Action] = field(default_factory=list)
    wake: list[float] = field(default_factory=list)
    queue: QueueState | None = None  # status.queue (Kueue admission)
    group_restarts: dict[str, int] = field(default_factory=dict)  # status.restartsByReplica
    lost: list[LostMachine] = field(default_factory=list)  # status.lostMachines (elastic)
    lost_before: bool = False  # status had lostMachines: a new attempt removes it (null)
    replacing: set[int] = field(default_factory=set)  # lost machines' pods made this pass

    def fire(self, event: Event) -> None:
        before = self.state.phase
        event = _within_restart_limit(self, event)
        self.state = transition(self.state, event, self.now)
        if not self.state.terminal and self.state.phase is not Phase.TRAINING:
            self.lost = []  # a new attempt starts every machine again
        if self.state.phase is Phase.RESTARTING and before is not Phase.RESTARTING:
            group = _replica_group(event.role)
            self.group_restarts[group] = self.group_restarts.get(group, 0) + 1
        cond = self.state.condition(condition_type(self.state.phase))
        if self.state.phase is Phase.PENDING:  # resumed: Created keeps its first reason
            cond = None
        warning = self.state.phase in (Phase.FAILED, Phase.RESTARTING)
        self.actions.append(
            Emit(
                "Warning" if warning else "Normal",
                cond.reason if cond else (event.reason or event.kind.value),
                f"{before.value} -> {self.state.phase.value}: "
                + (cond.message if cond else event.message),
            )
        )

    def wake_at(self, when: datetime) -> None:
        self.wake.append(max(0.0, (when - self.now).total_seconds()))

    def machine(self, pod: PodView) -> str:
        """The machine of a worker pod; the pod's name for the others."""
        names = self.job.spec.machine_names
        if pod.replica == "worker" and pod.index is not None and pod.index < len(names):
            return names[pod.index]
        return pod.name


class Hook(Protocol):
    """A concern that joins every reconcile step (:func:`graphrun.operator.reconcile._step`)
    at fixed points; one that does not apply to a job does nothing."""

    def stops(self, run: Run) -> bool:
        """Before the step: True ends it here (the hook fired an event)."""
        ...

    def before(self, run: Run) -> None:
        """Before the phase's handler."""
        ...

    def after(self, run: Run) -> None:
        """After the phase's handler."""
        ...


_GROUPS: dict[str, ReplicaGroup] = {"partitioner": "partitioner", "launcher": "launcher"}


def _replica_group(role: RoleName | None) -> ReplicaGroup:
    """The role group a failed role belongs to: its pods' replica type."""
    return _GROUPS.get(role.kind if role is not None else "", "worker")


def _within_restart_limit(run: Run, event: Event) -> Event:
    """A role failure whose group has spent its restarts (runPolicy.failurePolicy.
    restartLimits) fails the job instead of restarting it."""
    policy = run.job.spec.run_policy.failure_policy
    if event.kind is not K.ROLE_FAILED or policy is None:
        return event
    group = _replica_group(event.role)
    limit = policy.restart_limits.get(group)
    used = run.group_restarts.get(group, 0)
    if limit is None or used < limit:
        return event
    message = (
        f"{event.describe()}; the {group} group has used its {limit} restarts "
        f"(spec.runPolicy.failurePolicy.restartLimits.{group})"
    )
    return Event(K.FAIL, "RestartLimitExceeded", message, event.role, event.machine)
