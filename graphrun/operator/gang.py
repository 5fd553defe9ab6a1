"""Gang scheduling of a GraphJob's pods (``spec.runPolicy.schedulingPolicy``).

A job's worker pods and its launcher only make progress together, so they are
scheduled as one group or not at all. Three providers, one choice per job:

* ``workload-api`` (Kubernetes 1.35+): a Workload with a PodGroupTemplate per role
  group and a PodGroup made from each (:func:`build_workload`); each pod names its
  group in ``spec.schedulingGroup``.
* ``volcano`` and ``scheduler-plugins``: one PodGroup named after the job
  (:func:`build_podgroup`); each pod names the scheduler and its group by annotation
  or label.

Pure, like :mod:`.builders`, which calls :func:`pod_scheduling` on every pod template.
"""

from __future__ import annotations

from typing import Any

from graphrun.job.spec import KIND, GraphJob
from graphrun.operator import layout as L


def pod_scheduling(
    job: GraphJob,
    owner: L.Owner,
    config: L.OperatorConfig,
    meta: dict[str, Any],
    spec: dict[str, Any],
) -> None:
    """Put a pod template (its ``metadata`` and ``spec``) in the job's gang: the
    scheduler, the group it belongs to, and the priority class."""
    policy = job.spec.run_policy.scheduling_policy
    if policy is None:
        return
    if policy.provider == "workload-api":  # the default scheduler, its PodGroup by name
        replica = meta["labels"].get(L.LABEL_REPLICA)
        if replica in ("worker", "launcher"):
            spec["schedulingGroup"] = {"podGroupName": L.pod_group_name(owner.name, replica)}
    elif policy.provider == "volcano":
        spec["schedulerName"] = config.volcano_scheduler_name
        meta.setdefault("annotations", {})["scheduling.k8s.io/group-name"] = owner.name
    else:
        spec["schedulerName"] = config.scheduler_plugins_name
        meta["labels"]["scheduling.x-k8s.io/pod-group"] = owner.name
    if policy.priority_class:
        spec["priorityClassName"] = policy.priority_class


def gang_members(job: GraphJob) -> int:
    """The pods scheduled as one group: every worker pod and the launcher."""
    return len(L.worker_indices(job)) + (1 if job.spec.replica_specs.launcher else 0)


WORKLOAD_API = "scheduling.k8s.io/v1alpha2"


def build_workload(job: GraphJob, owner: L.Owner) -> list[dict[str, Any]]:
    """``runPolicy.schedulingPolicy.provider: workload-api`` (Kubernetes 1.35+, the
    GenericWorkload feature gate): a Workload with one PodGroupTemplate per role group
    — ``workers`` (``minCount``: ``minAvailable`` or every worker pod) and
    ``launcher`` — and a gang PodGroup made from each, which the pods name in
    ``spec.schedulingGroup``; otherwise nothing."""
    policy = job.spec.run_policy.scheduling_policy
    if policy is None or policy.provider != "workload-api":
        return []
    groups = {"worker": policy.min_available or len(L.worker_indices(job))}
    if job.spec.replica_specs.launcher is not None:
        groups["launcher"] = 1
    templates = [
        {"name": L.pod_group_template(r), "schedulingPolicy": {"gang": {"minCount": n}}}
        for r, n in groups.items()
    ]
    workload = {
        "apiVersion": WORKLOAD_API,
        "kind": "Workload",
        "metadata": L.metadata(owner, owner.name),
        "spec": {
            "controllerRef": {"apiGroup": "graphrun.io", "kind": KIND, "name": owner.name},
            "podGroupTemplates": templates,
        },
    }
    pod_groups = [
        {
            "apiVersion": WORKLOAD_API,
            "kind": "PodGroup",
            "metadata": L.metadata(owner, L.pod_group_name(owner.name, r)),
            "spec": {
                "podGroupTemplateRef": {
                    "workload": {
                        "workloadName": owner.name,
                        "podGroupTemplateName": L.pod_group_template(r),
                    }
                },
                "schedulingPolicy": {"gang": {"minCount": n}},
            },
        }
        for r, n in groups.items()
    ]
    return [workload, *pod_groups]


def build_podgroup(job: GraphJob, owner: L.Owner) -> dict[str, Any] | None:
    """A gang-scheduling PodGroup for every worker (and the launcher), or None."""
    policy = job.spec.run_policy.scheduling_policy
    if policy is None or policy.provider == "workload-api":
        return None
    min_member = policy.min_available or gang_members(job)
    if policy.provider == "volcano":
        spec: dict[str, Any] = {"minMember": min_member}
        if policy.queue:
            spec["queue"] = policy.queue
        if policy.priority_class:
            spec["priorityClassName"] = policy.priority_class
        api = "scheduling.volcano.sh/v1beta1"
    else:
        spec = {"minMember": min_member}
        if policy.schedule_timeout_seconds:
            spec["scheduleTimeoutSeconds"] = policy.schedule_timeout_seconds
        api = "scheduling.x-k8s.io/v1alpha1"
    return {
        "apiVersion": api,
        "kind": "PodGroup",
        "metadata": L.metadata(owner, owner.name),
        "spec": spec,
    }
