from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrun.errors import JobFailed, WorkflowError
from graphrun.job.workflow import (
    ACTIVE,
    TERMINAL,
    Event,
    EventKind,
    JobState,
    Phase,
    accepts,
    initial_state,
    progress,
    replay,
    state_from_dict,
    transition,
)
from graphrun.names import RoleName

T0 = datetime(2026, 1, 1, tzinfo=UTC)
K = EventKind
FORWARD_EVENTS = [K.START, K.PARTITIONED, K.DISTRIBUTED, K.SERVERS_READY, K.TRAINING_DONE]


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reach(phase: Phase, backoff_limit: int = 1) -> JobState:
    """A state in ``phase``, reached by legal events only."""
    s = initial_state(T0, backoff_limit=backoff_limit)
    path = {
        Phase.PENDING: [],
        Phase.PARTITIONING: FORWARD_EVENTS[:1],
        Phase.DISTRIBUTING: FORWARD_EVENTS[:2],
        Phase.SERVING: FORWARD_EVENTS[:3],
        Phase.TRAINING: FORWARD_EVENTS[:4],
        Phase.SUCCEEDED: FORWARD_EVENTS,
        Phase.RESTARTING: [*FORWARD_EVENTS[:4], K.ROLE_FAILED],
        Phase.SUSPENDED: [K.SUSPEND],
        Phase.FAILED: [K.FAIL],
    }[phase]
    s = replay(s, [Event(k) for k in path], T0)
    assert s.phase is phase
    return s


def expected(phase: Phase, kind: EventKind, restarts_left: bool) -> Phase | None:
    """The transition table written out independently of the implementation."""
    if phase in TERMINAL:
        return None
    forward = dict(
        zip([Phase.PENDING, *sorted(ACTIVE, key=list(Phase).index)], FORWARD_EVENTS, strict=True)
    )
    nxt = list(Phase)
    if forward.get(phase) is kind:
        return nxt[nxt.index(phase) + 1] if kind is not K.TRAINING_DONE else Phase.SUCCEEDED
    if kind is K.ROLE_FAILED:
        if phase in ACTIVE:
            return Phase.RESTARTING if restarts_left else Phase.FAILED
        return None
    if kind is K.RESTARTED:
        return Phase.SERVING if phase is Phase.RESTARTING else None
    if kind is K.SUSPEND:
        return Phase.SUSPENDED if phase is not Phase.SUSPENDED else None
    if kind is K.RESUME:
        return Phase.PENDING if phase is Phase.SUSPENDED else None
    if kind in (K.DEADLINE_EXCEEDED, K.CANCELLED, K.FAIL):
        return Phase.FAILED
    return None


@pytest.mark.parametrize(
    ("phase", "kind", "backoff"), list(itertools.product(Phase, EventKind, [0, 2]))
)
def test_every_phase_and_event(phase: Phase, kind: EventKind, backoff: int) -> None:
    if phase is Phase.RESTARTING and backoff == 0:
        pytest.skip("Restarting is unreachable without a backoff limit")
    s = reach(phase, backoff_limit=backoff)
    want = expected(phase, kind, restarts_left=s.restarts < backoff)
    assert accepts(s, kind) is (want is not None)
    if want is None:
        with pytest.raises(WorkflowError, match=f"{kind.value} is illegal in phase {phase.value}"):
            transition(s, Event(kind), at(5))
        return
    new = transition(s, Event(kind), at(5))
    assert new.phase is want
    assert s.phase is phase  # the old state is untouched (frozen, pure)


