"""``training.sync: ps``: the spec fields, the ``ps:J`` roles, their placement and launches."""

from __future__ import annotations

import pytest

from graphrun.errors import SpecError
from graphrun.job.spec import job_roles, parse_job, resolve_placement
from graphrun.machine.launch import Servers
from graphrun.machine.roles import job_paths, job_placement, machine_launches, plan_hosts
from graphrun.names import RoleName

PY = "/usr/bin/python3"


def make_job(training=None, runtime=None, placement=None):
    spec = {
        "graph": {"dataset": "data"},
        "partition": {"parts": 2, "output": "parts"},
        "runtime": {"machines": 2, **(runtime or {})},
        "training": {"task": "node-classification", **(training or {})},
        "placement": placement or {},
    }
    return parse_job(
        {"apiVersion": "graphrun.io/v1alpha1", "kind": "GraphJob", "metadata": {"name": "j"},
         "spec": spec}
    )  # fmt: skip


def test_ps_roles_follow_the_spec():
    assert [r.kind for r in job_roles(make_job().spec)].count("ps") == 0
    one = make_job({"sync": "ps"})
    assert [r.name for r in job_roles(one.spec) if r.kind == "ps"] == ["ps:0"]
    three = make_job({"sync": "ps", "staleness": 3}, {"parameterServers": 3})
    roles = {r.name: r.machine for r in job_roles(three.spec)}
    assert {k: v for k, v in roles.items() if k.startswith("ps")} == {
        "ps:0": "m0", "ps:1": "m1", "ps:2": "m0",
    }  # fmt: skip
    names = list(roles)
    assert names.index("store:1") < names.index("ps:0") < names.index("trainer:0")


@pytest.mark.parametrize(
    "training, runtime, field",
    [
        ({"staleness": 2}, {}, "spec.training.staleness"),
        ({}, {"parameterServers": 2}, "spec.runtime.parameterServers"),
        ({"sync": "ps"}, {"parameterServers": 0}, "spec.runtime.parameterServers"),
        ({"sync": "nccl"}, {}, "spec.training.sync"),
        ({"sync": "ps", "staleness": -1}, {}, "spec.training.staleness"),
    ],
)
def test_bad_ps_fields_are_named(training, runtime, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        make_job(training, runtime)


def test_a_plan_places_parameter_servers(tmp_path):
    job = make_job({"sync": "ps"}, {"parameterServers": 2},
                   {"assignments": {"ps:0": "m1", "trainer:1": "m0"}})  # fmt: skip
    where = resolve_placement(job)
    assert where[RoleName.ps(0)] == "m1" and where[RoleName.ps(1)] == "m1"
    bad = make_job(placement={"assignments": {"ps:0": "m1"}})  # an allreduce job
    with pytest.raises(SpecError, match="ps:0: the plan places a parameter server; run it with"):
        resolve_placement(bad)


def test_launches_start_the_ps_roles_with_the_job_key(tmp_path):
    job = make_job({"sync": "ps", "staleness": 2}, {"parameterServers": 2})
    paths = job_paths(job, tmp_path / "job.yaml")
    roles = job_placement(job, paths)
    hosts = plan_hosts(job, roles, {"m0": "10.0.0.1", "m1": "10.0.0.2"})
    assert hosts.endpoints[RoleName.ps(1)].host == "10.0.0.2"
    assert len(set(hosts.endpoints.values())) == len(hosts.endpoints)  # a port each
    launches = machine_launches(job, roles, hosts, paths, python=PY)
    m1 = launches[1]
    assert [(r.kind, str(r.role)) for r in m1.roles] == [
        ("store", "store:1"), ("ps", "ps:1"), ("trainer", "trainer:1"),
    ]  # fmt: skip
    ps = m1.roles[1]
    assert ps.ready == hosts.endpoints[RoleName.ps(1)]
    argv = ps.argv
    assert argv[1:4] == ("-m", "graphrun", "ps") and "--index" in argv
    assert argv[argv.index("--key-file") + 1] == str(paths.key_file)
    ps0 = Servers(of="ps:0", main=(hosts.endpoints[RoleName.ps(0)],))
    assert ps0 in m1.wait_for  # trainers start once every ps is up
