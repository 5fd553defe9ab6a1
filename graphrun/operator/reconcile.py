"""The operator's pure core: ``reconcile(job, status, observed, now) -> Plan``.

Given the validated GraphJob, its current status and what exists of its children, it
drives the shared workflow (:mod:`graphrun.job.workflow`) and returns what to do: objects
to create or delete, Kubernetes events to emit, the new status, and when to look again.
The kopf handlers only gather the inputs and carry out the plan.

How phases map to Kubernetes:

=============  ===============================================================
Pending        base objects (Secret, ConfigMap, headless Service, PodGroup)
Partitioning   the partitioner Job runs; skipped once ``status.partitioned``.
               partition.mode distributed: no Job; the worker pods are created and
               each partitions first (init container ``partition``, rank = machine
               index); ``status.partitionPods`` and the condition's message say
               where each pod is (Waiting, Partitioning, Partitioned, Failed), an
               event marks each step
Distributing   nothing to move: partitions reach workers on the shared volume
Serving        worker pods created (one per machine with a store server or a
               trainer); waits until every worker is Ready
Training       (launcher pod if any); waits until every worker exited 0
Restarting     every worker (and launcher) pod deleted, then Serving again with
               ``--resume`` (trainers continue from the last checkpoint)
Suspended      every pod and the partitioner Job deleted; resume starts over
               (partitions are kept). The trainers get SIGTERM and write an exact
               checkpoint first; the pods ``--resume`` from it
Queued         (a condition, not a phase) a job labelled kueue.x-k8s.io/queue-name:
               its pods are created gated and wait for Kueue's admission
               (:mod:`.queueing`); an eviction by Kueue suspends the job until its
               pods are gone, then queues it again
Succeeded /    cleanPodPolicy applied; the GraphJob is deleted
Failed         ttlSecondsAfterFinished after completion
=============  ===============================================================

Failures: a pod that fails is a failed role (restart within backoffLimit, else Failed);
a worker pod whose partition rank fails is ``partitioner:<index>`` — the rank that
failed by itself, not those that exited PEER_LOST_EXIT because they lost it; one that
disappears while partitioning fails the attempt too (the others cannot finish without it);
a pod that stays Pending (unschedulable, image pull) beyond ``startupDeadlineSeconds``,
or whose image can never be pulled, fails the job with that reason; so does
``activeDeadlineSeconds``. A job with a failed worker never becomes Succeeded, except
with ``runtime.elastic``: a worker pod lost while training that :mod:`.elastic` lets the
others go on without is listed in ``status.lostMachines`` and made again, once gone, in
join mode (its trainers join at the next epoch boundary).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from graphrun.errors import PEER_LOST_EXIT
from graphrun.job.spec import GraphJob
from graphrun.job.workflow import (
    ACTIVE,
    Event,
    EventKind,
    JobState,
    Phase,
    initial_state,
    parse_time,
    progress,
    rfc3339,
    state_from_dict,
    transition,
)
from graphrun.operator import builders as B
from graphrun.operator import elastic as E
from graphrun.operator import layout as L
from graphrun.operator import queueing as Q
from graphrun.operator import rendezvous as RZ
from graphrun.operator.keys import CurveKeyPair
from graphrun.operator.observe import Observed, PodView
from graphrun.operator.render import base_builders
from graphrun.operator.status import condition_type, replica_statuses, state_status

K = EventKind
NEVER_PULLS = frozenset({"InvalidImageName", "ErrImageNeverPull"})
WAITING_FAILURES = frozenset({"ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError"})
MAX_STEPS = 12
# A rank that only lost a peer ends about when the one that failed does: wait this long
# for the culprit's pod to report before blaming a rank that lost it.
PEER_GRACE = timedelta(seconds=10)
# a worker pod annotated graphrun.io/stop is deleted this long after: the kubelet writes
# the annotations file of a running pod (not of a deleted one) within about a second
MARK_LEAD = timedelta(seconds=5)


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
    (:func:`graphrun.operator.elastic.uses_stop_mark`), and when (``graphrun.io/stop-at``):
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
    status: dict[str, Any]
    requeue_after: float | None = None


@dataclass
class _Run:
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
    pod_steps_before: dict[str, str] = field(default_factory=dict)  # status.partitionPods
    pod_steps: dict[str, str] | None = None
    actions: list[Action] = field(default_factory=list)
    wake: list[float] = field(default_factory=list)
    queue: dict[str, Any] = field(default_factory=dict)  # status.queue (Kueue admission)
    group_restarts: dict[str, int] = field(default_factory=dict)  # status.restartsByReplica
    lost: list[dict[str, Any]] = field(default_factory=list)  # status.lostMachines (elastic)
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


def _replica_group(role: str | None) -> str:
    """The role group a failed role belongs to: its pods' replica type."""
    head = (role or "").split(":")[0]
    return head if head in ("partitioner", "launcher") else "worker"