def test_happy_path_conditions_and_times() -> None:
    s = initial_state(T0)
    assert [c.type for c in s.conditions] == ["Created"]
    for i, kind in enumerate(FORWARD_EVENTS, start=1):
        s = transition(s, Event(kind), at(i))
    assert s.phase is Phase.SUCCEEDED and s.terminal
    assert s.started_at == at(1) and s.finished_at == at(5)
    status = {c.type: c.status for c in s.conditions}
    assert status == {
        "Created": "True",
        "Partitioning": "False",
        "Distributing": "False",
        "Serving": "False",
        "Training": "False",
        "Succeeded": "True",
    }
    done = s.condition("Succeeded")
    assert done is not None and done.reason == "TrainingCompleted" and done.time == at(5)
    assert s.error() is None
    d = s.to_dict()
    assert d["phase"] == "Succeeded"
    assert d["startTime"] == "2026-01-01T00:00:01Z"
    assert d["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_role_failure_without_backoff_fails_naming_the_role() -> None:
    s = reach(Phase.TRAINING, backoff_limit=0)
    s = transition(s, Event.role_failed(RoleName.trainer(1), "m1", 3, "ValueError: boom"), at(9))
    assert s.phase is Phase.FAILED
    cond = s.condition("Failed")
    assert cond is not None and cond.reason == "RoleFailed"
    assert cond.message == "trainer:1 on m1 failed (exit code 3): ValueError: boom"
    err = s.error()
    assert isinstance(err, JobFailed)
    assert (err.role, err.host, err.exit_code) == (RoleName.trainer(1), "m1", 3)
    training = s.condition("Training")
    assert training is not None and training.status == "False"


def test_backoff_restarts_then_fails() -> None:
    s = reach(Phase.TRAINING, backoff_limit=2)
    for n in (1, 2):
        s = transition(s, Event.role_failed(RoleName.store(0), "m0", -9), at(10 * n))
        assert s.phase is Phase.RESTARTING and s.restarts == n
        s = transition(s, Event(K.RESTARTED), at(10 * n + 1))
        assert s.phase is Phase.SERVING
        restarting = s.condition("Restarting")
        assert restarting is not None and restarting.status == "False"
        s = transition(s, Event(K.SERVERS_READY), at(10 * n + 2))
    s = transition(s, Event.role_failed(RoleName.trainer(0), "m0", 1), at(40))
    assert s.phase is Phase.FAILED
    cond = s.condition("Failed")
    assert cond is not None and cond.reason == "BackoffLimitExceeded"
    assert "trainer:0 on m0 failed (exit code 1)" in cond.message


@pytest.mark.parametrize(
    ("failed_in", "resumes_at"),
    [
        (Phase.PARTITIONING, Phase.PARTITIONING),
        (Phase.DISTRIBUTING, Phase.DISTRIBUTING),
        (Phase.SERVING, Phase.SERVING),
        (Phase.TRAINING, Phase.SERVING),
    ],
)
def test_restart_resumes_where_it_failed(failed_in: Phase, resumes_at: Phase) -> None:
    s = reach(failed_in, backoff_limit=1)
    s = transition(s, Event.role_failed(RoleName.trainer(0), "m0", 1), at(1))
    s = transition(s, Event(K.RESTARTED), at(2))
    assert s.phase is resumes_at
    assert s.resume_phase is None


def test_suspend_and_resume_keeps_restart_count() -> None:
    s = reach(Phase.TRAINING, backoff_limit=3)
    s = transition(s, Event.role_failed(RoleName.trainer(0), "m0", 1), at(1))
    s = transition(s, Event(K.SUSPEND, message="by user"), at(2))
    assert s.phase is Phase.SUSPENDED
    s = transition(s, Event(K.RESUME), at(3))
    assert s.phase is Phase.PENDING and s.restarts == 1
    suspended = s.condition("Suspended")
    assert suspended is not None and suspended.status == "False"
    assert suspended.reason == "JobResumed"
    created = s.condition("Created")
    assert created is not None and created.time == T0  # untouched by the resume
    s = transition(s, Event(K.START), at(4))
    assert s.started_at == T0  # the first start


def test_trainers_resume_from_the_checkpoint_after_a_restart_or_a_suspension() -> None:
    assert not reach(Phase.TRAINING).resumes
    s = transition(reach(Phase.RESTARTING), Event(K.RESTARTED), at(1))
    assert s.phase is Phase.SERVING and s.resumes
    s = transition(reach(Phase.SUSPENDED), Event(K.RESUME), at(1))
    assert s.restarts == 0 and s.resumes


@pytest.mark.parametrize("kind", [K.DEADLINE_EXCEEDED, K.CANCELLED, K.FAIL])
def test_failing_events_keep_their_reason(kind: EventKind) -> None:
    s = reach(Phase.SERVING)
    s = transition(s, Event(kind, reason="ImagePullBackOff" if kind is K.FAIL else ""), at(1))
    cond = s.condition("Failed")
    assert cond is not None
    assert cond.reason == {K.DEADLINE_EXCEEDED: "DeadlineExceeded", K.CANCELLED: "Cancelled"}.get(
        kind, "ImagePullBackOff"
    )
    err = s.error()
    assert err is not None and cond.reason in str(err)


def test_condition_times_follow_changes() -> None:
    s = reach(Phase.SERVING, backoff_limit=5)
    s = transition(s, Event.role_failed(RoleName.trainer(0), "m0", 1), at(1))
    s = transition(s, Event(K.RESTARTED), at(2))
    serving = s.condition("Serving")
    assert serving is not None and serving.status == "True" and serving.time == at(2)
    s = transition(s, Event.role_failed(RoleName.trainer(0), "m0", 1), at(3))
    serving = s.condition("Serving")
    assert serving is not None and serving.status == "False" and serving.time == at(3)
    created = s.condition("Created")
    assert created is not None and created.time == T0
    assert len({c.type for c in s.conditions}) == len(s.conditions)


def test_state_round_trips_through_dict() -> None:
    s = reach(Phase.TRAINING, backoff_limit=2)
    s = transition(s, Event.role_failed(RoleName.trainer(1), "m1", 3, "boom"), at(7))
    assert state_from_dict(s.to_dict(), backoff_limit=2) == s
    s = transition(s, Event(K.RESTARTED), at(8))
    s = transition(s, Event(K.FAIL, reason="ImagePullBackOff", message="no image"), at(9))
    assert state_from_dict(s.to_dict(), backoff_limit=2) == s


def test_a_failure_s_role_is_read_once_with_the_status() -> None:
    """The failed role is a RoleName when the status is read back (the operator's, a
    run's state.json); text that names no role is refused there, naming the field."""
    s = reach(Phase.TRAINING, backoff_limit=0)
    s = transition(s, Event.role_failed(RoleName.trainer(1), "m1", 3, "boom"), at(7))
    d = s.to_dict()
    assert d["failure"]["role"] == "trainer:1"
    back = state_from_dict(d)
    assert back.failure is not None and back.failure.role == RoleName.trainer(1)
    d["failure"]["role"] = "trainer:one"
    with pytest.raises(WorkflowError, match=r"failure\.role: 'trainer:one' is not a role name"):
        state_from_dict(d)


def test_status_is_written_in_the_kubernetes_shape() -> None:
    """camelCase, empty fields left out (restarts always there), times in UTC to the
    second, the spec's backoff limit not written: status.workflow as it always was."""
    east = timezone(timedelta(hours=2))
    s = initial_state(T0 + timedelta(microseconds=900), backoff_limit=2)
    s = transition(s, Event(K.START), (at(1) + timedelta(microseconds=5)).astimezone(east))
    created = {
        "type": "Created",
        "status": "True",
        "reason": "JobCreated",
        "message": "job created",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    partitioning = {
        "type": "Partitioning",
        "status": "True",
        "reason": "JobStarted",
        "message": "Pending -> Partitioning",
        "lastTransitionTime": "2026-01-01T00:00:01Z",
    }
    assert json.dumps(s.to_dict()) == json.dumps(
        {
            "phase": "Partitioning",
            "conditions": [created, partitioning],
            "restarts": 0,
            "startTime": "2026-01-01T00:00:01Z",
        }
    )
    s = transition(s, Event.role_failed(RoleName.trainer(1), "m1", 0, "boom"), at(2))
    s = transition(s, Event(K.RESTARTED), at(3))
    s = transition(s, Event.role_failed(RoleName.trainer(1), "m1", 3), at(4))
    s = transition(s, Event(K.RESTARTED), at(4))
    s = transition(s, Event.role_failed(RoleName.trainer(1), "m1", 3), at(5))
    d = s.to_dict()
    assert list(d) == [
        "phase", "conditions", "restarts", "startTime", "completionTime", "failure"
    ]  # fmt: skip
    assert d["failure"] == {
        "kind": "RoleFailed",
        "role": "trainer:1",
        "machine": "m1",
        "exitCode": 3,
    }
    assert (d["restarts"], d["completionTime"]) == (2, "2026-01-01T00:00:05Z")
    restarting = transition(
        reach(Phase.SERVING, 1), Event.role_failed(RoleName.trainer(0), "m0", 0), at(6)
    )
    d = restarting.to_dict()
    assert (d["resumePhase"], d["restarts"]) == ("Serving", 1)
    assert "failure" not in d and "completionTime" not in d and "backoffLimit" not in d


def test_status_read_back_passes_over_unknown_fields() -> None:
    """A newer operator's status (or state.json's launcher and jobFile) still reads."""
    s = reach(Phase.SERVING)
    data = {**s.to_dict(), "launcher": {"pid": 1}, "jobFile": "job.yaml"}
    data["conditions"] = [{**c, "observedGeneration": 3} for c in data["conditions"]]
    assert state_from_dict(data, backoff_limit=1) == s


def _status(**change: Any) -> dict[str, Any]:
    d = reach(Phase.FAILED).to_dict()
    return {k: v for k, v in {**d, **change}.items() if v is not None}


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (_status(phase="Dancing"), "status.workflow: phase: Invalid enum value 'Dancing'"),
        (_status(phase=None), "status.workflow: phase: missing"),
        (_status(restarts="1"), "status.workflow: restarts: Expected `int`, got `str`"),
        (_status(restarts=-1), "status.workflow: restarts: Expected `int` >= 0"),
        (_status(resumePhase="Later"), "status.workflow: resumePhase: Invalid enum value 'Later'"),
        (
            _status(conditions=[{"type": "Created", "status": "True"}]),
            "status.workflow: conditions[0].reason: missing",
        ),
        (
            _status(conditions=[{**_status()["conditions"][0], "status": "Maybe"}]),
            "status.workflow: conditions[0].status: Invalid enum value 'Maybe'",
        ),
        (
            _status(startTime="2026-01-01T00:00:00"),
            "status.workflow: startTime: Expected `datetime` with a timezone component",
        ),
        (
            _status(completionTime="yesterday"),
            "status.workflow: completionTime: Invalid RFC3339 encoded datetime",
        ),
        (_status(failure={"kind": "Boom"}), "status.workflow: failure.kind: Invalid enum value"),
        (
            _status(failure={"kind": "RoleFailed", "exitCode": "3"}),
            "status.workflow: failure.exitCode: Expected `int | null`, got `str`",
        ),
        (["Failed"], "status.workflow: Expected `object`, got `array`"),
    ],
)
def test_malformed_status_is_one_line_naming_the_field(data: Any, line: str) -> None:
    with pytest.raises(WorkflowError) as err:
        state_from_dict(data, where="status.workflow")
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


