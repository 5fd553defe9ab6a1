"""`graphrun bench serve`: its bad arguments, its load generator's checks, and small runs
end to end, on loopback and on two netns hosts (its JSON's shape; no timing is asserted)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import numpy as np
import pytest

from graphrun.bench.httpload import MAX_ANSWER, read_answer
from graphrun.cli import main
from graphrun.errors import ProtocolError
from graphrun.local.netns import list_namespaces, unavailable_reason


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--requests", "0"], "--requests: must be at least 1"),
        (["--seconds", "0"], "--seconds: must be at least 0.1"),
        (["--concurrency", "1,x"], "--concurrency: expected comma-separated ints"),
        (["--concurrency", "2000"], "--concurrency: at most 1024"),
        (["--window-ms", "-1"], "--window-ms: -1.0 is not in [0, 1000]"),
        (["--refreshes", "0"], "--refreshes: must be at least 1"),
        (["--refreshes", "101"], "--refreshes: at most 100, got 101"),
        (["--modes", "fast"], "--modes: 'fast' is not one of sampled, full, precomputed"),
        (["--fanouts", "5,0"], "--fanouts"),
        (["--dataset", "/nonexistent"], "--dataset: /nonexistent is not a dataset directory"),
    ],
)
def test_bad_arguments(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "serve", *argv]) == 2
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()
    assert says in line and out.out == ""


def test_a_dataset_directory_is_taken(tmp_path) -> None:
    """`--dataset` takes what `graphrun generate` writes (it looked for a `dataset.json`
    that no dataset has, and refused every one)."""
    import argparse

    from graphrun.bench.serve import _check, register

    assert main(["generate", "community", str(tmp_path / "g"), "--nodes", "50"]) == 0
    p = argparse.ArgumentParser().add_subparsers()
    register(p)
    args = p.choices["serve"].parse_args(["--dataset", str(tmp_path / "g")])
    _check(args)  # no ArgumentError
    assert args.dataset == tmp_path / "g"


def check_runs(got: dict[str, Any], modes: list[str], clients: list[int], n: int) -> None:
    assert [(r["mode"], r["concurrency"]) for r in got["runs"]] == [
        (m, c) for m in modes for c in clients
    ]
    for r in got["runs"]:
        assert r["errors"] == 0 and r["requests"] == n
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["requests_per_s"] > 0
        assert r["client_cpu_s"] > 0 and r["load_avg"] >= 0
        if r["server_cpu_s"] > 0:  # counted in clock ticks (10 ms): 20 short requests may not
            assert r["requests_per_server_cpu_s"] == pytest.approx(n / r["server_cpu_s"], 0.01)
        else:
            assert r["requests_per_server_cpu_s"] is None
    assert got["full_pass_s"] > 0 and len(got["load_avg"]) == 3
    assert got["refresh_s"] > 0 and 0 <= got["refresh_recomputed"] <= got["nodes"]
    assert got["refresh_s"] == pytest.approx(float(np.median(got["refreshes_s"])))
    assert got["refresh_cpu_s"] > 0 and got["refresh_own_process_s"] > 0  # staying up, not
    assert got["refresh_max_abs_diff"] <= 1e-5


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_small_run_prints_the_runs_and_the_full_pass(capsys: pytest.CaptureFixture[str]) -> None:
    modes = ["sampled", "full", "precomputed"]
    argv = ["bench", "serve", "--nodes", "600", "--requests", "20", "--seconds", "5",
            "--concurrency", "1,4", "--fanouts", "5,5", "--modes", ",".join(modes),
            "--refreshes", "3"]  # fmt: skip
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["nodes"] == 600 and got["hosts"] == "local"
    check_runs(got, modes, [1, 4], 20)
    assert len(got["refreshes_s"]) == 3  # each after its own 1,000 edges
    # 1,000 new edges, no feature: every row of A_1 and A_2 moves by its running sums
    assert got["refresh_recomputed"] == 0
    assert got["refresh_updated"] == sum(got["refresh_per_layer"]) > 0


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_on_two_netns_hosts_the_store_is_across_the_link(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The store on m1, the endpoint and the generator on m0; no namespace of this
    process's left after (other tests' and sessions' come and go meanwhile)."""
    argv = ["bench", "serve", "--nodes", "600", "--requests", "10", "--seconds", "5",
            "--concurrency", "2", "--fanouts", "5,5", "--hosts", "netns"]  # fmt: skip
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["hosts"] == "netns"
    check_runs(got, ["sampled", "full"], [2], 10)
    assert [n for n in list_namespaces() if n.startswith(f"graphrun-{os.getpid()}-")] == []


def test_the_generator_refuses_an_answer_that_is_not_http() -> None:
    async def status(raw: bytes) -> int:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        return await read_answer(reader)

    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
    assert asyncio.run(status(ok)) == 200
    for raw in (b"SSH-2.0\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\n{}",
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (MAX_ANSWER + 1)):  # fmt: skip
        with pytest.raises(ProtocolError):  # not HTTP/1.1 as the endpoint writes it
            asyncio.run(status(raw))


def test_a_refresher_that_outlives_its_sigterm_is_killed_and_named() -> None:
    # a CI run's refresher did not end within the wait and went on after the stores stopped
    import subprocess
    import sys

    from graphrun.bench.serve import _stop
    from graphrun.errors import GraphrunError

    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print(1, flush=True); time.sleep(60)")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "1"  # SIGTERM ignored
    with pytest.raises(GraphrunError, match="did not stop within 1 s of SIGTERM: killed"):
        _stop(proc, grace_s=1.0)
    assert proc.returncode is not None  # not left running
