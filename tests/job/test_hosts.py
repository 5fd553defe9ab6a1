"""The hosts file's probes: one store server per machine, for an elastic trainer's check
that it is not the one cut off (docs/elastic.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphrun.errors import SpecError
from graphrun.job.hosts import FORMAT, VERSION, Hosts, Machine, build_hosts
from graphrun.names import Endpoint, RoleName


def endpoints(text: dict[str, str]) -> dict[RoleName, Endpoint]:
    return {RoleName.parse(r): Endpoint.parse(e) for r, e in text.items()}


def test_every_machine_with_a_store_server_gets_one_probe():
    hosts = Hosts(
        format=FORMAT, version=VERSION,
        machines=tuple(Machine(f"m{i}", f"10.77.0.{i + 1}") for i in range(3)),
        endpoints=endpoints({
            "store:0": "10.77.0.1:30000", "store:1:r": "10.77.0.1:30003",
            "store:1": "10.77.0.2:30001", "trainer:2": "10.77.0.3:29500",
        }),
    )  # fmt: skip
    # m2 serves nothing: not probed (it counts as reached)
    assert hosts.probes() == {
        "m0": Endpoint("10.77.0.1", 30000), "m1": Endpoint("10.77.0.2", 30001)
    }  # fmt: skip


def test_a_rendezvous_served_apart_is_said_so_and_read_back(tmp_path: Path) -> None:
    address = {"m0": "10.0.0.1", "m1": "10.0.0.2"}
    placement = {RoleName.store(0): "m0", RoleName.trainer(0): "m0", RoleName.trainer(1): "m1"}
    own = build_hosts(address, placement, [RoleName.store(0)], [30000, 30001])
    assert (own.rendezvous, own.rendezvous_external) == ("10.0.0.1:30001", False)
    assert "rendezvous_external" not in json.loads(own.write(tmp_path / "a.json").read_text())
    apart = build_hosts(
        address, placement, [RoleName.store(0)], [30000, 30001], rendezvous="rdv.example"
    )
    assert (apart.rendezvous, apart.rendezvous_external) == ("rdv.example:30001", True)
    written = json.loads(apart.write(tmp_path / "b.json").read_text())
    assert written["format"] == FORMAT and written["rendezvous_external"] is True
    assert Hosts.read(tmp_path / "b.json") == apart


def test_a_file_rendezvous_cannot_be_served_apart(tmp_path: Path) -> None:
    path = tmp_path / "hosts.json"
    doc = {"format": FORMAT, "version": VERSION, "machines": [{"name": "m0", "address": "a"}],
           "rendezvous": "file:///run/rdv", "rendezvous_external": True}  # fmt: skip
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match="rendezvous_external"):
        Hosts.read(path)


def test_machines_that_share_an_address_are_not_probed():
    # local hosts: every machine is 127.0.0.1; an endpoint found by address is any
    # machine's (m2 was probed at m0's store: with m0 lost, the survivors each found
    # themselves cut off and the job restarted instead of going on; issue 40, item 7)
    hosts = Hosts(
        format=FORMAT, version=VERSION,
        machines=tuple(Machine(f"m{i}", "127.0.0.1") for i in range(3)),
        endpoints=endpoints({"store:0": "127.0.0.1:30000", "store:1": "127.0.0.1:30001",
                             "store:2": "127.0.0.1:30002"}),
    )  # fmt: skip
    assert hosts.probes() == {}