@given(
    kinds=st.lists(st.sampled_from(list(EventKind)), max_size=40),
    backoff=st.integers(min_value=0, max_value=3),
)
@settings(max_examples=200, deadline=None)
def test_random_event_sequences_keep_the_invariants(kinds: list[EventKind], backoff: int) -> None:
    s = initial_state(T0, backoff_limit=backoff)
    failed_roles = 0
    for i, kind in enumerate(kinds):
        if not accepts(s, kind):
            with pytest.raises(WorkflowError):
                transition(s, Event(kind), at(i))
            continue
        before = s
        s = transition(s, Event(kind), at(i))
        failed_roles += kind is K.ROLE_FAILED
        assert before.phase not in TERMINAL  # terminal phases accept nothing
        assert s.restarts <= backoff
        assert len({c.type for c in s.conditions}) == len(s.conditions)
        true = [c.type for c in s.conditions if c.status == "True" and c.type != "Created"]
        assert len(true) <= 1  # at most the current phase's condition is True
        if s.phase is Phase.SUCCEEDED:
            # success needs a full forward run after the last failure
            assert before.phase is Phase.TRAINING
        if s.phase is Phase.FAILED:
            assert s.error() is not None
        assert state_from_dict(s.to_dict(), backoff_limit=backoff) == s
    assert s.restarts <= failed_roles


