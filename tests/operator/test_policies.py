"""runPolicy.successPolicy and failurePolicy (JobSet's ideas): which role groups'
completion is success, restart budgets per role group, the reasons in the conditions."""

from __future__ import annotations

from typing import Any

import pytest

from graphrun.errors import SpecError
from graphrun.job.spec import parse_job
from tests.operator.test_reconcile import Harness, job_dict

LAUNCHER = {"launcher": {"template": {"spec": {"containers": [{"name": "graphrun"}]}}}}


def with_launcher(**run_policy: Any) -> Harness:
    h = Harness(runPolicy=run_policy, replicaSpecs=LAUNCHER)
    return h


def test_the_launcher_finishing_is_success_when_it_is_the_target() -> None:
    h = with_launcher(successPolicy={"targetReplicas": ["launcher"]})
    h.to_training()
    h.step()  # the launcher pod is made once the workers serve
    (launcher,) = [p["metadata"]["name"] for p in h.ns.pods("launcher")]
    h.ns.set_pod(launcher, "Running")
    h.step()
    assert h.phase == "Training"
    h.ns.set_pod(launcher, "Succeeded")
    h.step()
    assert h.phase == "Succeeded"  # the workers still run: not a target
    cond = h.cond("Succeeded")
    assert cond["reason"] == "SuccessPolicyMet"
    assert cond["message"] == "every launcher pod succeeded (spec.runPolicy.successPolicy)"
    assert h.workers() == []  # cleanPodPolicy Running stopped them


def test_without_a_success_policy_every_pod_must_succeed() -> None:
    h = with_launcher()
    h.to_training()
    h.step()
    (launcher,) = [p["metadata"]["name"] for p in h.ns.pods("launcher")]
    h.ns.set_pod(launcher, "Succeeded")
    h.step()
    assert h.phase == "Training"


def test_a_group_that_spent_its_restarts_fails_the_job() -> None:
    h = Harness(runPolicy={"backoffLimit": 5, "failurePolicy": {"restartLimits": {"worker": 1}}})
    h.to_training()
    h.ns.set_pod("graphsage-worker-1", "Failed", exit_code=1, message="boom")
    h.step()
    assert h.phase == "Restarting"
    assert h.status["restartsByReplica"] == {"worker": 1}
    h.step()
    for w in h.workers():
        h.ns.set_pod(w, "Running", ready=True)
    h.step()
    assert h.phase == "Training"
    h.ns.set_pod("graphsage-worker-0", "Failed", exit_code=137, message="OOMKilled")
    h.step()
    assert h.phase == "Failed"  # backoffLimit 5 would have allowed more
    cond = h.cond("Failed")
    assert cond["reason"] == "RestartLimitExceeded"
    assert cond["message"] == (
        "worker:m0 on m0 failed (exit code 137): OOMKilled; the worker group has used its 1 "
        "restarts (spec.runPolicy.failurePolicy.restartLimits.worker)"
    )


def test_a_partitioner_without_restarts_fails_at_once() -> None:
    h = Harness(
        runPolicy={"backoffLimit": 3, "failurePolicy": {"restartLimits": {"partitioner": 0}}}
    )
    h.step()
    h.partitioner_done(ok=False, message="graphrun: error: data/graph.json: missing")
    h.step()
    assert h.phase == "Failed"
    assert h.cond("Failed")["reason"] == "RestartLimitExceeded"


def test_policies_are_checked() -> None:
    for policy in (
        {"failurePolicy": {"restartLimits": {"worker": -1}}},
        {"failurePolicy": {"restartLimits": {"sampler": 1}}},
        {"successPolicy": {"targetReplicas": []}},
        {"successPolicy": {"targetReplicas": ["partitioner"]}},
    ):
        with pytest.raises(SpecError, match="runPolicy"):
            parse_job(job_dict(runPolicy=policy))
