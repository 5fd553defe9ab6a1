"""``graphrun probe``: measured hosts, written as the cluster file ``graphrun plan`` takes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphrun.cli import main
from graphrun.local.netns import unavailable_reason
from graphrun.measure import host as measure
from graphrun.measure.auth import HEADER, KEY_ENV, MAGIC, new_key, tag
from graphrun.measure.probe import HostMeasure, LinkMeasure, assemble
from graphrun.placement.cluster import cluster_from_dict, load_cluster
from graphrun.testing.procs import child_env


def test_effective_cores_are_bounded_by_the_workers() -> None:
    cores = measure.effective_cores(0.3, workers=1)
    # at most one core for one worker; at least a little of one on a busy machine (the
    # other xdist worker's jobs and more: 0.24 read at a load of 8 on 2 cores)
    assert 0.05 < cores <= 1.05


def test_memory_is_at_most_the_machine_total() -> None:
    total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    assert 0 < measure.memory_bytes() <= total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server(what: str, port: int, key: bytes, step: int = 3) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "graphrun.measure.host", what, "--bind", "127.0.0.1"]
    env = child_env() | {KEY_ENV: key.hex()}
    srv = subprocess.Popen(
        [*cmd, "--port", str(port), "--step", str(step), "--timeout", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert srv.stdout is not None and '"up"' in srv.stdout.readline()
    return srv


def test_sink_measures_what_send_sent() -> None:
    key, port = new_key(), _free_port()
    sink = _server("sink", port, key)
    sent = measure.send(f"127.0.0.1:{port}", 0.2, key, step=3)
    got = json.loads(sink.communicate(timeout=30)[0])
    assert got["bytes"] == sent["bytes"] and got["bytes_per_s"] > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["sink", "echo"])
def test_a_stranger_first_neither_stalls_nor_spoils_a_measuring_server(what: str) -> None:
    """Idle strangers connect first, one shows a header tagged with another key, one the
    right key's header of another step: they are closed unanswered, and the client with
    the key is measured well within the server's deadline (before: the server took the
    first connection, the idle stranger's, and waited on it for 60 s)."""
    key, port = new_key(), _free_port()
    srv = _server(what, port, key)
    try:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        forged = socket.create_connection(("127.0.0.1", port), timeout=10)
        header = HEADER.pack(MAGIC, 3, 0, 5)
        forged.sendall(header + tag(new_key(), b"hdr", header))
        other_step = socket.create_connection(("127.0.0.1", port), timeout=10)
        header = HEADER.pack(MAGIC, 4, 0, 5)
        other_step.sendall(header + tag(key, b"hdr", header))
        assert forged.recv(64) == b""  # closed, no go
        t0 = time.monotonic()
        if what == "sink":
            sent = measure.send(f"127.0.0.1:{port}", 0.2, key, step=3)
        else:
            assert measure.ping(f"127.0.0.1:{port}", 5, key, step=3)["latency_s"] > 0
        out, err = srv.communicate(timeout=20)
        assert srv.returncode == 0, err
        assert time.monotonic() - t0 < 20  # not the idle stranger's 30 s
        if what == "sink":
            assert json.loads(out.splitlines()[-1])["bytes"] == sent["bytes"]
        assert other_step.recv(64) == b""
        for c in [*idle, forged, other_step]:
            c.close()
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()


def test_a_client_without_the_key_is_not_answered_and_the_server_not_taken() -> None:
    key, port = new_key(), _free_port()
    srv = _server("sink", port, key)
    try:
        with pytest.raises(ConnectionError):  # the server closes it, no go
            measure.send(f"127.0.0.1:{port}", 0.1, new_key(), step=3)
        sent = measure.send(f"127.0.0.1:{port}", 0.1, key, step=3)  # the real one still
        assert json.loads(srv.communicate(timeout=30)[0])["bytes"] == sent["bytes"]
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()


