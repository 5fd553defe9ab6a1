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
        (["--shm-dir", "{tmp}/missing"], "shm_dir"),
        (["--heartbeat-timeout", "-3"], "heartbeat_timeout"),
        (["--threads", "0"], "--threads"),
    ],
)
def test_bad_arguments(parts: Path, tmp_path: Path, extra: list[str], match: str) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    if "--shm-dir" not in args:
        args += ["--shm-dir", str(tmp_path)]
    proc = run_graphrun("serve", str(parts), "--part", "0", *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 or "usage:" in proc.stderr, proc.stderr
    assert match in lines[-1]
    assert list(tmp_path.iterdir()) == []
