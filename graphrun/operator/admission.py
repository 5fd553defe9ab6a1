"""Kueue admission of a GraphJob labelled ``kueue.x-k8s.io/queue-name``, as a
reconcile :class:`~graphrun.operator.plan.Hook`, and the deadlines that count from it.

The job's worker pods are a Kueue plain-pod group (:mod:`.queueing`): created gated,
they wait for admission, which ``status.queue`` and the ``Queued`` condition show; an
eviction by Kueue (it marks the pods TerminationTarget and deletes them) suspends the
job. ``runPolicy.activeDeadlineSeconds`` and the pods' startup deadline count from the
last admission (for a job not queued, from its start).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from graphrun.job.workflow import ACTIVE, Event, EventKind, JobState, parse_time, rfc3339
from graphrun.operator import queueing as Q
from graphrun.operator.observe import PodView
from graphrun.operator.plan import Create, Emit, Run
from graphrun.operator.status import QueueState

K = EventKind


class Admission:
    """The Kueue hook: an eviction ends the step (the job is suspended); the ``Queued``
    condition is brought up to date before the phase's handler (admission starts the
    deadlines) and after it (pods created gated now are queued now)."""

    def stops(self, run: Run) -> bool:
        return stopped_by_kueue(run)

    def before(self, run: Run) -> None:
        track_admission(run)

    def after(self, run: Run) -> None:
        track_admission(run)


def evicted(state: JobState) -> bool:
    cond = state.condition("Suspended")
    return cond is not None and cond.status == "True" and cond.reason == "Evicted"


def _group_pods(run: Run) -> list[PodView]:
    return [p for p in run.observed.pods if p.replica in ("worker", "launcher")]


def stopped_by_kueue(run: Run) -> bool:
    """Kueue evicted the pod group (it marks the pods TerminationTarget and deletes
    them): suspend the job; the pods' trainers are writing their checkpoint."""
    if Q.queue_name(run.job) is None or run.state.phase not in ACTIVE:
        return False
    stopped = [p for p in _group_pods(run) if p.stopped or p.deleting]
    if not stopped:
        return False
    p = stopped[0]
    why = p.stopped or "deleted"
    run.fire(Event(K.SUSPEND, "Evicted", f"Kueue stopped pod {p.name}: {why}"))
    if run.queue is not None:
        run.queue.queued, run.queue.admitted_at = False, None
    return True


def track_admission(run: Run) -> None:
    """The ``Queued`` condition of a Kueue job: True while its pods are gated, with
    Kueue's reason; False (reason ``Admitted``) once Kueue removed the gates."""
    queue = Q.queue_name(run.job)
    if queue is None:
        return
    # the pod group: the workers (the launcher, made later, is queued alone)
    pods = [p.gated for p in run.observed.of("worker") if not p.deleting]
    made = [
        a.obj
        for a in run.actions
        if isinstance(a, Create)
        and a.obj["kind"] == "Pod"
        and Q.GROUP_LABEL in a.obj["metadata"].get("labels", {})
    ]
    pods += [Q.GATE in {g["name"] for g in o["spec"].get("schedulingGates", [])} for o in made]
    gated = [g for g in pods if g]
    now = rfc3339(run.now)
    if gated:
        reason, message = run.observed.admission or Q.kueue_reason(None)
        message = f"{len(gated)} of {len(pods)} pods wait for admission in {queue}: {message}"
        if run.queue is None or not run.queue.queued:
            run.actions.append(Emit("Normal", "Queued", message))
            run.queue = QueueState(queued=True, queued_at=now)
        run.queue.reason, run.queue.message = reason, message
    elif pods and run.queue is not None and run.queue.queued:
        message = f"admitted by Kueue in {queue}: {len(pods)} pods may be scheduled"
        run.actions.append(Emit("Normal", "Admitted", message))
        run.queue.queued, run.queue.admitted_at = False, now
        run.queue.reason, run.queue.message = "Admitted", message


def admitted_at(run: Run) -> datetime | None:
    """When Kueue last admitted the job's pods (None while they wait), or, for a job not
    queued by Kueue, when it started: deadlines count from there."""
    if Q.queue_name(run.job) is None:
        return run.state.started_at
    at = run.queue.admitted_at if run.queue else None
    return parse_time(at) if at else None


def deadline_passed(run: Run) -> bool:
    limit = run.job.spec.run_policy.active_deadline_seconds
    start = admitted_at(run)
    if limit is None or start is None:
        return False
    end = start + timedelta(seconds=limit)
    if run.now >= end:
        run.fire(
            Event(
                K.DEADLINE_EXCEEDED,
                message=f"the job ran longer than spec.runPolicy.activeDeadlineSeconds ({limit}s)",
            )
        )
        return True
    run.wake_at(end)
    return False
