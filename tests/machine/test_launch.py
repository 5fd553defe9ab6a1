"""The launch plan: what a machine waits for before its trainers start, and its file."""

from __future__ import annotations

import json

import pytest

from graphrun.errors import SpecError
from graphrun.machine.launch import MachineLaunch, RoleLaunch, Servers
from graphrun.names import Endpoint, RoleName

MAIN, BACKUP, REPLICA, SECOND = (Endpoint("10.0.0.1", p) for p in (1, 2, 3, 4))
PART = Servers(of="partition 0", main=(MAIN, BACKUP), replicas=(REPLICA,))


@pytest.mark.parametrize(
    ("answering", "up"),
    [
        ({MAIN, BACKUP, REPLICA}, True),  # every server
        ({REPLICA}, True),  # the primary is gone: its replica registered with it, so serves
        ({BACKUP, REPLICA}, True),  # the primary's backups are not used after a failover
        ({MAIN, BACKUP}, False),  # the replica has not registered yet: its tensors would miss it
        ({MAIN, REPLICA}, False),  # a backup not up yet would never be learned
        ({BACKUP}, False),
        (set(), False),
    ],
)
def test_a_replica_stands_in_for_a_dead_primary_and_only_then(answering, up):
    asked: list[Endpoint] = []

    def is_ready(e: Endpoint) -> bool:
        asked.append(e)
        return e in answering

    assert PART.up(is_ready) is up
    assert asked[0] == MAIN  # the main server first: whether a replica may stand in


def test_without_replicas_every_server_must_answer():
    alone = Servers(of="ps:0", main=(MAIN,))
    assert alone.up({MAIN}.__contains__) and not alone.up(set().__contains__)
    two = Servers(of="partition 1", main=(MAIN, BACKUP), replicas=(REPLICA, SECOND))
    assert two.up({SECOND}.__contains__)  # any replica
    assert not two.up({MAIN, BACKUP, REPLICA}.__contains__)  # the second has not registered


def test_servers_name_their_main_server():
    with pytest.raises(ValueError, match="partition 3: main must name its main server"):
        Servers(of="partition 3", main=())


def test_a_plan_of_another_version_is_refused_naming_the_file(tmp_path):
    plan = MachineLaunch(machine="m0", roles=(), wait_for=(PART,)).write(tmp_path / "m0.json")
    data = json.loads(plan.read_text())
    assert (data["format"], data["version"]) == ("graphrun-launch", 2)
    assert MachineLaunch.read(plan).wait_for == (PART,)
    # version 1 had no header and waited for a flat list of endpoints
    old = {k: v for k, v in data.items() if k not in ("format", "version")}
    old["wait_for"] = ["10.0.0.1:1", "10.0.0.1:3"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(SpecError, match=r"old\.json: field 'format' is None, not 'graphrun-la"):
        MachineLaunch.read(tmp_path / "old.json")
    (tmp_path / "v3.json").write_text(json.dumps({**data, "version": 3}))
    with pytest.raises(SpecError, match=r"v3\.json: field 'version' is 3; this .* reads version 2"):
        MachineLaunch.read(tmp_path / "v3.json")


def test_cpu_trainers_spin_less_unless_the_job_or_the_machine_sets_openmp_s_waiting():
    py, t = ("python", "-m"), "graphrun.machine.trainer"
    roles = (
        RoleLaunch.of("store", RoleName.store(0), (*py, "graphrun", "serve"), {"PYTHONPATH": "/s"}),
        RoleLaunch.of("trainer", RoleName.trainer(0), (*py, t)),
        RoleLaunch.of("trainer", RoleName.trainer(1), (*py, t, "--gpu", "0")),
        RoleLaunch.of("trainer", RoleName.trainer(2), (*py, t),
                      {"OMP_WAIT_POLICY": "PASSIVE"}),  # the job's own
        RoleLaunch.of("trainer", RoleName.trainer(3), (*py, t),
                      {"OMP_NUM_THREADS": "2"}),  # threads, not waiting
    )  # fmt: skip
    launch = MachineLaunch(machine="m0", roles=roles)

    def envs(inherited: dict[str, str]) -> list[dict[str, str]]:
        return [r.env for r in launch.with_trainer_openmp(inherited).roles]

    assert envs({"PATH": "/bin"}) == [
        {"PYTHONPATH": "/s"},  # a store server: its torch, if any, has one thread
        {"GOMP_SPINCOUNT": "20000"},
        {},  # a GPU trainer
        {"OMP_WAIT_POLICY": "PASSIVE"},
        {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "20000"},
    ]
    # the worker's own environment (a pod's, the launcher's shell) says how to wait
    for inherited in ({"GOMP_SPINCOUNT": "5000"}, {"OMP_WAIT_POLICY": "ACTIVE"}):
        assert envs(inherited)[1] == {} and envs(inherited)[4] == {"OMP_NUM_THREADS": "2"}
    assert launch.with_trainer_openmp({}).roles[0] is roles[0]