def _within_restart_limit(run: _Run, event: Event) -> Event:
    """A role failure whose group has spent its restarts (runPolicy.failurePolicy.
    restartLimits) fails the job instead of restarting it."""
    policy = run.job.spec.run_policy.failure_policy
    if event.kind is not K.ROLE_FAILED or policy is None:
        return event
    group = _replica_group(event.role)
    limit = policy.restart_limits.get(group)  # type: ignore[call-overload]
    used = run.group_restarts.get(group, 0)
    if limit is None or used < limit:
        return event
    message = (
        f"{event.describe()}; the {group} group has used its {limit} restarts "
        f"(spec.runPolicy.failurePolicy.restartLimits.{group})"
    )
    return Event(K.FAIL, "RestartLimitExceeded", message, event.role, event.machine)


def load_state(job: GraphJob, status: dict[str, Any], now: datetime) -> JobState:
    backoff = job.spec.run_policy.backoff_limit
    saved = (status or {}).get("workflow")
    if not saved:
        return initial_state(now, backoff, "GraphJob accepted by the operator")
    return state_from_dict(saved, backoff, "status.workflow")


def reconcile(
    job: GraphJob,
    owner: L.Owner,
    config: L.OperatorConfig,
    status: dict[str, Any],
    observed: Observed,
    now: datetime,
    keys: CurveKeyPair,
) -> Plan:
    """One step of control: what to do now for ``job`` (pure)."""
    status = status or {}
    state = load_state(job, status, now)
    run = _Run(job, owner, config, observed, now, state, bool(status.get("partitioned")))
    if not status.get("workflow"):
        run.actions.append(Emit("Normal", "JobCreated", "GraphJob accepted by the operator"))
    run.partition_dir_before = str(status.get("partitionDir", ""))
    run.queue = dict(status.get("queue") or {})
    run.group_restarts = dict(status.get("restartsByReplica") or {})
    run.lost_before = bool(status.get("lostMachines"))
    if status.get("phase") in (Phase.TRAINING.value, "Succeeded", "Failed"):
        # copies: an entry changes when its machine is made again (compared with the old)
        run.lost = [dict(e) for e in status.get("lostMachines") or []]  # else none
    if status.get("phase") == Phase.PARTITIONING.value:  # else a new attempt: none yet
        run.pod_steps_before = dict(status.get("partitionPods") or {})
    _check_spec_change(run, status.get("specHashes"))
    for _ in range(MAX_STEPS):
        phase = run.state.phase
        _step(run, keys)
        if run.state.phase is phase:
            break
    if run.state.terminal:
        _finished(run)
    requeue = min(run.wake) if run.wake else None
    return Plan(tuple(run.actions), _status(run), requeue)


def reject(status: dict[str, Any], reason: str, message: str, now: datetime) -> Plan:
    """The spec cannot run: Failed with the reason (the field named in the message)."""
    saved = (status or {}).get("workflow")
    state = state_from_dict(saved, where="status.workflow") if saved else initial_state(now)
    if state.terminal:
        return Plan((), status)
    state = transition(state, Event(K.FAIL, reason, message), now)
    new = {**(status or {}), **state_status(state)}
    return Plan((Emit("Warning", reason, message),), new)


# --- spec changes -----------------------------------------------------------------------

