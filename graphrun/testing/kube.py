"""An in-memory namespace for driving the operator's pure reconcile through lifecycles.

It applies a :class:`graphrun.operator.plan.Plan` the way the API server would
(objects get a creation time, a uid; a batch Job gets its pod, as the Job controller
would make it; deleting a Job deletes its pods), and lets a test play the kubelet:
set a pod's phase, readiness, waiting reason, exit code and termination message.
For the real kopf handlers over HTTP, see tests/operator/test_handlers.py (kmock).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from graphrun.job.workflow import rfc3339
from graphrun.machine.stopmark import JOB_WIDE, STOP_ANNOTATION, STOP_AT_ANNOTATION
from graphrun.operator.layout import LABEL_JOB, LABEL_REPLICA, MANAGED_BY, PARTITION_CONTAINER
from graphrun.operator.plan import Create, Delete, DeleteGraphJob, Emit, MarkStop, Plan

_uids = itertools.count(1)


@dataclass
class FakeNamespace:
    now: datetime
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[Emit] = field(default_factory=list)
    graphjob_deleted: bool = False

    def apply(self, plan: Plan) -> None:
        for action in plan.actions:
            if isinstance(action, Create):
                self.create(action.obj)
            elif isinstance(action, Delete):
                self.delete(action.kind, action.name)
            elif isinstance(action, MarkStop):
                pod = self.objects.get(("Pod", action.name))
                if pod is not None:
                    marks = {STOP_ANNOTATION: JOB_WIDE, STOP_AT_ANNOTATION: action.at}
                    pod["metadata"].setdefault("annotations", {}).update(marks)
            elif isinstance(action, Emit):
                self.events.append(action)
            elif isinstance(action, DeleteGraphJob):
                self.graphjob_deleted = True

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        key = (obj["kind"], obj["metadata"]["name"])
        if key in self.objects:
            raise ValueError(f"{key} already exists")  # the API server answers 409
        meta = obj["metadata"]
        meta["uid"] = f"uid-{next(_uids)}"
        meta["creationTimestamp"] = rfc3339(self.now)
        if obj["kind"] == "Pod":
            obj["status"] = {"phase": "Pending"}
        self.objects[key] = obj
        if obj["kind"] == "Job":
            self._job_pod(obj)
        return obj

    def _job_pod(self, job: dict[str, Any]) -> None:
        tpl = job["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                **copy.deepcopy(tpl.get("metadata", {})),
                "name": f"{job['metadata']['name']}-{next(_uids)}",
                "ownerReferences": [{"kind": "Job", "uid": job["metadata"]["uid"]}],
            },
            "spec": copy.deepcopy(tpl["spec"]),
        }
        self.create(pod)

    def delete(self, kind: str, name: str) -> None:
        obj = self.objects.pop((kind, name), None)
        if obj is not None and kind == "Job":
            uid = obj["metadata"]["uid"]
            for key, o in list(self.objects.items()):
                refs = o["metadata"].get("ownerReferences", [])
                if any(r.get("uid") == uid for r in refs):
                    del self.objects[key]

    def children(self) -> list[dict[str, Any]]:
        return list(self.objects.values())

    def pods(self, replica: str | None = None) -> list[dict[str, Any]]:
        return [
            o
            for o in self.objects.values()
            if o["kind"] == "Pod"
            and (replica is None or o["metadata"]["labels"].get(LABEL_REPLICA) == replica)
        ]

    def pod(self, name: str) -> dict[str, Any]:
        return self.objects[("Pod", name)]

    def set_pod(
        self,
        name: str,
        phase: str,
        *,
        ready: bool = False,
        exit_code: int | None = None,
        message: str = "",
        waiting: tuple[str, str] | None = None,
        unschedulable: str = "",
    ) -> None:
        """Play the kubelet (and the scheduler) for one pod."""
        state: dict[str, Any] = {}
        if waiting is not None:
            state = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
        elif phase in ("Succeeded", "Failed"):
            code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1)
            end = rfc3339(self.now)
            state = {"terminated": {"exitCode": code, "message": message, "finishedAt": end}}
        elif phase == "Running":
            state = {"running": {}}
        conds = [{"type": "Ready", "status": "True" if ready else "False"}]
        if unschedulable:
            conds.append(
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": unschedulable,
                }
            )
        self.pod(name)["status"] = {
            "phase": phase,
            "conditions": conds,
            "containerStatuses": [{"name": "graphrun", "state": state}],
        }

    def set_partition(
        self, name: str, state: str, *, exit_code: int = 0, message: str = ""
    ) -> None:
        """Play the kubelet for a worker pod's ``partition`` init container (partition.mode
        distributed): ``running``, or ``terminated`` with ``exit_code`` — then the main
        container starts (exit 0) or the pod fails (restartPolicy Never)."""
        init: dict[str, Any] = {"running": {}}
        phase = "Pending"
        main: dict[str, Any] = {"waiting": {"reason": "PodInitializing"}}
        if state == "terminated":
            init = {
                "terminated": {
                    "exitCode": exit_code,
                    "message": message,
                    "finishedAt": rfc3339(self.now),
                }
            }
            phase = "Running" if exit_code == 0 else "Failed"
            main = {"running": {}} if exit_code == 0 else main
        self.pod(name)["status"] = {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "False"}],
            "initContainerStatuses": [{"name": PARTITION_CONTAINER, "state": init}],
            "containerStatuses": [{"name": "graphrun", "state": main}],
        }

    def finish_job(self, name: str, ok: bool = True, message: str = "") -> None:
        """Play the Job controller: its pod ended, the Job is Complete or Failed."""
        job = self.objects[("Job", name)]
        uid = job["metadata"]["uid"]
        for o in self.pods("partitioner"):
            if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", [])):
                self.set_pod(
                    o["metadata"]["name"], "Succeeded" if ok else "Failed", message=message
                )
        cond = "Complete" if ok else "Failed"
        job["status"] = {
            "conditions": [
                {"type": cond, "status": "True", "reason": "" if ok else "BackoffLimitExceeded"}
            ]
        }

    # --- playing Kueue (plain-pod groups) -----------------------------------------------

    def admit(self, gate: str = "kueue.x-k8s.io/admission") -> None:
        """Kueue admits the pod group: the gate is removed from every gated pod."""
        for pod in self.pods():
            gates = pod["spec"].get("schedulingGates") or []
            pod["spec"]["schedulingGates"] = [g for g in gates if g.get("name") != gate]

    def evict(self, message: str) -> None:
        """Kueue stops the group: condition TerminationTarget, then a delete; the pods
        are terminating (their grace period) until :meth:`terminated`."""
        for pod in self.pods():
            if pod["metadata"]["labels"].get("kueue.x-k8s.io/pod-group-name") is None:
                continue
            status = pod.setdefault("status", {})
            status.setdefault("conditions", []).append(
                {
                    "type": "TerminationTarget",
                    "status": "True",
                    "reason": "StoppedByKueue",
                    "message": message,
                }
            )
            pod["metadata"]["deletionTimestamp"] = rfc3339(self.now)

    def terminated(self) -> None:
        """The terminating pods' grace periods are over: they are gone."""
        for key, o in list(self.objects.items()):
            if o["kind"] == "Pod" and o["metadata"].get("deletionTimestamp"):
                del self.objects[key]

    def labelled(self, job_name: str) -> list[dict[str, Any]]:
        return [
            o
            for o in self.objects.values()
            if o["metadata"].get("labels", {}).get(LABEL_JOB) == job_name
            and all(o["metadata"]["labels"].get(k) == v for k, v in MANAGED_BY.items())
        ]
