"""Network-namespace hosts: real separate network stacks (needs root and iproute2)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from graphrun.job.local import LocalMachines
from graphrun.job.netns import NetnsNetwork, list_namespaces, unavailable_reason
from graphrun.testing.jobs import two_machines

REASON = unavailable_reason()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.integration,
    pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}"),
]


SERVE = """
import socket, sys
s = socket.create_server((sys.argv[1], 5555))
print("up", flush=True)
c, _ = s.accept()
c.sendall(b"hi")
"""
CONNECT = """
import socket, sys
c = socket.create_connection((sys.argv[1], 5555), timeout=3)
assert c.recv(2) == b"hi"
"""


def test_machines_reach_each_other_and_namespaces_are_removed():
    with NetnsNetwork(["m0", "m1"], bandwidth_mbit=100) as net:
        names = set(list_namespaces())
        assert {h.namespace for h in net.hosts.values()} <= names
        server = subprocess.Popen(
            [*net.prefix("m1"), sys.executable, "-c", SERVE, net.address("m1")],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None and server.stdout.readline() == "up\n"
            client = subprocess.run(
                [*net.prefix("m0"), sys.executable, "-c", CONNECT, net.address("m1")],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert client.returncode == 0, client.stderr
            # the machine address does not exist in our own namespace
            here = subprocess.run(
                [sys.executable, "-c", CONNECT, net.address("m1")], capture_output=True, timeout=30
            )
            assert here.returncode != 0
        finally:
            server.kill()
            server.wait()
    left = set(list_namespaces())
    assert not {h.namespace for h in net.hosts.values()} & left
    assert net.switch not in left


def test_a_job_runs_with_machines_in_namespaces(tmp_path):
    with NetnsNetwork(["m0", "m1"]) as net:
        addrs = (net.address("m0"), net.address("m1"))
        # fresh namespaces: every port is free
        other = f"import socket; socket.create_connection(('{addrs[0]}', 7000), timeout=5).close()"
        launches = two_machines({1: other}, addresses=addrs, ports=[7000, 7001])
        sink = io.StringIO()
        res = LocalMachines(tmp_path, sink=sink, grace_s=2.0, wrap=net.prefix).run(launches)
    assert res.exits["trainer:1"] == 0
    assert "listening on" in sink.getvalue()
