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
failed by itself, not those that exited PEER_LOST_EXIT because they lost it (one rule,
:mod:`graphrun.job.blame`, names the culprit among failed pods as ``graphrun run`` does); one that
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
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import msgspec

from graphrun.errors import PEER_LOST_EXIT
from graphrun.job.blame import culprit, lost_a_peer
from graphrun.job.spec import GraphJob
from graphrun.job.workflow import (
    Event,
    EventKind,
    JobState,
    Phase,
    initial_state,
    progress,
    state_of,
    transition,
)
from graphrun.names import RoleName
from graphrun.operator import builders as B
from graphrun.operator import layout as L
from graphrun.operator import pods as P
from graphrun.operator import queueing as Q
from graphrun.operator import rendezvous as RZ
from graphrun.operator.admission import Admission, deadline_passed, evicted
from graphrun.operator.elastic import Elastic
from graphrun.operator.keys import CurveKeyPair
from graphrun.operator.observe import Observed, PodView
from graphrun.operator.plan import Create, Delete, DeleteGraphJob, Emit, Hook, Plan, Run
from graphrun.operator.status import (
    FROM_STATE,
    GraphJobStatus,
    replica_statuses,
    state_status,
    status_patch,
)

K = EventKind
MAX_STEPS = 12
# the concerns that join every step (plan.Hook): Kueue admission, elastic membership
HOOKS: tuple[Hook, ...] = (Admission(), Elastic())


def load_state(job: GraphJob, status: GraphJobStatus, now: datetime) -> JobState:
    backoff = job.spec.run_policy.backoff_limit
    saved = status.workflow
    if saved is None:
        return initial_state(now, backoff, "GraphJob accepted by the operator")
    return state_of(saved, backoff)


def reconcile(
    job: GraphJob,
    owner: L.Owner,
    config: L.OperatorConfig,
    status: GraphJobStatus,
    observed: Observed,
    now: datetime,
    keys: CurveKeyPair,
) -> Plan:
    """One step of control: what to do now for ``job`` (pure)."""
    state = load_state(job, status, now)
    run = Run(job, owner, config, observed, now, state, status.partitioned)
    if status.workflow is None:
        run.actions.append(Emit("Normal", "JobCreated", "GraphJob accepted by the operator"))
    run.partition_dir_before = status.partition_dir or ""
    run.queue = msgspec.structs.replace(status.queue) if status.queue else None
    run.group_restarts = dict(status.restarts_by_replica or {})
    run.lost_before = bool(status.lost_machines)
    if status.phase in (Phase.TRAINING, Phase.SUCCEEDED, Phase.FAILED):
        # copies: an entry changes when its machine is made again (compared with the old)
        run.lost = [msgspec.structs.replace(e) for e in status.lost_machines or []]
    if status.phase is Phase.PARTITIONING:  # else a new attempt: none yet
        run.pod_steps_before = dict(status.partition_pods or {})
    _check_spec_change(run, status.spec_hashes)
    for _ in range(MAX_STEPS):
        phase = run.state.phase
        _step(run, keys)
        if run.state.phase is phase:
            break
    if run.state.terminal:
        _finished(run)
    requeue = min(run.wake) if run.wake else None
    return Plan(tuple(run.actions), _status(run), requeue)


def reject(status: GraphJobStatus, reason: str, message: str, now: datetime) -> Plan:
    """The spec cannot run: Failed with the reason (the field named in the message)."""
    saved = status.workflow
    state = state_of(saved) if saved else initial_state(now)
    if state.terminal:
        return Plan((), status_patch(status))
    state = transition(state, Event(K.FAIL, reason, message), now)
    failed = state_status(state)
    set_ = {f: v for f in FROM_STATE if (v := getattr(failed, f)) is not None}
    new = msgspec.structs.replace(status, **set_)
    return Plan((Emit("Warning", reason, message),), status_patch(new))


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


def _check_spec_change(run: Run, saved: dict[str, str]) -> None:
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


def _step(run: Run, keys: CurveKeyPair) -> None:
    spec = run.job.spec
    phase = run.state.phase
    if run.state.terminal:
        return
    if spec.run_policy.suspend and phase is not Phase.SUSPENDED:
        run.fire(Event(K.SUSPEND, message="spec.runPolicy.suspend is true"))
        return
    if phase is Phase.SUSPENDED:
        if spec.run_policy.suspend:
            P.delete_all_pods(run, partitioner=True)
        elif evicted(run.state):
            if not P.delete_all_pods(run, partitioner=False):  # their checkpoint is written
                message = f"evicted by Kueue: queued again in {Q.queue_name(run.job)}"
                run.fire(Event(K.RESUME, "Requeued", message))
        else:
            run.fire(Event(K.RESUME, message="spec.runPolicy.suspend is false"))
        return
    if deadline_passed(run) or any(hook.stops(run) for hook in HOOKS):
        return
    P.ensure_base(run, keys)
    handler = {
        Phase.PENDING: _pending,
        Phase.PARTITIONING: _partitioning,
        Phase.DISTRIBUTING: _distributing,
        Phase.SERVING: _serving,
        Phase.TRAINING: _training,
        Phase.RESTARTING: _restarting,
    }[phase]
    for hook in HOOKS:
        hook.before(run)
    handler(run)
    for hook in HOOKS:
        hook.after(run)