def test_measuring_servers_need_the_key(tmp_path) -> None:
    env = {k: v for k, v in child_env().items() if k != KEY_ENV}
    cmd = [sys.executable, "-m", "graphrun.measure.host", "sink", "--bind", "127.0.0.1"]
    out = subprocess.run([*cmd, "--port", "1"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and KEY_ENV in out.stderr and "Traceback" not in out.stderr


def test_probe_refuses_bad_arguments(tmp_path, capsys) -> None:
    assert main(["probe", "-o", str(tmp_path / "c.yaml"), "--seconds", "-1"]) == 2
    assert "--seconds" in capsys.readouterr().err
    assert main(["probe", "-o", str(tmp_path / "c.yaml"), "--hosts", "netns"]) == 2
    assert "--cluster" in capsys.readouterr().err
    assert main(["probe", "-o", str(tmp_path / "no" / "c.yaml")]) == 2
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.exclusive  # measures CPU shares and link rates
@pytest.mark.integration
@pytest.mark.netns
@pytest.mark.timeout(300)
@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_probe_measures_emulated_hosts_within_10_percent(tmp_path, capsys) -> None:
    emulated = tmp_path / "emulated.yaml"
    emulated.write_text(
        "machines:\n"
        "  - {name: fast, cpu: 0.5, memory_gb: 2, bandwidth_gbps: 0.2}\n"
        "  - {name: slow, cpu: 0.25, memory_gb: 1, bandwidth_gbps: 0.05}\n"
    )
    out = tmp_path / "probed.yaml"
    argv = ["probe", "--hosts", "netns", "--cluster", str(emulated), "-o", str(out)]
    assert main([*argv, "--seconds", "0.5"]) == 0
    measured = json.loads(capsys.readouterr().out)
    c = load_cluster(out)  # a valid cluster file for graphrun plan
    assert c.names == ("fast", "slow")
    assert c.memory_gb == (2.0, 1.0)
    # the quota exactly: timed from the first fork, both read ~5% low (0.57 for 0.6 in
    # the closed loop's probes, benchmarks/README.md pr8)
    assert abs(c.cpu[0] / 0.5 - 1) < 0.04 and abs(c.cpu[1] / 0.25 - 1) < 0.04, c.cpu
    for i, gbps in enumerate((0.2, 0.05)):  # egress is the shaped direction
        assert abs(c.egress[i] * 8 / 1e9 - gbps) / gbps < 0.10, (c.egress, measured)
    assert set(measured["pairs"]) == {"fast->slow", "slow->fast"}


def test_steady_rate_leaves_out_the_start() -> None:
    # a 0.2 s stall at the start (a retransmission timeout), then 10 MB/s for 1 s
    marks = [(0.0, 1)] + [(0.2 + i * 0.01, 1 + 100_000 * (i + 1)) for i in range(100)]
    assert measure.steady_rate(marks) == pytest.approx(10e6, rel=0.02)
    assert measure.steady_rate([(0.0, 5)]) == 0.0


def test_assemble_takes_the_fastest_link_each_way() -> None:
    hosts = [HostMeasure("a", 3.96, 0.01, 2 * 2**30), HostMeasure("b", 1.0, 0.02, 2**30)]
    links = [
        LinkMeasure("a", "b", 1e9 / 8, 1e-4),  # 1 Gbit/s
        LinkMeasure("b", "a", 0.5e9 / 8, 2e-4),
    ]
    out = assemble(hosts, links)
    c = cluster_from_dict(out["cluster"])
    assert c.names == ("a", "b") and c.cpu == (3.96, 1.0) and c.memory_gb == (2.0, 1.0)
    assert c.egress == pytest.approx((1e9 / 8, 0.5e9 / 8))
    assert c.ingress == pytest.approx((0.5e9 / 8, 1e9 / 8))
    assert out["measured"]["pairs"] == {
        "a->b": {"gbps": 1.0, "latency_ms": 0.1},
        "b->a": {"gbps": 0.5, "latency_ms": 0.2},
    }
    assert out["measured"]["hosts"]["b"]["kernel_s"] == 0.02


@pytest.mark.parametrize(
    "argv",
    [
        ["cpu", "--seconds", "1e300"],
        ["cpu", "--seconds", "nan"],
        ["send", "--to", "127.0.0.1:1", "--seconds", "-1"],
        ["sink", "--bind", "127.0.0.1", "--port", "70000"],
        ["ping", "--to", "127.0.0.1:1", "--count", "0"],
    ],
)
def test_bad_command_lines_get_one_line_before_any_work(argv, capsys):
    """`cpu --seconds 1e300` was accepted and spun two processes for ever."""
    with pytest.raises(SystemExit) as exc:
        measure.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "graphrun: error: argument" in err


def test_a_probe_answer_that_is_not_an_object_is_one_host_error(tmp_path) -> None:
    """`cpu["cores"]` of an answer that was a list failed as a TypeError traceback."""
    from graphrun.errors import HostError
    from graphrun.measure.probe import _measure

    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho '[1, 2]'\n")
    python.chmod(0o755)
    with pytest.raises(HostError, match=r"probe cpu: answered \[1, 2\], not a JSON object"):
        _measure([], "cpu", python=str(python))
