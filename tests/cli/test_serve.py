"""`graphrun serve` with bad arguments: one line on stderr, exit 2, nothing written."""

from pathlib import Path

import pytest

from graphrun.testing.procs import run_graphrun
from graphrun.testing.store import make_partition_dir

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_partition_dir(tmp_path_factory.mktemp("serve") / "parts", 2)[1]


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--address", "garbage"], "not a valid ZeroMQ address"),
        (["--ready-file", "{tmp}/missing/ready.json"], "--ready-file"),
        (["--log-level", "bogus"], "--log-level"),
        (["--shm-dir", "{tmp}/missing"], "--shm-dir"),
        (["--heartbeat-timeout", "-3"], "--heartbeat-timeout"),
        (["--threads", "0"], "--threads"),
        (["--address", "tcp://127.0.0.1:99999"], "not in 0..65535"),  # bound 34463
    ],
)
def test_bad_arguments(parts: Path, tmp_path: Path, extra: list[str], match: str) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in extra] + ["--insecure"]
    if "--shm-dir" not in args:
        args += ["--shm-dir", str(tmp_path)]
    proc = run_graphrun("serve", str(parts), "--part", "0", *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 or "usage:" in proc.stderr, proc.stderr
    assert match in lines[-1]
    assert list(tmp_path.iterdir()) == []


def test_serve_is_secure_by_default(tmp_path: Path) -> None:
    """It served plaintext to anyone unless --key-file was given."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from graphrun.errors import RpcError
    from graphrun.rpc.auth import load_keys
    from graphrun.store.client import ClientConfig, KVClient
    from graphrun.testing.procs import child_env

    parts = make_partition_dir(tmp_path / "parts", 1)[1]
    ready = tmp_path / "ready.json"
    cmd = [sys.executable, "-m", "graphrun", "serve", str(parts), "--part", "0"]
    cmd += ["--shm-dir", str(tmp_path), "--ready-file", str(ready)]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        key = parts / "store.key"
        assert (os.stat(key).st_mode & 0o777) == 0o600
        address = json.loads(ready.read_text())["address"]
        with pytest.raises(RpcError):
            KVClient(ClientConfig([address], keys=None, timeout=2))
        with KVClient(ClientConfig([address], keys=load_keys(key), timeout=10)) as c:
            assert c.num_parts == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert f"admin key {key}" in out
    refused = run_graphrun("serve", str(parts), "--part", "0", "--insecure", "--key-file", str(key))
    assert refused.returncode == 2 and "--insecure" in refused.stderr


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--threads", "0"], "--threads"),
        (["--address", "garbage"], "not a valid ZeroMQ address"),
        (["--part", "7"], "--part: 7 is not a partition"),
        (["--address", "tcp://127.0.0.1:{busy}"], "cannot bind"),  # found when binding
        (["--dataset"], "partition"),
    ],
)
def test_a_failing_serve_leaves_no_key_behind(tmp_path: Path, extra: list[str], match: str) -> None:
    """A failing `serve` (bad flag, bad address, not a partition directory) left a fresh
    PARTS/store.key behind, even inside a dataset directory."""
    import socket

    parts = make_partition_dir(tmp_path / "parts", 1)[1]
    if extra == ["--dataset"]:
        parts, extra = tmp_path / "dataset", []
        parts.mkdir()
        (parts / "graph.json").write_text("{}")
    before = sorted(p.name for p in parts.iterdir())
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        args = [a.replace("{busy}", str(busy.getsockname()[1])) for a in extra]
        proc = run_graphrun("serve", str(parts), "--part", "0", "--shm-dir", str(tmp_path), *args)
    assert proc.returncode != 0 and match in proc.stderr, proc.stderr
    assert sorted(p.name for p in parts.iterdir()) == before


def test_keygen_writes_a_0600_key_once(tmp_path: Path) -> None:
    import os

    from graphrun.rpc.auth import load_keys

    key = tmp_path / "store.key"
    assert run_graphrun("keygen", str(key)).returncode == 0
    assert os.stat(key).st_mode & 0o777 == 0o600 and load_keys(key)
    before = key.read_text()
    again = run_graphrun("keygen", str(key))
    assert again.returncode == 2 and "already exists" in again.stderr
    assert key.read_text() == before
