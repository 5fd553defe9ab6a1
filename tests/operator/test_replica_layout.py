"""Replicated partitions on Kubernetes: the hosts file and the pods' ports list the
replicas (``store:P:r``) on the worker pod after their primary's."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from graphrun.job.spec import parse_job
from graphrun.machine.roles import load_job_launch
from graphrun.names import RoleName
from graphrun.operator import layout as L

ROOT = Path(__file__).resolve().parents[2]
OWNER = L.Owner("rep", "ml", "0b7e3c2a-0000-4000-8000-000000000002")


def test_replicas_have_endpoints_and_ports_on_the_next_worker_pod() -> None:
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["metadata"]["name"] = "rep"
    d["spec"]["runtime"]["replicas"] = 2
    job = parse_job(d)
    machines = job.spec.runtime.machines
    hosts = L.host_plan(job, OWNER, L.OperatorConfig())
    for p in range(job.spec.num_parts):
        primary = hosts.endpoints[RoleName.store(p)].host
        replica = hosts.endpoints[RoleName.store(p, replica=1)].host
        assert replica != primary
        assert replica.startswith(f"rep-worker-{(p + 1) % machines}.")
    ports = [name for i in range(machines) for name, _ in L.machine_ports(job, i)]
    assert sum(n.startswith("store-") for n in ports) == len(hosts.store_endpoints()) * 2


def test_every_worker_pod_waits_for_each_partition_or_its_replica(tmp_path) -> None:
    """What ``graphrun worker --job`` builds in a worker pod from the operator's hosts
    file: each partition's servers, its replica on the next pod able to stand in."""
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["metadata"]["name"] = "rep"
    d["spec"]["runtime"]["replicas"] = 2
    job = parse_job(d)
    hosts = L.host_plan(job, OWNER, L.OperatorConfig())
    job_file = tmp_path / "job.yaml"
    job_file.write_text(json.dumps(job.to_dict()))
    hosts_file = hosts.write(tmp_path / "hosts.json")
    ep = hosts.endpoints
    for i in range(job.spec.runtime.machines):
        launch = load_job_launch(job_file, str(i), hosts_file, tmp_path / "keys")
        parts = [s for s in launch.wait_for if s.of.startswith("partition ")]
        assert [(s.main[0], s.replicas) for s in parts] == [
            (ep[RoleName.store(p)], (ep[RoleName.store(p, replica=1)],))
            for p in range(job.spec.num_parts)
        ]
