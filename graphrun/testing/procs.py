"""Child processes for tests: the ``graphrun`` command run from this checkout.

Store server processes are started with :mod:`graphrun.local.stores` (the library's
one way, also used by the benchmarks).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]


def child_env() -> dict[str, str]:
    """This process's environment with this checkout first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def run_graphrun(
    *args: str, launcher: Sequence[str] = (), timeout: float | None = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m graphrun ARGS`` (behind ``launcher``, e.g. a netns prefix) to the
    end; stdout and stderr captured as text, the exit code not checked."""
    cmd = [*launcher, sys.executable, "-m", "graphrun", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=timeout)


_HELPERS = ("resource_tracker", "forkserver")


def live_children() -> list[psutil.Process]:
    """This process's living descendants, except Python's own multiprocessing resource
    tracker and fork server (started by the first loader workers, alive until this
    process ends)."""
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(f"multiprocessing.{h}" in " ".join(c.cmdline()) for h in _HELPERS):
                continue
        except psutil.NoSuchProcess:
            continue
        out.append(c)
    return out
