"""`graphrun infer serve|embed` refuses bad arguments in one line, before it joins a store
or listens (no store runs in these tests)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from graphrun.arguments import is_loopback_host
from graphrun.cli import main
from graphrun.rpc.auth import generate_keys
from graphrun.testing.jobs import small_job


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    path = small_job(d, nodes=200)
    ckpt = d / "runs" / "small" / "checkpoints"
    ckpt.mkdir(parents=True)
    (ckpt / "checkpoint.pt").write_bytes(b"only its presence is checked before the store")
    generate_keys(d / "store.key")
    assert main(["keygen", str(d / "small.key"), "--store", str(d / "store.key")]) == 0
    (d / "token").write_text("t" * 32)
    (d / "short").write_text("abc")
    return path


def refused(capsys: pytest.CaptureFixture[str], args: list[str], says: str) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("graphrun: error: ") and says in err and "\n" not in err, err


@pytest.mark.parametrize(
    "extra,says",
    [
        (["--host", "0.0.0.0"], "--host: 0.0.0.0 is not loopback; give --token-file"),
        (["--host", "10.1.2.3"], "is not loopback"),
        (["--token-file", "{d}/short"], "--token-file"),
        (["--token-file", "{d}/none"], "--token-file: cannot read"),
        (["--max-ids", "0"], "--max-ids: 0 is not in"),
        (["--max-ids", "5000"], "--max-ids: 5000 is more than --max-batch-ids 4096"),
        (["--max-body-bytes", "1"], "--max-body-bytes"),
        (["--window-ms", "-1"], "--window-ms"),
        (["--seed", "-3"], "--seed"),
        (["--model-name", "a/b"], "--model-name"),
        (["--store", "nowhere"], "--store: 'nowhere' is not host:port"),
        (["--key-file", "{d}/store.key"], "is a store's admin key"),
        (["--checkpoint", "{d}"], "--checkpoint:"),
        (["--port", "70000"], "--port: 70000"),
    ],
)
def test_serve_refuses_bad_arguments_in_one_line(job, capsys, extra, says) -> None:
    d = job.parent
    args = ["infer", "serve", str(job), "--store", "tcp://127.0.0.1:1", "--key-file",
            str(d / "small.key"), *[a.format(d=d) for a in extra]]  # fmt: skip
    refused(capsys, args, says)


def test_serve_needs_a_store_and_a_free_port(job, capsys) -> None:
    d = job.parent
    refused(capsys, ["infer", "serve", str(job), "--key-file", str(d / "small.key")], "--store:")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["infer", "serve", str(job), "--store", "tcp://127.0.0.1:1",
                "--key-file", str(d / "small.key"), "--port", str(port)]  # fmt: skip
        refused(capsys, args, f"--host/--port: cannot listen on 127.0.0.1:{port}")


def test_embed_refuses_bad_arguments(job, capsys) -> None:
    d = job.parent
    base = ["infer", "embed", str(job), "--store", "tcp://127.0.0.1:1"]
    refused(
        capsys, [*base, "--key-file", str(d / "small.key"), "--batch-size", "0"], "--batch-size"
    )
    refused(capsys, [*base, "--key-file", str(d / "store.key")], "admin key")
    key = ["--key-file", str(d / "small.key")]
    refused(capsys, [*base, *key, "--version", "1"], "--version: only with --live or --refresh")
    refused(capsys, [*base, *key, "--refresh", "--version", "-1"], "--version: -1 is not in")
    refused(capsys, [*base, *key, "--follow"], "--follow: only with --live or --refresh")
    refused(capsys, [*base, *key, "--live", "--follow", "--version", "1"], "not with --follow")
    refused(capsys, [*base, *key, "--live", "--follow", "--poll-s", "0"], "--poll-s: 0.0 is not")


def test_embed_refuses_before_it_imports_torch(job) -> None:
    """A refused ``graphrun infer embed`` imported torch first (4.4 CPU-s for one line, 0.5 now)."""
    d = job.parent
    code = "import sys; from graphrun.cli import main; code = main(sys.argv[1:]); "
    code += "print('torch' in sys.modules); sys.exit(code)"
    argv = ["infer", "embed", str(job), "--store", "tcp://127.0.0.1:1",
            "--key-file", str(d / "store.key")]  # fmt: skip
    got = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert got.returncode == 2 and "admin key" in got.stderr, got.stderr
    assert got.stdout.strip() == "False"


def test_serve_pins_a_version_only_when_told_to(job, capsys) -> None:
    args = ["infer", "serve", str(job), "--store", "tcp://127.0.0.1:1", "--key-file",
            str(job.parent / "small.key"), "--version", "3"]  # fmt: skip
    refused(capsys, args, "--version: only with --follow pinned")
    refused(capsys, [*args, "--follow", "pinned", "--version", "-2"], "--version: -2 is not in")


@pytest.mark.parametrize(
    "host,loopback",
    [("127.0.0.1", True), ("127.0.0.2", True), ("127.255.0.9", True), ("::1", True),
     ("[::1]", True), ("localhost", True), ("0.0.0.0", False), ("::", False),
     ("10.0.0.1", False), ("192.168.1.5", False), ("example.com", False), ("", False)],
)  # fmt: skip
def test_loopback_is_127_0_0_0_8_and_ipv6_1_and_localhost(host, loopback) -> None:
    assert is_loopback_host(host) is loopback


def test_accepted_connections_send_without_waiting_for_acks() -> None:
    """TCP_NODELAY: uvicorn writes a response's head and body apart; with Nagle's algorithm
    the body waited for the client's delayed ACK, 40 ms every request on a kept-alive
    connection (measured: GET /v2/health/ready 44 ms, then 2 ms)."""
    from graphrun.serving.config import bind

    with bind("127.0.0.1", 0) as listening, socket.socket() as client:
        client.connect(listening.getsockname())
        accepted, _ = listening.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