# What the pods were made from. runPolicy may change at any time (suspend, deadlines);
# the rest only while the job is suspended (the ConfigMap is then made again).
PINNED = (
    "graph", "partition", "runtime", "training", "placement",
    "image", "imagePullPolicy", "sharedVolume", "replicaSpecs",
)  # fmt: skip
REPARTITION = ("graph", "partition")


def spec_hashes(job: GraphJob) -> dict[str, str]:
    spec = job.spec.model_dump(by_alias=True, mode="json")
    return {
        key: hashlib.sha256(json.dumps(spec.get(key), sort_keys=True).encode()).hexdigest()[:16]
        for key in PINNED
    }


def _check_spec_change(run: _Run, saved: dict[str, str] | None) -> None:
    new = spec_hashes(run.job)
    run.spec_hashes = dict(saved) if saved else new
    changed = [k for k in PINNED if saved and saved.get(k) != new[k]]
    if not changed or run.state.terminal:
        return
    fields = ", ".join(f"spec.{k}" for k in changed)
    repartition = any(k in REPARTITION for k in changed)
    if (
        run.state.phase is Phase.SUSPENDED
        and repartition
        and run.partitioned
        and (L.partition_dir(run.job) == run.partition_dir_before)
    ):
        message = (
            f"{fields} changed: give a new spec.partition.output (the partitions in "
            f"{run.partition_dir_before} were made with the old settings)"
        )
        run.fire(Event(K.FAIL, "SpecChanged", message))
        return
    if run.state.phase is Phase.SUSPENDED:
        run.spec_hashes = new
        if "ConfigMap" in run.observed.kinds:
            run.actions.append(Delete("v1", "ConfigMap", L.configmap_name(run.owner.name)))
            run.observed = replace(run.observed, kinds=run.observed.kinds - {"ConfigMap"})
        if repartition:
            run.partitioned = False
        run.actions.append(Emit("Normal", "SpecUpdated", f"{fields} changed while suspended"))
        return
    message = (
        f"{fields} changed while the job was running; suspend the job "
        "(spec.runPolicy.suspend) to change it, or create a new GraphJob"
    )
    run.fire(Event(K.FAIL, "SpecChanged", message))


# --- one step ---------------------------------------------------------------------------


def _step(run: _Run, keys: CurveKeyPair) -> None:
    spec = run.job.spec
    phase = run.state.phase
    if run.state.terminal:
        return
    if spec.run_policy.suspend and phase is not Phase.SUSPENDED:
        run.fire(Event(K.SUSPEND, message="spec.runPolicy.suspend is true"))
        return
    if phase is Phase.SUSPENDED:
        if spec.run_policy.suspend:
            _delete_all_pods(run, partitioner=True)
        elif _evicted(run.state):
            if not _delete_all_pods(run, partitioner=False):  # their checkpoint is written
                message = f"evicted by Kueue: queued again in {Q.queue_name(run.job)}"
                run.fire(Event(K.RESUME, "Requeued", message))
        else:
            run.fire(Event(K.RESUME, message="spec.runPolicy.suspend is false"))
        return
    if _deadline_passed(run) or _stopped_by_kueue(run):
        return
    _ensure_base(run, keys)
    handler = {
        Phase.PENDING: _pending,
        Phase.PARTITIONING: _partitioning,
        Phase.DISTRIBUTING: _distributing,
        Phase.SERVING: _serving,
        Phase.TRAINING: _training,
        Phase.RESTARTING: _restarting,
    }[phase]
    _track_admission(run)  # before: admission starts the deadlines
    handler(run)
    _track_admission(run)  # after: pods created gated now are queued now


def _evicted(state: JobState) -> bool:
    cond = state.condition("Suspended")
    return cond is not None and cond.status == "True" and cond.reason == "Evicted"


def _group_pods(run: _Run) -> list[PodView]:
    return [p for p in run.observed.pods if p.replica in ("worker", "launcher")]


def _stopped_by_kueue(run: _Run) -> bool:
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
    run.queue.update(queued=False, admittedAt=None)
    return True


def _track_admission(run: _Run) -> None:
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
        if not run.queue.get("queued"):
            run.actions.append(Emit("Normal", "Queued", message))
            run.queue = {"queued": True, "queuedAt": now, "admittedAt": None}
        run.queue.update(reason=reason, message=message)
    elif pods and run.queue.get("queued"):
        message = f"admitted by Kueue in {queue}: {len(pods)} pods may be scheduled"
        run.actions.append(Emit("Normal", "Admitted", message))
        run.queue.update(queued=False, admittedAt=now, reason="Admitted", message=message)


