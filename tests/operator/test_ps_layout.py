"""The operator runs a ``training.sync: ps`` job's parameter servers in its worker pods."""

from __future__ import annotations

import json

import kubernetes_validate

from graphrun.job.hosts import Hosts
from graphrun.job.spec import parse_job
from graphrun.machine.roles import job_paths, job_placement, machine_launches
from graphrun.names import RoleName
from graphrun.operator import builders as B
from graphrun.operator import layout as L
from graphrun.wire import convert_json

OWNER = L.Owner("psjob", "ml", "0b7e3c2a-0000-4000-8000-000000000002")
CONFIG = L.OperatorConfig()


def ps_job():
    return parse_job({
        "apiVersion": "graphrun.io/v1alpha1", "kind": "GraphJob", "metadata": {"name": "psjob"},
        "spec": {
            "graph": {"dataset": "datasets/products"},
            "runtime": {"machines": 2, "parameterServers": 3},
            "training": {"task": "node-classification", "sync": "ps", "staleness": 2},
            "sharedVolume": {"claimName": "data"},
        },
    })  # fmt: skip


def test_worker_pods_run_and_expose_the_parameter_servers(tmp_path):
    job = ps_job()
    assert [list(map(str, roles)) for roles in L.machine_roles(job)] == [
        ["store:0", "ps:0", "ps:2", "trainer:0"], ["store:1", "ps:1", "trainer:1"],
    ]  # fmt: skip
    data = json.loads(B.build_configmap(job, OWNER, CONFIG)["data"]["hosts.json"])
    hosts = convert_json(Hosts, data, "hosts.json")
    assert {r for r in hosts.endpoints if r.kind == "ps"} == {RoleName.ps(j) for j in range(3)}
    worker = B.build_worker(job, OWNER, CONFIG, 0)
    kubernetes_validate.validate(worker, kubernetes_validate.latest_version(), strict=True)
    ports = {p["name"]: p["containerPort"] for p in worker["spec"]["containers"][0]["ports"]}
    assert ports["ps-0"] == hosts.endpoint(RoleName.ps(0))[1]
    assert ports["ps-2"] == hosts.endpoint(RoleName.ps(2))[1]
    # what `graphrun worker` in pod 0 runs from that hosts file
    paths = job_paths(job, tmp_path / "job.yaml")
    launch = machine_launches(job, job_placement(job, paths), hosts, paths)[0]
    assert [str(r.role) for r in launch.of_kind("ps")] == ["ps:0", "ps:2"]