def test_permanent_role_failure_is_not_retried() -> None:
    from graphrun.errors import USER_ERROR_EXIT

    now = datetime(2026, 1, 1, tzinfo=UTC)
    s = replay(initial_state(now, backoff_limit=3), [Event(EventKind.START)], now)
    transient = transition(s, Event.role_failed(RoleName.trainer(0), "m0", 1, "boom"), now)
    assert transient.phase is Phase.RESTARTING
    failed = transition(
        s, Event.role_failed(RoleName.trainer(0), "m0", USER_ERROR_EXIT, "bad"), now
    )
    assert failed.phase is Phase.FAILED and failed.restarts == 0
    assert failed.condition("Failed").reason == "NotRetriable"


def test_progress_rewords_the_current_condition_only() -> None:
    s = transition(initial_state(T0), Event(K.START, message="starting"), at(1))
    later = progress(s, "2 worker pods partition together: w-0 Partitioning, w-1 Waiting")
    cond = later.condition("Partitioning")
    assert cond is not None and cond.status == "True" and cond.time == at(1)  # no transition
    assert cond.message == "2 worker pods partition together: w-0 Partitioning, w-1 Waiting"
    assert later.phase is Phase.PARTITIONING and later.condition("Created") == s.condition(
        "Created"
    )
    assert progress(later, cond.message) is later