def _admitted_at(run: _Run) -> datetime | None:
    """When Kueue last admitted the job's pods (None while they wait), or, for a job not
    queued by Kueue, when it started: deadlines count from there."""
    if Q.queue_name(run.job) is None:
        return run.state.started_at
    at = run.queue.get("admittedAt")
    return parse_time(at) if at else None


def _deadline_passed(run: _Run) -> bool:
    limit = run.job.spec.run_policy.active_deadline_seconds
    start = _admitted_at(run)
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


def _ensure_base(run: _Run, keys: CurveKeyPair) -> None:
    """Create the Secret, ConfigMap, headless Service, NetworkPolicy and the gang
    scheduler's objects (a PodGroup; or a Workload and its PodGroups) if missing."""
    have = run.observed.kinds
    made = set()
    for kind, build in base_builders(run.job, run.owner, run.config, keys).items():
        if kind in have or not (objs := build()):
            continue
        for obj in objs if isinstance(objs, list) else [objs]:
            run.actions.append(Create(obj))
        made.add(kind)
    run.observed = replace(run.observed, kinds=have | made)


def _pending(run: _Run) -> None:
    if L.partitions_on_workers(run.job):
        message = "creating the worker pods: they partition together, then serve"
    else:
        message = "creating the partitioner"
    run.fire(Event(K.START, message=message))


def _partitioning(run: _Run) -> None:
    store = run.job.spec.graph.store
    if store is not None:
        at = ", ".join(store.addresses)
        run.fire(Event(K.PARTITIONED, "RunningStore", f"the job uses the running store at {at}"))
        return
    if run.partitioned:
        run.fire(Event(K.PARTITIONED, "PartitionsExist", "partitions were made before"))
        return
    if L.partitions_on_workers(run.job):
        _partition_on_workers(run)
        return
    part = run.observed.partitioner
    pods = run.observed.of("partitioner")
    if _pod_problems(run, [p for p in pods if not p.deleting]):
        return
    if part is None or part.deleting:
        if part is None:
            run.actions.append(Create(B.build_partitioner(run.job, run.owner, run.config)))
        return
    if part.complete:
        run.partitioned = True
        out = L.partition_dir(run.job)
        run.fire(Event(K.PARTITIONED, message=f"partitions written to {out}"))
    elif part.failed:
        failed = [p for p in pods if p.phase == "Failed"]
        code = failed[-1].exit_code if failed else None
        detail = failed[-1].failure()[3] if failed else part.message
        where = failed[-1].name if failed else part.name
        run.fire(Event.role_failed("partitioner", where, code, detail or part.message))


def _partition_on_workers(run: _Run) -> None:
    """partition.mode distributed: every worker pod runs its partition rank first (its
    init container), then serves; partitioned once every pod's rank has finished."""
    workers = _ensure_workers(run)
    _ensure_rendezvous(run)  # made with the worker pods, watched once they serve
    if workers is None:
        return
    pods = list(workers.values())
    _report_pod_steps(run, pods)
    if _partition_failure(run, pods) or _pod_problems(run, pods):
        return
    if all(p.partition_step == "Partitioned" for p in pods):
        run.partitioned = True
        out = L.partition_dir(run.job)
        message = f"{len(pods)} worker pods partitioned together; partitions written to {out}"
        run.fire(Event(K.PARTITIONED, message=message))


