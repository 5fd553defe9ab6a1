"""The Kubernetes probe's members: the tournament, the report, real members on loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from itertools import permutations

import pytest

from graphrun.errors import PEER_LOST_EXIT, HostError
from graphrun.measure.member import (
    HEADER,
    KEY_BYTES,
    KEY_ENV,
    MAGIC,
    MESSAGE_LIMIT,
    MemberReport,
    parse_key,
    parse_peers,
    schedule,
    tag,
)
from graphrun.measure.probe import HostMeasure, LinkMeasure, assemble
from graphrun.placement.cluster import cluster_from_dict
from graphrun.testing.procs import child_env


@pytest.mark.parametrize("n", range(1, 10))
def test_schedule_measures_every_ordered_pair_once_and_each_member_once_a_step(n: int) -> None:
    steps = schedule(n)
    pairs = [pair for step in steps for pair in step]
    expected = [(0, 0)] if n == 1 else list(permutations(range(n), 2))
    assert sorted(pairs) == sorted(expected)  # each exactly once
    for step in steps:
        members = [m for pair in step for m in set(pair)]
        assert len(members) == len(set(members)), step
    if n > 1:  # disjoint pairs at once: 2(n-1) steps for even n, 2n for odd
        assert len(steps) == 2 * (n - 1 + n % 2)


def test_report_round_trips_and_refuses_what_is_not_one() -> None:
    r = MemberReport(2, 3.5, 0.0123, 8 * 2**30, ((0, 1.25e8, 1e-4), (1, 9.9e7, 2e-4)))
    assert MemberReport.from_message(r.to_message(), "pod p") == r
    with pytest.raises(HostError, match=r"^pod p on n1: the termination message is not a"):
        MemberReport.from_message("Traceback (most recent call last):", "pod p on n1")
    with pytest.raises(HostError, match="version 7"):
        MemberReport.from_message('{"v": 7}', "pod p")


def test_a_report_too_large_for_a_termination_message_fails_loud() -> None:
    links = tuple((j, 123.456e9 + j, 1.23456789e-4) for j in range(200))
    with pytest.raises(HostError, match=f"more than the {MESSAGE_LIMIT}"):
        MemberReport(0, 64.0, 0.01, 2**40, links).to_message()
    # a report of 100 members fits (99 links each, at 1 Tbit/s)
    assert len(MemberReport(99, 64.0, 0.01, 2**40, links[:99]).to_message()) <= MESSAGE_LIMIT


def test_peers_are_host_port_items() -> None:
    assert parse_peers("a-0.a:29500,10.0.0.2:1") == (("a-0.a", 29500), ("10.0.0.2", 1))
    with pytest.raises(ValueError, match="item 1 'b' is not HOST:PORT"):
        parse_peers("a:1,b")


def _free_ports(n: int) -> list[int]:
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


KEY = "5a" * KEY_BYTES  # the probe's key, as the Secret gives it


def _member(
    i: int, peers: str, tmp_path, timeout: float = 60, key: str | None = KEY
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "graphrun", "probe", "--member", str(i), "--peers", peers]
    argv += ["--seconds", "0.2", "--timeout", str(timeout)]
    argv += ["--message-file", str(tmp_path / f"member-{i}")]
    env = child_env()
    env.pop(KEY_ENV, None)
    if key is not None:
        env[KEY_ENV] = key
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _stranger(port: int, header: bytes) -> bytes:
    """Connect to a member's port, send ``header``; what came back before it closed."""
    for _ in range(600):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.sendall(header)
                conn.settimeout(15)
                try:
                    return conn.recv(64)
                except (ConnectionResetError, TimeoutError):
                    return b""
        except ConnectionRefusedError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listened on {port}")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_three_members_on_loopback_measure_every_link(tmp_path) -> None:
    ports = _free_ports(3)
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    procs = [_member(i, peers, tmp_path) for i in (2, 0, 1)]  # started in any order
    # strangers on member 0's port are closed unanswered: a health check, and one who
    # knows the protocol but not the key (claiming member 1's step, with a wrong tag)
    assert _stranger(ports[0], b"GET / HTTP/1.0\r\n\r\n" + bytes(64)) == b""
    forged = HEADER.pack(MAGIC, 0, 1, 50)
    assert _stranger(ports[0], forged + tag(b"not the key" * 3, b"hdr", forged)) == b""
    for p in procs:
        _, err = p.communicate(timeout=150)
        assert p.returncode == 0, err
    reports = [
        MemberReport.from_message((tmp_path / f"member-{i}").read_text(), f"member {i}")
        for i in range(3)
    ]
    assert [r.index for r in reports] == [0, 1, 2]
    for r in reports:
        assert sorted(j for j, _, _ in r.links) == sorted({0, 1, 2} - {r.index})
        assert all(rate > 0 and 0 < latency < 0.1 for _, rate, latency in r.links)
        assert r.cores > 0 and r.kernel_s > 0 and r.memory_bytes > 0
    names = ["node-a", "node-b", "node-c"]
    out = assemble(
        [HostMeasure(names[r.index], r.cores, r.kernel_s, r.memory_bytes) for r in reports],
        [LinkMeasure(names[r.index], names[j], v, t) for r in reports for j, v, t in r.links],
    )
    assert cluster_from_dict(out["cluster"]).names == tuple(names)
    assert len(out["measured"]["pairs"]) == 6


