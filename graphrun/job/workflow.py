"""The workflow of a job: a pure state machine shared by every backend.

::

    Pending --Start--> Partitioning --Partitioned--> Distributing --Distributed--> Serving
        --ServersReady--> Training --TrainingDone--> Succeeded

    any active phase --RoleFailed--> Restarting   (while restarts < backoffLimit, unless
                                                   the role exited USER_ERROR_EXIT: its
                                                   input is wrong, a retry cannot help)
                     --RoleFailed--> Failed       (otherwise)
    Restarting --Restarted--> Partitioning | Distributing | Serving   (where it failed;
                                                 a failure while serving or training
                                                 restarts the servers, then training
                                                 resumes from the last checkpoint)
    any non-terminal --Suspend--> Suspended --Resume--> Pending
    any non-terminal --DeadlineExceeded | Cancelled | Fail--> Failed

Succeeded and Failed are terminal. An event a phase does not accept raises
:class:`~graphrun.errors.WorkflowError`; :func:`accepts` asks first.

Backends only start, watch and stop processes (or pods) and move files; they turn what
they see into :class:`Event` values and call :func:`transition`. Time is passed in, so
everything here is deterministic.

Conditions: every phase has a condition of the same name (``Pending`` is ``Created``).
Entering a phase sets its condition ``True`` and the condition of the phase it leaves
``False``; each condition keeps its reason, message and last transition time.

The state is kept as :class:`JobStatus` (a ``msgspec.Struct``, declared once: the
operator's ``status.workflow``, ``graphrun run``'s ``state.json``); :class:`JobState`
adds the spec's backoff limit, which the status does not keep.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec.structs import replace

from graphrun.errors import JOB, USER_ERROR_EXIT, JobFailed, WorkflowError
from graphrun.files import write_atomic
from graphrun.names import RoleName
from graphrun.wire import convert, to_builtins


class Phase(StrEnum):
    PENDING = "Pending"
    PARTITIONING = "Partitioning"
    DISTRIBUTING = "Distributing"
    SERVING = "Serving"
    TRAINING = "Training"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


ACTIVE = frozenset({Phase.PARTITIONING, Phase.DISTRIBUTING, Phase.SERVING, Phase.TRAINING})
TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class EventKind(StrEnum):
    START = "Start"
    PARTITIONED = "Partitioned"
    DISTRIBUTED = "Distributed"
    SERVERS_READY = "ServersReady"
    TRAINING_DONE = "TrainingDone"
    ROLE_FAILED = "RoleFailed"
    RESTARTED = "Restarted"
    SUSPEND = "Suspend"
    RESUME = "Resume"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    CANCELLED = "Cancelled"
    FAIL = "Fail"


# The forward path: one event moves one phase on.
FORWARD: dict[tuple[Phase, EventKind], Phase] = {
    (Phase.PENDING, EventKind.START): Phase.PARTITIONING,
    (Phase.PARTITIONING, EventKind.PARTITIONED): Phase.DISTRIBUTING,
    (Phase.DISTRIBUTING, EventKind.DISTRIBUTED): Phase.SERVING,
    (Phase.SERVING, EventKind.SERVERS_READY): Phase.TRAINING,
    (Phase.TRAINING, EventKind.TRAINING_DONE): Phase.SUCCEEDED,
}
# Where a restart resumes, by the phase that failed.
RESUME_AT = {
    Phase.PARTITIONING: Phase.PARTITIONING,
    Phase.DISTRIBUTING: Phase.DISTRIBUTING,
    Phase.SERVING: Phase.SERVING,
    Phase.TRAINING: Phase.SERVING,
}
FAILING = frozenset({EventKind.DEADLINE_EXCEEDED, EventKind.CANCELLED, EventKind.FAIL})

DEFAULT_REASON = {
    EventKind.START: "JobStarted",
    EventKind.PARTITIONED: "PartitionCompleted",
    EventKind.DISTRIBUTED: "PartitionsDistributed",
    EventKind.SERVERS_READY: "StoreServersReady",
    EventKind.TRAINING_DONE: "TrainingCompleted",
    EventKind.ROLE_FAILED: "RoleFailed",
    EventKind.RESTARTED: "RolesRestarted",
    EventKind.SUSPEND: "JobSuspended",
    EventKind.RESUME: "JobResumed",
    EventKind.DEADLINE_EXCEEDED: "DeadlineExceeded",
    EventKind.CANCELLED: "Cancelled",
    EventKind.FAIL: "Failed",
}


def condition_type(phase: Phase) -> str:
    """The condition a phase sets (Pending's is ``Created``), on both backends."""
    return "Created" if phase is Phase.PENDING else phase.value


class Event(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """Something a backend observed. ``reason`` is CamelCase; ``message`` a sentence.

    A failed job's status keeps the event that failed it (``failure``): its fields in
    camelCase, the empty ones left out."""

    kind: EventKind
    reason: str = ""
    message: str = ""
    role: RoleName | None = None  # read once with the status (the operator's, state.json)
    machine: str | None = None
    exit_code: int | None = None

    @classmethod
    def role_failed(
        cls,
        role: RoleName | None,  # None: the job as a whole
        machine: str,
        exit_code: int | None,
        message: str = "",
        reason: str = "",
    ) -> Event:
        return cls(EventKind.ROLE_FAILED, reason, message, role, machine, exit_code)

    @property
    def permanent(self) -> bool:
        """A role that exited with :data:`~graphrun.errors.USER_ERROR_EXIT` refused its
        input (a bad entry point, a corrupt checkpoint): restarting it cannot help."""
        return self.kind is EventKind.ROLE_FAILED and self.exit_code == USER_ERROR_EXIT

    def describe(self) -> str:
        """The message, naming the failed role, machine and exit code when there is one."""
        if self.kind is EventKind.ROLE_FAILED:
            return str(
                JobFailed(self.role or JOB, self.machine or "?", self.exit_code, self.message)
            )
        return self.message


# A time in a status: RFC 3339 with its zone (``2026-01-01T00:00:00Z``), kept in UTC to
# the second, as Kubernetes writes its own.
Time = Annotated[datetime, msgspec.Meta(tz=True)]


def to_second(t: datetime) -> datetime:
    """``t`` in UTC, to the second (what a status keeps of a time)."""
    return t.astimezone(UTC).replace(microsecond=0)


def rfc3339(t: datetime) -> str:
    return to_second(t).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


class Condition(msgspec.Struct, frozen=True):
    """A Kubernetes condition (its ``time`` is ``lastTransitionTime``)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str
    time: Time = msgspec.field(name="lastTransitionTime")

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "time", to_second(self.time))


class JobStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The workflow's status, declared once: the operator keeps it as the GraphJob's
    ``status.workflow``, ``graphrun run`` in ``RUN/state.json``::

        {"phase": "Failed",
         "conditions": [{"type": "Created", "status": "True", "reason": "JobCreated",
                         "message": "job created", "lastTransitionTime": "2026-...Z"}, ...],
         "restarts": 1,                    # always written
         "resumePhase": "Serving",         # the others only when set
         "startTime": "2026-...Z", "completionTime": "2026-...Z",
         "failure": {"kind": "RoleFailed", "role": "trainer:1", "machine": "m1",
                     "exitCode": 3, "message": "..."}}

    Times are UTC, to the second. :meth:`JobState.to_dict` writes it and
    :func:`state_from_dict` reads it back (unknown fields are passed over: a newer
    operator's status reads)."""

    phase: Phase
    conditions: tuple[Condition, ...]
    restarts: Annotated[int, msgspec.Meta(ge=0)]
    resume_phase: Phase | None = msgspec.field(default=None, name="resumePhase")
    started_at: Time | None = msgspec.field(default=None, name="startTime")
    finished_at: Time | None = msgspec.field(default=None, name="completionTime")
    failure: Event | None = None

    def __post_init__(self) -> None:
        for name in ("started_at", "finished_at"):
            if (t := getattr(self, name)) is not None:
                msgspec.structs.force_setattr(self, name, to_second(t))


_STATUS_FIELDS = JobStatus.__struct_fields__


class JobState(JobStatus, frozen=True, kw_only=True):
    """The state the workflow steps: the status, and the spec's ``backoff_limit``
    (``runPolicy.backoffLimit``), which the status does not keep."""

    backoff_limit: int = 0

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def resumes(self) -> bool:
        """Whether the trainers start from the last checkpoint: after a restart or a
        suspension (both backends)."""
        return self.restarts > 0 or self.condition("Suspended") is not None

    def error(self) -> JobFailed | None:
        """The failure as a :class:`JobFailed` (None unless the job failed)."""
        f = self.failure
        if self.phase is not Phase.FAILED or f is None:
            return None
        if f.kind is EventKind.ROLE_FAILED:
            return JobFailed(f.role or JOB, f.machine or "?", f.exit_code, f.message)
        cond = self.condition("Failed")
        return JobFailed(JOB, "-", None, f"{cond.reason}: {cond.message}" if cond else "")

    def status(self) -> JobStatus:
        return JobStatus(**{name: getattr(self, name) for name in _STATUS_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        """The :class:`JobStatus` as JSON-ready builtins."""
        out: dict[str, Any] = to_builtins(self.status())
        return out


def state_from_dict(
    data: Any, backoff_limit: int = 0, where: str = "the workflow status"
) -> JobState:
    """Read back :meth:`JobState.to_dict` (e.g. a custom resource's ``status.workflow``).

    Raises WorkflowError, one line naming ``where`` and the field, when the data is not
    a :class:`JobStatus`."""
    return state_of(convert(JobStatus, data, where, WorkflowError), backoff_limit)


def state_of(status: JobStatus, backoff_limit: int = 0) -> JobState:
    """The :class:`JobState` of a :class:`JobStatus` already read (a GraphJob's
    ``status.workflow``) and the spec's backoff limit."""
    fields = {name: getattr(status, name) for name in _STATUS_FIELDS}
    return JobState(**fields, backoff_limit=backoff_limit)


class Launcher(msgspec.Struct, frozen=True):
    """The process of ``graphrun run`` that writes a run's state: its pid and start time
    (ms since the epoch, as :func:`graphrun.store.shm.start_ms` reads it), so that the
    next run tells a live run from a lost one."""

    pid: int
    start: int


class RunState(JobStatus, frozen=True, kw_only=True, omit_defaults=True):
    """``RUN/state.json`` of ``graphrun run``: the :class:`JobStatus`, the launcher
    writing it, and the job file (``jobFile``) the report reads the spec of. Written by
    :meth:`write`, read by :func:`read_run_state`; one of an older graphrun without the
    last two reads as well."""

    launcher: Launcher | None = None
    job_file: str | None = msgspec.field(default=None, name="jobFile")

    @classmethod
    def of(cls, status: JobStatus, launcher: Launcher, job_file: Path) -> RunState:
        fields = {name: getattr(status, name) for name in _STATUS_FIELDS}
        return cls(**fields, launcher=launcher, job_file=str(job_file))

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(to_builtins(self), indent=2) + "\n")


def read_run_state(data: Any, where: str) -> RunState:
    """The run state of ``data`` (a decoded ``state.json``); WorkflowError, one line
    naming ``where`` and the field, when it is not one."""
    return convert(RunState, data, where, WorkflowError)


def initial_state(now: datetime, backoff_limit: int = 0, message: str = "") -> JobState:
    created = Condition("Created", "True", "JobCreated", message or "job created", now)
    return JobState(
        phase=Phase.PENDING, conditions=(created,), restarts=0, backoff_limit=backoff_limit
    )


def next_phase(state: JobState, kind: EventKind, permanent: bool = False) -> Phase | None:
    """The phase ``kind`` leads to from ``state``, or None when it is not accepted.
    A ``permanent`` role failure is never retried."""
    p = state.phase
    if p in TERMINAL:
        return None
    if (p, kind) in FORWARD:
        return FORWARD[p, kind]
    if kind is EventKind.ROLE_FAILED and p in ACTIVE:
        retry = state.restarts < state.backoff_limit and not permanent
        return Phase.RESTARTING if retry else Phase.FAILED
    if kind is EventKind.RESTARTED and p is Phase.RESTARTING:
        return state.resume_phase or Phase.SERVING
    if kind is EventKind.SUSPEND and p is not Phase.SUSPENDED:
        return Phase.SUSPENDED
    if kind is EventKind.RESUME and p is Phase.SUSPENDED:
        return Phase.PENDING
    if kind in FAILING:
        return Phase.FAILED
    return None


def accepts(state: JobState, kind: EventKind) -> bool:
    return next_phase(state, kind) is not None


def _set(conds: tuple[Condition, ...], new: Condition) -> tuple[Condition, ...]:
    """Replace the condition of the same type (keeping its time if nothing changed)."""
    out, found = [], False
    for c in conds:
        if c.type == new.type:
            found = True
            same = (c.status, c.reason, c.message) == (new.status, new.reason, new.message)
            out.append(c if same else new)
        else:
            out.append(c)
    if not found:
        out.append(new)
    return tuple(out)


def transition(state: JobState, event: Event, now: datetime) -> JobState:
    """The state after ``event``. Raises WorkflowError if the phase does not accept it."""
    target = next_phase(state, event.kind, event.permanent)
    if target is None:
        raise WorkflowError(f"event {event.kind.value} is illegal in phase {state.phase.value}")
    reason = event.reason or DEFAULT_REASON[event.kind]
    if target is Phase.FAILED and event.kind is EventKind.ROLE_FAILED and state.backoff_limit:
        retried_out = state.restarts >= state.backoff_limit
        reason = event.reason or ("BackoffLimitExceeded" if retried_out else "NotRetriable")
    message = event.describe() or f"{state.phase.value} -> {target.value}"
    conds = state.conditions
    if state.phase is not Phase.PENDING:
        old = condition_type(state.phase)
        conds = _set(conds, Condition(old, "False", reason, message, now))
    if target is not Phase.PENDING:  # a resumed job keeps its Created condition
        conds = _set(conds, Condition(condition_type(target), "True", reason, message, now))
    new = replace(state, phase=target, conditions=conds)
    if event.kind is EventKind.START and state.started_at is None:
        new = replace(new, started_at=now)
    if target is Phase.RESTARTING:
        new = replace(new, restarts=state.restarts + 1, resume_phase=RESUME_AT[state.phase])
    elif state.phase is Phase.RESTARTING:
        new = replace(new, resume_phase=None)
    if target in TERMINAL:
        new = replace(new, finished_at=now)
    if target is Phase.FAILED:
        new = replace(new, failure=event)
    return new


def progress(state: JobState, message: str) -> JobState:
    """The state with a new message on the current phase's condition (its status, reason
    and time kept: nothing transitioned), e.g. which pods are partitioning."""
    current = state.condition(condition_type(state.phase))
    if current is None or current.message == message:
        return state
    new = replace(current, message=message)
    return replace(state, conditions=tuple(new if c is current else c for c in state.conditions))


def replay(state: JobState, events: Iterable[Event], now: datetime) -> JobState:
    """Apply ``events`` in order (all at time ``now``)."""
    for event in events:
        state = transition(state, event, now)
    return state
