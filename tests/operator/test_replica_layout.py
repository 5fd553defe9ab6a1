"""Replicated partitions on Kubernetes: the hosts file and the pods' ports list the
replicas (``store:P:r``) on the worker pod after their primary's."""

from __future__ import annotations

from pathlib import Path

import yaml

from graphrun.job.spec import parse_job
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
