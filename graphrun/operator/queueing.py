"""Kueue admission of a GraphJob: its worker and launcher pods as one Kueue pod group.

A GraphJob labelled ``kueue.x-k8s.io/queue-name: Q`` is queued by Kueue's plain-pod
integration, which needs no Go code on our side (docs/kubernetes.md, "Queued by Kueue"):

* every worker pod carries the queue label, the group label
  ``kueue.x-k8s.io/pod-group-name`` (the GraphJob's name: Kueue names its Workload so)
  and the annotation ``kueue.x-k8s.io/pod-group-total-count`` (how many worker pods
  there are), and is created with the scheduling gate ``kueue.x-k8s.io/admission`` —
  Kueue's webhook would add it too; adding it here keeps them gated whatever the
  webhook's namespace selector says. The launcher, made only once the workers serve,
  is a pod of its own in the same queue (a group waits for all its pods before Kueue
  makes its Workload);
* Kueue admits the whole group at once by removing the gate from every pod; until then
  the GraphJob's ``Queued`` condition is True with Kueue's reason and message (from
  the group's Workload when the operator may read it);
* Kueue evicts (preemption, a stopped ClusterQueue) by setting the pod condition
  ``TerminationTarget`` (reason ``StoppedByKueue``, its message saying why) and deleting
  the pods: the trainers get SIGTERM and write an exact checkpoint in the pods' grace
  period, the GraphJob goes ``Suspended`` (reason ``Evicted``), and once the pods are
  gone it is queued again with new gated pods that ``--resume``;
* the partitioner Job carries the queue label only: Kueue admits it as a batch Job
  (its own Workload, by ``suspend``).

Pure: functions over the spec and the pod dicts the builders make.
"""

from __future__ import annotations

from typing import Any

from graphrun.job.spec import GraphJob

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GATE = "kueue.x-k8s.io/admission"
STOPPED = "TerminationTarget"  # the pod condition Kueue sets before deleting a pod
WORKLOAD_API = ("kueue.x-k8s.io", "v1beta1", "workloads")


def queue_name(job: GraphJob) -> str | None:
    """The Kueue LocalQueue the job is queued in, or None (not queued by Kueue)."""
    return job.metadata.labels.get(QUEUE_LABEL) or None


def group_name(job: GraphJob) -> str:
    """The pod group's name, which is also the name of Kueue's Workload for it."""
    return job.name


def mark_pod(
    job: GraphJob, members: int | None, meta: dict[str, Any], spec: dict[str, Any]
) -> None:
    """Queue a pod in the job's LocalQueue, gated: a member of the job's pod group of
    ``members`` pods (the workers), or alone (``None``: the launcher)."""
    queue = queue_name(job)
    if queue is None:
        return
    labels = meta.setdefault("labels", {})
    labels[QUEUE_LABEL] = queue
    priority = job.metadata.labels.get(PRIORITY_LABEL)
    if priority:
        labels[PRIORITY_LABEL] = priority
    if members is not None:
        labels[GROUP_LABEL] = group_name(job)
        meta.setdefault("annotations", {})[TOTAL_ANNOTATION] = str(members)
    gates = spec.setdefault("schedulingGates", [])
    if not any(g.get("name") == GATE for g in gates):
        gates.append({"name": GATE})


def mark_job(job: GraphJob, meta: dict[str, Any]) -> None:
    """The partitioner Job: queued by Kueue's batch/v1 Job integration."""
    queue = queue_name(job)
    if queue is not None:
        meta.setdefault("labels", {})[QUEUE_LABEL] = queue
        priority = job.metadata.labels.get(PRIORITY_LABEL)
        if priority:
            meta["labels"][PRIORITY_LABEL] = priority


def kueue_reason(workload: dict[str, Any] | None) -> tuple[str, str]:
    """(reason, message) of why Kueue has not admitted the group yet, from its Workload's
    ``QuotaReserved`` condition (``Pending``: no quota; ``Inadmissible``: ...)."""
    if not workload:
        return "WaitingForAdmission", "waiting for Kueue to admit the pod group"
    conds = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    for kind in ("Evicted", "QuotaReserved", "Admitted"):
        c = conds.get(kind)
        if c and (c.get("status") == "False") == (kind != "Evicted"):
            return str(c.get("reason") or "Pending"), str(c.get("message") or "")
    return "WaitingForAdmission", "waiting for Kueue to admit the pod group"
