"""``graphrun bench live`` stopped by SIGTERM leaves nothing running (stop 62: its
measuring process went on training and four store servers serving, in namespaces that
stayed, after the bench itself was gone)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` now (from /proc)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.timeout(300)
def test_a_bench_stopped_by_sigterm_stops_its_stores_and_its_measuring_process():
    argv = ["bench", "live", "--nodes", "1000", "--degree", "8", "--batch", "200",
            "--batches", "400", "--probes", "3", "--rate", "2000", "--epoch-batches", "2",
            "--epoch-pairs", "2", "--threads", "1", "--batch-size", "32"]  # fmt: skip
    bench = subprocess.Popen([sys.executable, "-m", "graphrun", *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline, seen = time.monotonic() + 180, []
        while time.monotonic() < deadline:  # the measuring process and its stores serve
            seen = [c for c in _children(bench.pid) if "graphrun serve" in _cmdline(c)]
            if len(seen) >= 2:
                break
            assert bench.poll() is None, bench.communicate()
            time.sleep(0.2)
        assert len(seen) >= 2, "the stores never started"
        everyone = _children(bench.pid)
        drive = [c for c in everyone if "--drive" in _cmdline(c)]
        assert drive
        tmp = Path(_cmdline(drive[0]).split("--drive", 1)[1].split()[0]).parent
        os.kill(bench.pid, signal.SIGTERM)
        _, err = bench.communicate(timeout=120)
        assert bench.returncode == 130, err
        assert "graphrun: interrupted" in err
        left = [p for p in everyone if Path(f"/proc/{p}").exists() and _cmdline(p)]
        assert not left, [_cmdline(p) for p in left]
        assert not tmp.exists()
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
