"""A real small tmpfs for tests of full disks and small shared memory (root only)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(mnt: Path, size: str = "256k") -> Iterator[Path]:
    """Mount a tmpfs of ``size`` on ``mnt`` (made if missing) and unmount it after;
    the test is skipped where mounting is not possible."""
    mnt.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)])
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