def _report_pod_steps(run: _Run, pods: list[PodView]) -> None:
    """Each pod's partition step: in ``status.partitionPods`` and the Partitioning
    condition's message, and an event when it moves on."""
    n = len(pods)
    steps = {p.name: p.partition_step for p in pods}
    for p in pods:
        step = steps[p.name]
        if step == run.pod_steps_before.get(p.name) or step == "Waiting":
            continue
        where = f"pod {p.name} (machine {_machine(run, p)}, rank {p.index} of {n})"
        if step == "Partitioning":
            run.actions.append(Emit("Normal", "PodPartitioning", f"{where} is partitioning"))
        elif step == "Partitioned":
            run.actions.append(Emit("Normal", "PodPartitioned", f"{where} has written its part"))
        else:
            code = p.init_exit_code if p.init_exit_code is not None else p.exit_code
            lost = " (it lost a peer)" if code == PEER_LOST_EXIT else ""
            detail = f"exit code {code}" if code is not None else "no exit code"
            message = f"{where} failed while partitioning ({detail}){lost}"
            run.actions.append(Emit("Warning", "PodPartitionFailed", message))
    run.pod_steps = steps
    listing = ", ".join(f"{name} {step}" for name, step in steps.items())
    run.state = progress(run.state, f"{n} worker pods partition together: {listing}")


def _partition_failure(run: _Run, pods: list[PodView]) -> bool:
    """Fire the failure of the rank that failed by itself (True), as ``graphrun run``
    does: ranks that exited PEER_LOST_EXIT only lost it. While only such ranks have
    failed, wait PEER_GRACE for the culprit's pod to report (True: nothing else to do)."""
    failed = [p for p in pods if p.partition_step == "Failed"]
    if not failed:
        return False
    culprit = next((p for p in failed if p.init_exit_code != PEER_LOST_EXIT), None)
    if culprit is None:
        ends = [p.init_finished for p in failed if p.init_finished is not None]
        until = min(ends) + PEER_GRACE if ends else run.now
        if run.now < until:
            run.wake_at(until)
            return True
        culprit = failed[0]
    _, _, code, message = culprit.failure()
    message = message or f"pod {culprit.name} failed while partitioning"
    role, machine = f"partitioner:{culprit.index}", _machine(run, culprit)
    run.fire(Event.role_failed(role, machine, code, message))
    return True


def _distributing(run: _Run) -> None:
    claim = L.shared_volume(run.job).claim_name
    run.fire(
        Event(K.DISTRIBUTED, "SharedVolume", f"workers read the partitions from volume {claim}")
    )


def _serving(run: _Run) -> None:
    rdv = _ensure_rendezvous(run)
    if _rendezvous_lost(run, missing_ok=True):
        return
    workers = _ensure_workers(run)
    if workers is None or _pod_problems(run, [*workers.values(), *rdv]):
        return
    if L.rendezvous_apart(run.job) and not any(p.ready for p in rdv):
        return  # its pod is made with the workers: ready before the trainers need it
    if all(p.ready or p.phase == "Succeeded" for p in workers.values()):
        n = len(workers)
        run.fire(Event(K.SERVERS_READY, message=f"all {n} workers are serving"))


def _training(run: _Run) -> None:
    _note_lost_machines(run)
    if _rendezvous_lost(run):
        return
    workers = _ensure_workers(run)
    if workers is None:
        return
    launcher = _ensure_launcher(run)
    pods = list(workers.values()) + ([launcher] if launcher else [])
    if _pod_problems(run, pods):
        return
    need_launcher = run.job.spec.replica_specs.launcher is not None
    if need_launcher and launcher is None:
        return
    success = run.job.spec.run_policy.success_policy
    if success is None:
        if all(p.phase == "Succeeded" for p in pods):
            lost = ", ".join(e["machine"] for e in run.lost)
            left = f" (machines lost: {lost})" if lost else ""
            message = f"all {len(workers)} workers finished{left}"
            run.fire(Event(K.TRAINING_DONE, message=message))
        return
    targets = [t for t in success.target_replicas if t == "worker" or need_launcher]
    done = [p for p in pods if p.replica in targets]
    if done and all(p.phase == "Succeeded" for p in done):
        groups = " and ".join(targets)
        message = f"every {groups} pod succeeded (spec.runPolicy.successPolicy)"
        run.fire(Event(K.TRAINING_DONE, "SuccessPolicyMet", message))


def _restarting(run: _Run) -> None:
    again_from = run.state.resume_phase
    left = _delete_all_pods(run, partitioner=again_from is Phase.PARTITIONING)
    if not left:
        run.fire(Event(K.RESTARTED, message=f"restart {run.state.restarts}: roles start again"))


# --- children ---------------------------------------------------------------------------


