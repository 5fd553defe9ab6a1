"""Child processes for tests: the ``graphrun`` command run from this checkout.

Store server processes are started with :mod:`graphrun.local.stores` (the library's
one way, also used by the benchmarks).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]


def child_env() -> dict[str, str]:
    """This process's environment with this checkout first on ``PYTHONPATH``."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    if path.split(os.pathsep)[0] != str(REPO_ROOT):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), path]))
    return env


def run_graphrun(
    *args: str, launcher: Sequence[str] = (), timeout: float | None = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m graphrun ARGS`` (behind ``launcher``, e.g. a netns prefix) to the
    end; stdout and stderr captured as text, the exit code not checked."""
    cmd = [*launcher, sys.executable, "-m", "graphrun", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=timeout)


def fresh_python(code: str, timeout: float = 60.0) -> str:
    """The standard output of ``python -c CODE`` in a fresh interpreter (this checkout
    first on its path): for what a process has imported, or not, by its end. An
    AssertionError with its standard error when it exits non-zero, or when it has not
    ended in ``timeout`` seconds (hung: it is killed)."""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=child_env(), timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AssertionError(f"python -c did not end in {timeout:g} s: it hung") from None
    assert out.returncode == 0, out.stderr
    return out.stdout


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


def sent_then_exit(*queues: Any, code: int = 0) -> NoReturn:
    """End this process as graphrun's trainers end (``os._exit``), once what it put on
    ``queues`` (multiprocessing queues) is sent. A test trainer that ran DDP over gloo
    ends with it before returning: DDP's teardown as its frame is freed, or Python's
    finalisation, could deadlock with a gloo thread waiting for the interpreter lock,
    and the process outlived its test."""
    for q in queues:
        q.close()
        q.join_thread()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def torch_processes() -> Any:
    """The ``multiprocessing`` context for test processes that import torch: forked from
    the fork server the loader workers use (:data:`graphrun.distributed.workers.PRELOAD`:
    torch and PyG imported once per test process), not spawned as new interpreters that
    import them again (2-3 CPU-s each). Its children start with SIGTERM's default action."""
    import multiprocessing as mp

    from graphrun.distributed.workers import PRELOAD

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # the same list, whoever starts it first
    return ctx


def run_then_exit(target: Callable[..., object], *args: object) -> NoReturn:
    """A process target: ``target(*args)``, then :func:`sent_then_exit` with the queues
    among ``args`` (exit code 1, the traceback on stderr, if ``target`` raised)."""
    import traceback

    code = 0
    try:
        target(*args)
    except BaseException:
        traceback.print_exc()
        code = 1
    sent_then_exit(*(a for a in args if callable(getattr(a, "join_thread", None))), code=code)