def _pending(run: Run) -> None:
    if L.partitions_on_workers(run.job):
        message = "creating the worker pods: they partition together, then serve"
    else:
        message = "creating the partitioner"
    run.fire(Event(K.START, message=message))


def _partitioning(run: Run) -> None:
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
    if P.pod_problems(run, [p for p in pods if not p.deleting]):
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
        role = RoleName.partitioner()
        run.fire(Event.role_failed(role, where, code, detail or part.message))


def _partition_on_workers(run: Run) -> None:
    """partition.mode distributed: every worker pod runs its partition rank first (its
    init container), then serves; partitioned once every pod's rank has finished."""
    workers = P.ensure_workers(run)
    P.ensure_rendezvous(run)  # made with the worker pods, watched once they serve
    if workers is None:
        return
    pods = list(workers.values())
    _report_pod_steps(run, pods)
    if _partition_failure(run, pods) or P.pod_problems(run, pods):
        return
    if all(p.partition_step == "Partitioned" for p in pods):
        run.partitioned = True
        out = L.partition_dir(run.job)
        message = f"{len(pods)} worker pods partitioned together; partitions written to {out}"
        run.fire(Event(K.PARTITIONED, message=message))


def _report_pod_steps(run: Run, pods: list[PodView]) -> None:
    """Each pod's partition step: in ``status.partitionPods`` and the Partitioning
    condition's message, and an event when it moves on."""
    n = len(pods)
    steps = {p.name: p.partition_step for p in pods}
    for p in pods:
        step = steps[p.name]
        if step == run.pod_steps_before.get(p.name) or step == "Waiting":
            continue
        where = f"pod {p.name} (machine {run.machine(p)}, rank {p.index} of {n})"
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


def _partition_failure(run: Run, pods: list[PodView]) -> bool:
    """Fire the failure of the rank to blame (True), by the rule ``graphrun run`` blames
    with (:mod:`graphrun.job.blame`): ranks that exited PEER_LOST_EXIT only lost it.
    While only such ranks have failed, wait for the culprit's pod to report
    (:func:`~graphrun.operator.pods.wait_for_culprit`; True: nothing else to do)."""
    failed = [p for p in pods if p.partition_step == "Failed"]
    first = culprit(failed, lambda p: (*p.failure()[2:], p.init_finished))
    if first is None:
        return False
    _, _, code, message = first.failure()
    if lost_a_peer(code, message) and P.wait_for_culprit(run, failed, pods):
        return True
    message = message or f"pod {first.name} failed while partitioning"
    role, machine = RoleName.partitioner(first.index), run.machine(first)
    run.fire(Event.role_failed(role, machine, code, message))
    return True


def _distributing(run: Run) -> None:
    claim = L.shared_volume(run.job).claim_name
    run.fire(
        Event(K.DISTRIBUTED, "SharedVolume", f"workers read the partitions from volume {claim}")
    )


def _serving(run: Run) -> None:
    rdv = P.ensure_rendezvous(run)
    if P.rendezvous_lost(run, missing_ok=True):
        return
    workers = P.ensure_workers(run)
    if workers is None or P.pod_problems(run, [*workers.values(), *rdv]):
        return
    if L.rendezvous_apart(run.job) and not any(p.ready for p in rdv):
        return  # its pod is made with the workers: ready before the trainers need it
    if all(p.ready or p.phase == "Succeeded" for p in workers.values()):
        n = len(workers)
        run.fire(Event(K.SERVERS_READY, message=f"all {n} workers are serving"))


def _training(run: Run) -> None:
    if P.rendezvous_lost(run):
        return
    workers = P.ensure_workers(run)
    if workers is None:
        return
    launcher = P.ensure_launcher(run)
    pods = list(workers.values()) + ([launcher] if launcher else [])
    if P.pod_problems(run, pods):
        return
    need_launcher = run.job.spec.replica_specs.launcher is not None
    if need_launcher and launcher is None:
        return
    success = run.job.spec.run_policy.success_policy
    if success is None:
        if all(p.phase == "Succeeded" for p in pods):
            lost = ", ".join(e.machine for e in run.lost)
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


def _restarting(run: Run) -> None:
    again_from = run.state.resume_phase
    left = P.delete_all_pods(run, partitioner=again_from is Phase.PARTITIONING)
    if not left:
        run.fire(Event(K.RESTARTED, message=f"restart {run.state.restarts}: roles start again"))


# --- the end ----------------------------------------------------------------------------


def _finished(run: Run) -> None:
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


def _status(run: Run) -> dict[str, Any]:
    """The next status, as the merge patch the handlers write."""
    out = state_status(run.state)
    out.partitioned = run.partitioned
    out.spec_hashes = run.spec_hashes
    if run.partitioned:
        out.partition_dir = L.partition_dir(run.job)
    if run.pod_steps is not None and run.state.phase is Phase.PARTITIONING:
        out.partition_pods = run.pod_steps
    out.replica_statuses = replica_statuses(run.observed)
    out.lost_machines = run.lost or None
    out.restarts_by_replica = run.group_restarts or None
    if run.queue is not None:
        out.queue = run.queue
        out.conditions.append(run.queue.condition(run.now))
    if run.state.terminal:
        # Nothing left to clean up: later passes need not look at the children.
        out.cleaned_up = not any(isinstance(a, Delete) for a in run.actions)
    # the status is merge-patched: null removes what a new attempt no longer has
    cleared = ("lostMachines",) if run.lost_before and not run.lost else ()
    return status_patch(out, cleared)
