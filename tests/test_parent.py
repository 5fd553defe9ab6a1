"""``graphrun.parent.exit_with``: a process that ends with another that is not its parent
(a loader worker forked from its trainer's fork server)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from graphrun.testing.procs import child_env

WATCHER = """
import errno, os, sys, time
from graphrun.parent import exit_with

if sys.argv[2] == "old-kernel":  # Linux before 5.3 has no pidfd_open
    def no_pidfd(pid, flags=0):
        raise OSError(errno.ENOSYS, "Function not implemented")
    os.pidfd_open = no_pidfd
exit_with(int(sys.argv[1]), every_s=0.05)
print("watching", flush=True)
time.sleep(60)
"""


@pytest.mark.integration
@pytest.mark.parametrize("kernel", ["pidfd", "old-kernel"])
def test_a_process_ends_when_the_one_it_watches_ends(tmp_path, kernel) -> None:
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    script = tmp_path / "watch.py"
    script.write_text(WATCHER)
    watcher = subprocess.Popen(
        [sys.executable, str(script), str(watched.pid), kernel],
        stdout=subprocess.PIPE, text=True, env=child_env(),
    )  # fmt: skip
    try:
        assert watcher.stdout is not None and watcher.stdout.readline() == "watching\n"
        time.sleep(0.3)
        assert watcher.poll() is None  # the watched process lives: the watcher stays
        watched.kill()
        watched.wait(10)
        assert watcher.wait(10) == 1
    finally:
        for p in (watched, watcher):
            p.kill()
            p.wait(10)


def test_a_process_watching_one_already_gone_ends_at_once(tmp_path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)
    script = tmp_path / "watch.py"
    script.write_text(WATCHER)
    watcher = subprocess.run(
        [sys.executable, str(script), str(gone.pid), "pidfd"],
        capture_output=True, text=True, env=child_env(), timeout=30,
    )  # fmt: skip
    assert watcher.returncode == 1
