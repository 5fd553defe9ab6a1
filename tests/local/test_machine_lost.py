"""The launcher's side of elastic trainers: which losses a job survives, and what it says."""

from __future__ import annotations

import io
import json

from graphrun.local.elastic import can_go_on, machine_lost_event
from graphrun.local.machines import LocalMachines
from graphrun.machine.launch import MachineLaunch, RoleKind, RoleLaunch
from graphrun.machine.process import RoleCommand, RoleExit


def _launch(machine: str, *roles: tuple[RoleKind, str]) -> MachineLaunch:
    launches = tuple(RoleLaunch.of(k, RoleCommand(r, machine, ("true",))) for k, r in roles)
    return MachineLaunch(machine=machine, roles=launches)


LAUNCHES = [
    _launch("m0", ("store", "store:0"), ("store", "store:2:r"), ("trainer", "trainer:0")),
    _launch("m1", ("store", "store:1"), ("store", "store:0:r"), ("trainer", "trainer:1")),
    _launch("m2", ("store", "store:2"), ("store", "store:1:r"), ("trainer", "trainer:2")),
]


def test_a_job_goes_on_while_min_machines_are_left():
    assert can_go_on(3, 1, 2) and not can_go_on(3, 2, 2) and not can_go_on(3, 1, None)


def test_the_event_names_what_took_over():
    event = machine_lost_event("m1", LAUNCHES, -9, ["m1"])
    assert event["machine"] == "m1" and event["exit_code"] == -9
    assert event["took_over"] == {
        "partitions": {"partition 1": "store:1:r on m2"},
        "trainers": ["m0", "m2"],
    }


def _exit(machine: str, code: int) -> RoleExit:
    return RoleExit(f"worker:{machine}", machine, code)


def test_a_dead_worker_is_a_lost_machine_only_while_enough_are_left(tmp_path):
    sink = io.StringIO()
    machines = LocalMachines(tmp_path, sink, elastic_min=2)
    states = {"m0": "training", "m1": "training", "m2": "training"}
    assert machines._survive(LAUNCHES, states, [_exit("m1", -9)]) == []
    assert machines.lost == ["m1"]
    assert json.loads(sink.getvalue())["event"] == "machine_lost"
    fatal = machines._survive(LAUNCHES, states, [_exit("m2", -9)])  # one left: below 2
    assert [ex.role for ex in fatal] == ["worker:m2"]
    # a worker that ends before its trainers start fails the attempt; so does any without
    # elastic
    starting = {"m0": "serving", "m1": "serving", "m2": "serving"}
    assert LocalMachines(tmp_path, sink, elastic_min=2)._survive(
        LAUNCHES, starting, [_exit("m1", 1)]
    )
    assert LocalMachines(tmp_path, sink)._survive(LAUNCHES, states, [_exit("m1", -9)])