def _lost_indices(run: _Run) -> set[int]:
    """The worker indices of machines lost and not made again (yet)."""
    names = run.job.spec.machine_names
    return {names.index(m) for m in E.lost_now(run.lost) if m in names}


def _note_lost_machines(run: _Run) -> None:
    """runtime.elastic: a worker pod that failed, is being deleted or disappeared while
    the job trains is a lost machine the others go on without, when :mod:`.elastic`
    allows it (recorded in ``status.lostMachines``, an event and the Running condition;
    the pod is made again once gone: :func:`_replace_lost_machines`). Any other loss is
    left to fail the attempt."""
    elastic = run.job.spec.runtime.elastic
    if elastic is None:
        return
    have, lost = run.observed.workers(), _lost_indices(run)
    indices = L.worker_indices(run.job)
    for i in indices:
        pod = have.get(i)
        if i in lost or (pod is not None and pod.phase != "Failed" and not pod.deleting):
            continue
        machine = run.job.spec.machine_names[i]
        again = E.replaced_count(run.lost, machine)
        stores_gone = [e["machine"] for e in run.lost]
        why = E.why_not_survived(run.job, machine, len(indices), len(lost), again, stores_gone)
        if why is not None:
            continue
        if pod is None:
            name, how, code = L.worker_name(run.owner.name, i), "disappeared", None
        else:
            how = "failed" if pod.phase == "Failed" else "deleted"
            name, code = pod.name, pod.exit_code
        gone = [*dict.fromkeys(e["machine"] for e in run.lost), machine]
        back = [m for m in gone if m not in E.lost_now(run.lost) and m != machine]
        entry = E.lost_entry(run.job, name, machine, how, code, rfc3339(run.now), gone, back)
        run.lost.append(entry)
        lost.add(i)
        message = E.describe(entry, len(indices), len(lost), elastic.min_machines)
        run.actions.append(Emit("Warning", "MachineLost", message))
        run.state = progress(run.state, message)
    _replace_lost_machines(run)


def _replace_lost_machines(run: _Run) -> None:
    """Make a lost machine's pod again once the lost one is gone (a failed pod is
    deleted first), under the same name (its DNS name in the hosts file), in join mode
    (:func:`graphrun.operator.builders.build_worker`): its trainers join at the next
    epoch boundary; its store servers are not started again."""
    have = run.observed.workers()
    lost = _lost_indices(run)
    if any(p.phase == "Failed" for i, p in have.items() if i not in lost):
        return  # a loss the job does not survive: the attempt fails (_pod_problems)
    names = run.job.spec.machine_names
    resume = run.state.restarts > 0 or run.state.condition("Suspended") is not None
    for entry in run.lost:
        if entry.get("replaced"):
            continue
        i = names.index(entry["machine"])
        pod = have.get(i)
        if pod is not None:
            if not pod.deleting:  # failed: its logs go with it (the event keeps the why)
                run.actions.append(Delete("v1", "Pod", pod.name))
            continue
        obj = B.build_worker(run.job, run.owner, run.config, i, resume, join=True)
        run.actions.append(Create(obj))
        entry.update(replaced=True, replacement=obj["metadata"]["name"])
        run.replacing.add(i)
        message = E.describe_replacement(entry)
        run.actions.append(Emit("Normal", "MachineReplaced", message))
        run.state = progress(run.state, message)


def _ensure_workers(run: _Run) -> dict[int, PodView] | None:
    """The worker pods, creating missing ones. None while some are still being deleted
    or were created just now. Lost machines' pods (:func:`_note_lost_machines`) are left
    out, and not made again."""
    lost = _lost_indices(run)
    have = {i: p for i, p in run.observed.workers().items() if i not in lost}
    if any(p.deleting for p in have.values()) or run.replacing:
        return None
    missing = [i for i in L.worker_indices(run.job) if i not in have and i not in lost]
    # A pod lost while training, or while partitioning with the others (they cannot
    # finish without its rank), fails the attempt; elsewhere it is made again.
    partitioning = [i for i in missing if L.worker_name(run.owner.name, i) in run.pod_steps_before]
    if (missing and run.state.phase is Phase.TRAINING) or partitioning:
        i = (partitioning or missing)[0]
        machine = run.job.spec.machine_names[i]
        role, during = ("partitioner", " while partitioning") if partitioning else ("worker", "")
        message = f"the worker pod disappeared{during}"
        run.fire(Event.role_failed(f"{role}:{i}", machine, None, message))
        return None
    # After a restart or a suspension, trainers continue from the last checkpoint.
    resume = run.state.restarts > 0 or run.state.condition("Suspended") is not None
    for i in missing:
        run.actions.append(Create(B.build_worker(run.job, run.owner, run.config, i, resume)))
    return None if missing else have


