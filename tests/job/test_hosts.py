"""The hosts file's probes: one store server per machine, for an elastic trainer's check
that it is not the one cut off (docs/elastic.md)."""

from __future__ import annotations

from graphrun.job.hosts import FORMAT, VERSION, Hosts, Machine


def test_every_machine_with_a_store_server_gets_one_probe():
    hosts = Hosts(
        format=FORMAT, version=VERSION,
        machines=tuple(Machine(f"m{i}", f"10.77.0.{i + 1}") for i in range(3)),
        endpoints={
            "store:0": "10.77.0.1:30000", "store:1:r": "10.77.0.1:30003",
            "store:1": "10.77.0.2:30001", "trainer:2": "10.77.0.3:29500",
        },
    )  # fmt: skip
    # m2 serves nothing: not probed (it counts as reached)
    assert hosts.probes() == {"m0": "10.77.0.1:30000", "m1": "10.77.0.2:30001"}
