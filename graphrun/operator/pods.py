"""The job's children, made and watched for the phase handlers (:mod:`.reconcile`).

The base objects (Secret, ConfigMap, headless Service, NetworkPolicy, the gang
scheduler's), the worker pods (a lost machine's left out, :mod:`.elastic`), the
rendezvous pod of an elastic job, the launcher; deleting every pod (worker pods that
tell a one-pod deletion from a stop of the whole job are marked first); and the first
problem among pods (a failure, an image that can never be pulled, a startup deadline).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from graphrun.job.blame import culprit, lost_a_peer
from graphrun.job.workflow import Event, EventKind, Phase, rfc3339
from graphrun.names import RoleName
from graphrun.operator import builders as B
from graphrun.operator import elastic as E
from graphrun.operator import layout as L
from graphrun.operator import queueing as Q
from graphrun.operator import rendezvous as RZ
from graphrun.operator.admission import admitted_at
from graphrun.operator.keys import CurveKeyPair
from graphrun.operator.observe import PodView
from graphrun.operator.plan import Create, Delete, MarkStop, Run
from graphrun.operator.render import base_builders

K = EventKind
NEVER_PULLS = frozenset({"InvalidImageName", "ErrImageNeverPull"})
WAITING_FAILURES = frozenset({"ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError"})
# a worker pod annotated graphrun.io/stop is deleted this long after: the kubelet writes
# the annotations file of a running pod (not of a deleted one) within about a second
MARK_LEAD = timedelta(seconds=5)

# A role that only lost a peer ends about when the one that failed does: wait this long
# for the culprit's pod to report before blaming a pod whose role lost it.
PEER_GRACE = timedelta(seconds=10)


def ensure_base(run: Run, keys: CurveKeyPair) -> None:
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


def ensure_workers(run: Run) -> dict[int, PodView] | None:
    """The worker pods, creating missing ones. None while some are still being deleted
    or were created just now. Lost machines' pods (:func:`.elastic.note_lost_machines`) are left
    out, and not made again."""
    lost = E.lost_indices(run)
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
        role = RoleName.partitioner(i) if partitioning else RoleName.worker(machine)
        message = "the worker pod disappeared" + (" while partitioning" if partitioning else "")
        run.fire(Event.role_failed(role, machine, None, message))
        return None
    resume = run.state.resumes
    for i in missing:
        run.actions.append(Create(B.build_worker(run.job, run.owner, run.config, i, resume)))
    return None if missing else have


def ensure_rendezvous(run: Run) -> list[PodView]:
    """The rendezvous pod of an elastic job (:mod:`.rendezvous`), made if missing, as
    the worker pods are (never while training: losing it then fails the attempt,
    :func:`rendezvous_lost`); [] while there is none, or none being kept."""
    if not L.rendezvous_apart(run.job):
        return []
    pods = run.observed.of(RZ.REPLICA)
    if not pods and run.state.phase is not Phase.TRAINING:
        run.actions.append(Create(RZ.build_rendezvous(run.job, run.owner, run.config)))
    return [p for p in pods if not p.deleting]


def rendezvous_lost(run: Run, missing_ok: bool = False) -> bool:
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
    run.fire(Event.role_failed(RoleName.rendezvous(), name, code, message))
    return True


def ensure_launcher(run: Run) -> PodView | None:
    if run.job.spec.replica_specs.launcher is None:
        return None
    pods = [p for p in run.observed.of("launcher") if not p.deleting]
    if pods:
        return pods[0]
    if not run.observed.of("launcher"):
        run.actions.append(Create(B.build_launcher(run.job, run.owner, run.config)))
    return None


def delete_all_pods(run: Run, partitioner: bool) -> bool:
    """Delete worker and launcher pods, then the rendezvous pod (and the partitioner
    Job); True while any remain.
    Worker pods that tell a one-pod deletion from a stop of the whole job are first
    annotated ``graphrun.io/stop: job`` and deleted MARK_LEAD after (the kubelet has
    then written the mark to the running pod's annotations file)."""
    left = False
    marks = L.uses_stop_mark(run.job)
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


def pod_role(run: Run, pod: PodView) -> RoleName | None:
    """The role a failed pod that named none stands for: a worker pod is its machine's
    ``worker:<machine>`` (the machine's name, as everywhere), a partitioner pod
    ``partitioner:<index>`` (``partitioner`` alone without one), the launcher and the
    rendezvous pods those roles; None for a pod of no replica type graphrun makes."""
    if pod.replica == "worker":
        return RoleName.worker(run.machine(pod))
    if pod.replica == "partitioner":
        return RoleName.partitioner(pod.index)
    single = {"launcher": RoleName.launcher(), RZ.REPLICA: RoleName.rendezvous()}
    return single.get(pod.replica)


def wait_for_culprit(run: Run, failed: list[PodView], pods: list[PodView]) -> bool:
    """While every failed pod only lost a peer and another pod still runs, wait up to
    :data:`PEER_GRACE` after the first ended for the pod that failed by itself to report
    (True: waiting)."""
    if all(p.finished for p in pods):
        return False
    ends = [t for p in failed for t in (p.init_finished, p.finished_at) if t is not None]
    until = min(ends) + PEER_GRACE if ends else run.now
    if run.now < until:
        run.wake_at(until)
        return True
    return False


def pod_problems(run: Run, pods: list[PodView]) -> bool:
    """Fire the failure to blame among ``pods`` (True), by the rule ``graphrun run``
    blames with (:mod:`graphrun.job.blame`): a pod whose role failed by itself before one
    whose role only lost a server or a collective peer, then the earliest; True too while
    it waits for such a pod to report (:func:`wait_for_culprit`)."""
    failed = [p for p in pods if p.phase == "Failed"]
    first = culprit(failed, lambda p: (*p.failure()[2:], p.finished_at or p.init_finished))
    if first is not None:
        role, machine, code, msg = first.failure()
        if lost_a_peer(code, msg) and wait_for_culprit(run, failed, pods):
            return True
        if role is None:
            role, machine = pod_role(run, first), run.machine(first)
        where = machine or run.machine(first)
        run.fire(Event.role_failed(role, where, code, msg or f"pod {first.name} failed"))
        return True
    startup = timedelta(seconds=run.job.spec.run_policy.startup_deadline_seconds)
    admitted = admitted_at(run) if Q.queue_name(run.job) else None
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