def test_a_member_without_the_probe_key_refuses_to_start(tmp_path) -> None:
    cases = [
        (None, "needs the probe's key in $GRAPHRUN_PROBE_KEY"),
        ("zz", "not hex"),
        ("ab" * 8, "8 bytes, a probe key has at least 32"),
    ]
    for key, why in cases:
        p = _member(0, "127.0.0.1:1", tmp_path, key=key)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 2 and err.startswith("graphrun: error: ") and why in err, err
        assert err.strip().count("\n") == 0, err  # one line, no traceback


def test_tags_bind_role_header_and_message() -> None:
    key, header = b"k" * 32, HEADER.pack(MAGIC, 3, 1, 50)
    assert tag(key, b"go", header) != tag(key, b"hdr", header)  # no replay across roles
    assert tag(key, b"ans", header, b"{}") != tag(key, b"ans", HEADER.pack(MAGIC, 4, 1, 50), b"{}")
    assert parse_key("AB" * 32) == b"\xab" * 32


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_member_whose_peer_never_comes_exits_peer_lost(tmp_path) -> None:
    peers = ",".join(f"127.0.0.1:{p}" for p in _free_ports(2))
    p = _member(0, peers, tmp_path, timeout=2)  # nobody comes: a longer wait shows nothing more
    _, err = p.communicate(timeout=100)
    assert p.returncode == PEER_LOST_EXIT, err
    message = (tmp_path / "member-0").read_text()
    assert message.startswith("graphrun: error: probe member 0: member 1 (127.0.0.1:")
    assert message.count("\n") == 0 and "no connection" in message


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_idle_strangers_do_not_hold_up_the_members(tmp_path) -> None:
    """Each idle connection held the accept loop for 10 s: 60 strangers on a member's
    port kept its peer out until the deadline. Now headers are read all at once, each
    connection on its own clock."""
    ports = _free_ports(2)
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    receiver = _member(1, peers, tmp_path, timeout=45)  # member 1 receives in step 0
    for _ in range(600):  # until it listens
        try:
            socket.create_connection(("127.0.0.1", ports[1]), timeout=5).close()
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    idle = []
    for _ in range(200):  # say nothing (past MAX_PENDING: the oldest are closed)
        conn = socket.socket()
        conn.setblocking(False)
        conn.connect_ex(("127.0.0.1", ports[1]))
        idle.append(conn)
    try:
        sender = _member(0, peers, tmp_path, timeout=45)
        for p in (receiver, sender):
            _, err = p.communicate(timeout=150)
            assert p.returncode == 0, err
    finally:
        for conn in idle:
            conn.close()
    reports = [
        MemberReport.from_message((tmp_path / f"member-{i}").read_text(), f"member {i}")
        for i in range(2)
    ]
    assert [[j for j, _, _ in r.links] for r in reports] == [[1], [0]]