def _ensure_rendezvous(run: _Run) -> list[PodView]:
    """The rendezvous pod of an elastic job (:mod:`.rendezvous`), made if missing, as
    the worker pods are (never while training: losing it then fails the attempt,
    :func:`_rendezvous_lost`); [] while there is none, or none being kept."""
    if not L.rendezvous_apart(run.job):
        return []
    pods = run.observed.of(RZ.REPLICA)
    if not pods and run.state.phase is not Phase.TRAINING:
        run.actions.append(Create(RZ.build_rendezvous(run.job, run.owner, run.config)))
    return [p for p in pods if not p.deleting]


def _rendezvous_lost(run: _Run, missing_ok: bool = False) -> bool:
    """A rendezvous pod that failed, ended, is being deleted or disappeared (``missing_ok``:
    not made yet is fine) is a failed role ``rendezvous`` (the restart policy applies, as
    for trainer 0's machine when trainer 0 serves it): the trainers could not re-form."""
    if not L.rendezvous_apart(run.job):
        return False
    pod = next(iter(run.observed.of(RZ.REPLICA)), None)
    if pod is None and missing_ok:
        return False
    if pod is not None and pod.phase in ("Pending", "Running") and not pod.deleting:
        return False
    name = L.rendezvous_name(run.owner.name)
    code = None
    if pod is None:
        message = f"the rendezvous pod {name} disappeared"
    elif pod.deleting:
        message = f"the rendezvous pod {name} is being deleted"
    else:
        _, _, code, last = pod.failure()
        message = f"the rendezvous pod {name} ended ({pod.phase})" + (f": {last}" if last else "")
    run.fire(Event.role_failed(RZ.REPLICA, name, code, message))
    return True


def _ensure_launcher(run: _Run) -> PodView | None:
    if run.job.spec.replica_specs.launcher is None:
        return None
    pods = [p for p in run.observed.of("launcher") if not p.deleting]
    if pods:
        return pods[0]
    if not run.observed.of("launcher"):
        run.actions.append(Create(B.build_launcher(run.job, run.owner, run.config)))
    return None


def _delete_all_pods(run: _Run, partitioner: bool) -> bool:
    """Delete worker and launcher pods, then the rendezvous pod (and the partitioner
    Job); True while any remain.
    Worker pods that tell a one-pod deletion from a stop of the whole job are first
    annotated ``graphrun.io/stop: job`` and deleted MARK_LEAD after (the kubelet has
    then written the mark to the running pod's annotations file)."""
    left = False
    marks = E.uses_stop_mark(run.job)
    # the rendezvous pod goes last: the trainers stopping with the job may still meet there
    others = any(p.replica in ("worker", "launcher") for p in run.observed.pods)
    for p in run.observed.pods:
        if p.replica == "partitioner" and not partitioner:
            continue
        left = True
        if p.deleting or p.replica == "partitioner" or (p.replica == RZ.REPLICA and others):
            continue
        if marks and p.replica == "worker" and not p.finished:
            if not p.stop_marked:
                run.actions.append(MarkStop(p.name, rfc3339(run.now)))
                run.wake_at(run.now + MARK_LEAD)
                continue
            if p.stop_marked_at is not None and run.now < p.stop_marked_at + MARK_LEAD:
                run.wake_at(p.stop_marked_at + MARK_LEAD)
                continue
        run.actions.append(Delete("v1", "Pod", p.name))
    part = run.observed.partitioner
    if partitioner and part is not None:
        left = True
        if not part.deleting:
            run.actions.append(Delete("batch/v1", "Job", part.name))
    return left


