"""A GraphJob queued by Kueue (plain-pod group): gated, admitted, evicted, queued again.

The pure reconcile on the in-memory namespace, the test playing Kueue (it removes the
gates, marks the pods TerminationTarget and deletes them) and the kubelet.
"""

from __future__ import annotations

from typing import Any

from graphrun.job.spec import parse_job
from graphrun.operator import queueing as Q
from tests.operator.test_reconcile import Harness, job_dict

QUEUE = "team-a"


def queued_harness(labels: dict[str, str] | None = None, **spec: Any) -> Harness:
    h = Harness(**spec)
    d = job_dict(**spec)
    d["metadata"]["labels"] = {Q.QUEUE_LABEL: QUEUE, **(labels or {})}
    h.job = parse_job(d)
    return h


def _gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def to_queued(h: Harness) -> None:
    h.step()
    assert h.phase == "Partitioning"
    job = next(o for o in h.ns.children() if o["kind"] == "Job")
    assert job["metadata"]["labels"][Q.QUEUE_LABEL] == QUEUE  # Kueue's batch/Job integration
    h.partitioner_done()
    h.step()
    assert h.phase == "Serving"


def test_pods_are_created_gated_in_one_group_and_wait_visibly() -> None:
    h = queued_harness(labels={Q.PRIORITY_LABEL: "low"})
    to_queued(h)
    pods = h.ns.pods("worker")
    assert len(pods) == 2
    for pod in pods:
        assert _gates(pod) == [Q.GATE]
        assert pod["metadata"]["labels"][Q.QUEUE_LABEL] == QUEUE
        assert pod["metadata"]["labels"][Q.GROUP_LABEL] == "graphsage"
        assert pod["metadata"]["labels"][Q.PRIORITY_LABEL] == "low"
        assert pod["metadata"]["annotations"][Q.TOTAL_ANNOTATION] == "2"
    queued = h.cond("Queued")
    assert queued["status"] == "True" and queued["reason"] == "WaitingForAdmission"
    assert "2 of 2 pods wait for admission in team-a" in queued["message"]
    assert [e.reason for e in h.ns.events].count("Queued") == 1
    # Kueue's own reason, from the group's Workload
    h.ns.objects[("Workload", "graphsage")] = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {"name": "graphsage"},
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": "couldn't assign flavors to pod set main: insufficient quota",
                }
            ]
        },
    }
    # gated for far longer than startupDeadlineSeconds: waiting is not failing
    h.step(3 * 3600)
    assert h.phase == "Serving"
    assert h.cond("Queued")["reason"] == "Pending"
    assert "insufficient quota" in h.cond("Queued")["message"]
    assert [e.reason for e in h.ns.events].count("Queued") == 1


def test_admission_starts_the_clocks() -> None:
    h = queued_harness(runPolicy={"activeDeadlineSeconds": 600, "startupDeadlineSeconds": 300})
    to_queued(h)
    h.step(5000)  # queued longer than both deadlines
    assert h.phase == "Serving"
    h.ns.admit()
    h.step()
    assert h.cond("Queued")["status"] == "False"
    assert h.cond("Queued")["reason"] == "Admitted"
    assert h.status["queue"]["admittedAt"] == h.cond("Queued")["lastTransitionTime"]
    assert "Admitted" in [e.reason for e in h.ns.events]
    h.step(299)  # pending since admission, not since creation
    assert h.phase == "Serving"
    for w in h.workers():
        h.ns.set_pod(w, "Running", ready=True)
    h.step()
    assert h.phase == "Training"
    h.step(310)  # 600 s after admission
    assert h.phase == "Failed"
    assert h.cond("Failed")["reason"] == "DeadlineExceeded"


def test_eviction_suspends_then_queues_again_and_resumes() -> None:
    h = queued_harness()
    to_queued(h)
    h.ns.admit()
    h.step()
    for w in h.workers():
        h.ns.set_pod(w, "Running", ready=True)
    h.step()
    assert h.phase == "Training"
    h.ns.evict("Preempted to accommodate a higher priority Workload")
    h.step()
    assert h.phase == "Suspended"
    cond = h.cond("Suspended")
    assert cond["reason"] == "Evicted"
    assert "Preempted to accommodate a higher priority Workload" in cond["message"]
    h.step(30)  # the trainers write their checkpoint in the pods' grace period
    assert h.phase == "Suspended"
    assert all(p["metadata"].get("deletionTimestamp") for p in h.ns.pods("worker"))
    h.ns.terminated()
    h.step()
    assert h.phase == "Serving"  # queued again: new gated pods that resume
    assert h.cond("Queued")["status"] == "True"
    for pod in h.ns.pods("worker"):
        assert _gates(pod) == [Q.GATE]
        assert pod["spec"]["containers"][0]["args"][-1] == "--resume"
    assert h.status["restarts"] == 0  # an eviction is not a failure
    h.ns.admit()
    h.step()
    for w in h.workers():
        h.ns.set_pod(w, "Running", ready=True)
    h.step()
    for w in h.workers():
        h.ns.set_pod(w, "Succeeded")
    h.step()
    assert h.phase == "Succeeded"
    reasons = [e.reason for e in h.ns.events]
    assert reasons.count("Queued") == 2 and reasons.count("Admitted") == 2
    assert "Evicted" in reasons and "Requeued" in reasons, str(reasons)


def test_a_job_without_the_queue_label_is_not_gated() -> None:
    h = Harness()
    h.step()
    h.partitioner_done()
    h.step()
    for pod in h.ns.pods("worker"):
        assert "schedulingGates" not in pod["spec"]
        assert not any(k.startswith("kueue.x-k8s.io/") for k in pod["metadata"]["labels"])
    assert not any(c["type"] == "Queued" for c in h.status["conditions"])
    assert "queue" not in h.status


def test_worker_pods_get_a_grace_period_for_the_checkpoint() -> None:
    h = Harness()
    h.step()
    h.partitioner_done()
    h.step()
    pod = h.ns.pods("worker")[0]
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--grace") + 1] == "57"


def test_the_launcher_is_queued_alone_and_does_not_restart_the_clock() -> None:
    launcher = {"launcher": {"template": {"spec": {"containers": [{"name": "graphrun"}]}}}}
    h = queued_harness(replicaSpecs=launcher)
    to_queued(h)
    h.ns.admit()
    h.step()
    admitted = h.status["queue"]["admittedAt"]
    for w in h.workers():
        h.ns.set_pod(w, "Running", ready=True)
    h.step()
    assert h.phase == "Training"
    h.step(5)
    (pod,) = h.ns.pods("launcher")
    assert _gates(pod) == [Q.GATE]  # Kueue admits it as a pod of its own
    assert Q.GROUP_LABEL not in pod["metadata"]["labels"]
    h.step()
    assert h.cond("Queued")["status"] == "False"  # the group stays admitted
    assert h.status["queue"]["admittedAt"] == admitted
