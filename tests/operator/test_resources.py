"""Per-machine resources of worker pods under a placement plan (graphrun.operator.resources)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from graphrun.errors import SpecError
from graphrun.job.spec import GraphJob, parse_job
from graphrun.operator import builders as B
from graphrun.operator import layout as L
from graphrun.operator.resources import GPU, cpu_quantity, memory_quantity
from graphrun.wire import to_builtins

ROOT = Path(__file__).resolve().parents[2]
K8S = kubernetes_validate.latest_version()
OWNER = L.Owner("planned", "ml", "u")
CONFIG = L.OperatorConfig()
TEMPLATE = "spec.replicaSpecs.worker.template.spec.containers[0].resources"


def planned() -> dict[str, Any]:
    """examples/kubernetes/planned.yaml: stores on node-big-mem, two trainers on
    node-gpu-0, one on node-gpu-1; capacities and demands as `graphrun plan` writes them."""
    d: dict[str, Any] = yaml.safe_load((ROOT / "examples/kubernetes/planned.yaml").read_text())
    return d


def graphsage() -> dict[str, Any]:
    d: dict[str, Any] = yaml.safe_load((ROOT / "examples/kubernetes/graphsage.yaml").read_text())
    return d


def container(job: GraphJob, index: int) -> dict[str, Any]:
    pod = B.build_worker(job, OWNER, CONFIG, index)
    kubernetes_validate.validate(pod, K8S, strict=True)
    c: dict[str, Any] = pod["spec"]["containers"][0]
    return c


def test_each_worker_requests_what_the_plan_gives_its_machine() -> None:
    job = parse_job(planned())
    B.check_supported(job)
    got = [container(job, i)["resources"] for i in range(3)]
    # node-big-mem: two stores (2 cores, 1.0095 GB each) + the override's memory limit
    assert got[0] == {"requests": {"cpu": "4", "memory": "2020M"}, "limits": {"memory": "8Gi"}}
    # node-gpu-0: two trainers (4 cores, 8 GB each); node-gpu-1: one
    assert got[1] == {"requests": {"cpu": "8", "memory": "16G"}}
    assert got[2] == {"requests": {"cpu": "4", "memory": "8G"}}
    # the shared memory of the store pod is capped by its own limit
    pod = B.build_worker(job, OWNER, CONFIG, 0)
    shm = next(v for v in pod["spec"]["volumes"] if v["name"] == "graphrun-shm")
    assert shm["emptyDir"]["sizeLimit"] == "8Gi"


def test_without_a_plan_every_worker_keeps_the_templates_resources() -> None:
    job = parse_job(graphsage())
    template = job.spec.replica_specs.worker.template  # type: ignore[union-attr]
    want = template["spec"]["containers"][0]["resources"]
    assert [container(job, i)["resources"] for i in range(2)] == [want, want]


def test_a_plan_without_demands_keeps_the_templates_resources() -> None:
    d = planned()
    del d["spec"]["placement"]["plan"]["demands"]
    del d["spec"]["placement"]["resources"]
    job = parse_job(d)
    B.check_supported(job)
    assert container(job, 1)["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}}


def test_layers_override_per_resource_name() -> None:
    d = planned()
    tpl = d["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    tpl["resources"] = {
        "requests": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "10Gi"},
        "limits": {"memory": "64Gi"},
    }
    d["spec"]["placement"]["resources"] = {
        "node-gpu-1": {"requests": {"cpu": "6500m"}, "limits": {"cpu": 7, "memory": "12Gi"}}
    }
    job = parse_job(d)
    B.check_supported(job)
    assert container(job, 1)["resources"] == {  # template, then the plan's demands
        "requests": {"cpu": "8", "memory": "16G", "ephemeral-storage": "10Gi"},
        "limits": {"memory": "64Gi"},
    }
    assert container(job, 2)["resources"] == {  # ... then placement.resources.node-gpu-1
        "requests": {"cpu": "6500m", "memory": "8G", "ephemeral-storage": "10Gi"},
        "limits": {"cpu": "7", "memory": "12Gi"},
    }


def test_gpus_the_plan_assumes_are_requested_and_limited() -> None:
    d = planned()
    demands = d["spec"]["placement"]["plan"]["demands"]
    demands["trainer:0"]["gpus"] = demands["trainer:2"]["gpus"] = 1
    job = parse_job(d)
    B.check_supported(job)
    assert container(job, 1)["resources"]["requests"][GPU] == "1"
    assert container(job, 1)["resources"]["limits"] == {GPU: "1"}
    assert GPU not in str(container(job, 0)["resources"])


def test_quantities_round_up() -> None:
    assert [cpu_quantity(x) for x in (4, 2.5, 0.0001, 1 / 3)] == ["4", "2500m", "1m", "334m"]
    assert [memory_quantity(x) for x in (16, 1.0095375, 0.5, 1e-7)] == [
        "16G",
        "1010M",
        "500M",
        "1M",
    ]


def _with(d: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *head, last = path.split("/")
    node = d
    for key in head:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    return d


WORKER = "spec/replicaSpecs/worker/template/spec/containers/0/resources"


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            f"{WORKER}/limits",
            {"memory": "4Gi"},
            f"{TEMPLATE}.limits.memory: 4Gi is below the 16G request of plan machine node-gpu-0 "
            "(from spec.placement.plan.demands (roles on node-gpu-0)); raise the limit or set "
            "spec.placement.resources.node-gpu-0",
        ),
        (
            "spec/placement/resources",
            {"node-gpu-1": {"requests": {"memory": "40Gi"}}},
            "spec.placement.resources.node-gpu-1.requests.memory: 40Gi of memory is more than "
            "plan machine node-gpu-1 has (spec.placement.plan.capacity.node-gpu-1.memory_gb: 32)",
        ),
        (
            "spec/placement/resources",
            {"node-gpu-1": {"requests": {"cpu": "4"}, "limits": {"cpu": "3500m"}}},
            "spec.placement.resources.node-gpu-1.limits.cpu: 3500m is below the 4 request",
        ),
        (
            f"{WORKER}/requests",
            {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": 2},
            f"{TEMPLATE}.requests.nvidia.com/gpu: 2 of nvidia.com/gpu is more than plan machine "
            "node-big-mem has (spec.placement.plan.capacity.node-big-mem.gpus: 0)",
        ),
        (
            f"{WORKER}/limits",
            {"memory": "20 GB"},
            f"{TEMPLATE}.limits.memory: '20 GB' is not a Kubernetes quantity",
        ),
        (
            "spec/placement/plan/demands/trainer:2/gpus",
            0.5,
            "spec.placement.plan.demands (roles on node-gpu-1): 0.5 GPUs; Kubernetes gives "
            "whole GPUs",
        ),
        (
            "spec/placement/plan/capacity/node-gpu-1/cpu",
            2,
            "<job>: spec.placement.plan.capacity.node-gpu-1.cpu: the roles on node-gpu-1 "
            "(trainer:2) need 4, the machine has 2",
        ),
        (
            "spec/placement/resources",
            {"node-x": {"requests": {"cpu": 1}}},
            "<job>: spec.placement.resources.node-x: not a machine of the plan",
        ),
        (
            "spec/placement/resources",
            {"node-gpu-0": {"limits": {"memory": "lots"}}},
            "<job>: spec.placement.resources.node-gpu-0.limits.memory: 'lots' is not a "
            "Kubernetes quantity",
        ),
        (
            "spec/placement/resources",
            {"node-gpu-0": {"limits": {"Memory Limit": "1Gi"}}},
            "<job>: spec.placement.resources.node-gpu-0.limits: 'Memory Limit' is not a "
            "resource name",
        ),
    ],
)
def test_resources_that_do_not_fit_are_refused_naming_the_field(
    path: str, value: Any, message: str
) -> None:
    d = _with(planned(), path, value)
    with pytest.raises(SpecError) as info:
        B.check_supported(parse_job(d))
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_resources_of_a_machine_without_a_pod_are_refused() -> None:
    d = planned()
    d["spec"]["runtime"]["machines"] = 4
    d["spec"]["placement"]["plan"]["machines"].append("node-idle")
    d["spec"]["placement"]["plan"]["assignments"]["trainer:3"] = "node-gpu-1"
    d["spec"]["placement"]["resources"] = {"node-idle": {"requests": {"cpu": 1}}}
    with pytest.raises(SpecError, match=r"^spec\.placement\.resources\.node-idle: the plan "):
        B.check_supported(parse_job(d))


def test_resources_need_a_plan() -> None:
    d = graphsage()
    d["spec"]["placement"] = {"resources": {"m0": {"requests": {"cpu": 1}}}}
    with pytest.raises(SpecError, match=r"spec\.placement\.resources: only used with a plan"):
        parse_job(d)


def test_a_wrong_machine_count_is_refused_naming_the_field() -> None:
    d = planned()
    d["spec"]["runtime"]["machines"] = 2
    with pytest.raises(SpecError, match=r"^spec\.placement\.plan\.machines: plan has 3 machines"):
        B.check_supported(parse_job(d))


def test_demands_count_the_roles_the_pod_runs() -> None:
    d = planned()
    plan = d["spec"]["placement"]["plan"]
    d["spec"]["runtime"]["samplerWorkersPerTrainer"] = 1
    plan["assignments"].update({"sampler:2:0": "node-gpu-1", "ps:0": "node-gpu-1"})
    plan["demands"].update({"sampler:2:0": {"cpu": 2, "memory_gb": 1}, "ps:0": {"cpu": 8}})
    plan["capacity"]["node-gpu-1"]["cpu"] = 16
    d["spec"]["training"]["sync"] = "ps"
    job = parse_job(d)
    B.check_supported(job)
    # trainer:2, its sampler worker and the parameter server ps:0 run in the pod
    assert container(job, 2)["resources"]["requests"] == {"cpu": "14", "memory": "9G"}


def _gpu_job(per_machine: int, resources: dict[str, Any] | None = None) -> GraphJob:
    d = graphsage()
    d["spec"]["runtime"]["gpusPerMachine"] = per_machine
    del d["spec"]["runtime"]["trainersPerMachine"]  # one trainer per GPU
    c = d["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    if resources is not None:
        c["resources"] = resources
    return parse_job(d)


def test_gpus_per_machine_are_requested_by_every_worker() -> None:
    job = _gpu_job(2)
    for i in range(job.spec.runtime.machines):
        res = container(job, i)["resources"]
        assert res["requests"][GPU] == "2" and res["limits"][GPU] == "2"
    # a template that names another count is refused, naming the field
    job = _gpu_job(2, {"limits": {GPU: "1"}})
    with pytest.raises(SpecError, match=re.escape(f"{TEMPLATE}.limits.{GPU}: 1 disagrees")):
        container(job, 0)


def test_the_hosts_file_carries_slots_and_gpus() -> None:
    job = _gpu_job(2)
    hosts = L.host_plan(job, OWNER, CONFIG)
    assert [(m.slots, m.gpus) for m in hosts.machines] == [(2, 2), (2, 2)]
    cpu = to_builtins(L.host_plan(parse_job(graphsage()), OWNER, CONFIG))
    assert all("gpus" not in m and m["slots"] == 1 for m in cpu["machines"])