def _pod_problems(run: _Run, pods: list[PodView]) -> bool:
    """Fire the first failure among ``pods``; True if one was fired."""
    for p in pods:
        if p.phase == "Failed":
            role, machine, code, msg = p.failure()
            if role is None:
                role = f"{p.replica}:{p.index}" if p.index is not None else p.replica
                machine = _machine(run, p)
            where = machine or _machine(run, p)
            run.fire(Event.role_failed(role, where, code, msg or f"pod {p.name} failed"))
            return True
    startup = timedelta(seconds=run.job.spec.run_policy.startup_deadline_seconds)
    admitted = _admitted_at(run) if Q.queue_name(run.job) else None
    for p in pods:
        if p.started or p.gated:  # a rank may run in its init container; gated: queued
            continue
        if admitted is not None and p.created is not None and p.created < admitted:
            p = replace(p, created=admitted)  # pending since its admission, not creation
        if p.waiting_reason in NEVER_PULLS:
            run.fire(Event(K.FAIL, p.waiting_reason, f"pod {p.name}: {p.waiting_message}"))
            return True
        if p.created is None:
            continue
        if run.now >= p.created + startup:
            reason = p.waiting_reason if p.waiting_reason in WAITING_FAILURES else ""
            reason = reason or ("Unschedulable" if p.unschedulable else "StartupDeadlineExceeded")
            detail = p.waiting_message or p.unschedulable or "still pending"
            limit = int(startup.total_seconds())
            run.fire(Event(K.FAIL, reason, f"pod {p.name} not running after {limit}s: {detail}"))
            return True
        run.wake_at(p.created + startup)
    return False


def _machine(run: _Run, pod: PodView) -> str:
    """The machine of a worker pod; the pod's name for the others."""
    names = run.job.spec.machine_names
    if pod.replica == "worker" and pod.index is not None and pod.index < len(names):
        return names[pod.index]
    return pod.name


def _finished(run: _Run) -> None:
    policy = run.job.spec.run_policy
    for p in run.observed.pods:
        if p.deleting:
            continue
        cleaned = policy.clean_pod_policy == "All" or (
            policy.clean_pod_policy != "None" and not p.finished
        )
        if cleaned or (p.replica == RZ.REPLICA and not p.finished):  # it never ends itself
            run.actions.append(Delete("v1", "Pod", p.name))
    part = run.observed.partitioner
    if policy.clean_pod_policy == "All" and part is not None and not part.deleting:
        run.actions.append(Delete("batch/v1", "Job", part.name))
    ttl, done = policy.ttl_seconds_after_finished, run.state.finished_at
    if ttl is not None and done is not None:
        expiry = done + timedelta(seconds=ttl)
        if run.now >= expiry:
            run.actions.append(DeleteGraphJob())
        else:
            run.wake_at(expiry)


# --- status -----------------------------------------------------------------------------


def _status(run: _Run) -> dict[str, Any]:
    out = state_status(run.state)
    out["partitioned"] = run.partitioned
    out["specHashes"] = run.spec_hashes
    if run.partitioned:
        out["partitionDir"] = L.partition_dir(run.job)
    if run.pod_steps is not None and run.state.phase is Phase.PARTITIONING:
        out["partitionPods"] = run.pod_steps
    out["replicaStatuses"] = replica_statuses(run.observed)
    if run.lost or run.lost_before:  # the status is merge-patched: null removes it
        out["lostMachines"] = run.lost or None
    if run.group_restarts:
        out["restartsByReplica"] = run.group_restarts
    if run.queue:
        out["queue"] = run.queue
        q = run.queue
        queued = bool(q.get("queued"))
        out["conditions"].append(
            {
                "type": "Queued",
                "status": "True" if queued else "False",
                "reason": q.get("reason") or ("WaitingForAdmission" if queued else "Admitted"),
                "message": q.get("message") or "",
                "lastTransitionTime": (q.get("queuedAt") if queued else q.get("admittedAt"))
                or rfc3339(run.now),
            }
        )
    if run.state.terminal:
        # Nothing left to clean up: later passes need not look at the children.
        out["cleanedUp"] = not any(isinstance(a, Delete) for a in run.actions)
    return out
