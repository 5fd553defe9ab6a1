"""Processes that end with their parent (Linux ``prctl(PR_SET_PDEATHSIG)``).

A role started by the launcher must not outlive it: ``graphrun run`` killed with
SIGKILL cannot stop anything. The kernel sends a chosen signal to a process when the
thread that started it ends; SIGKILL for processes with nothing to clean up, SIGTERM
for those that must (a store server unlinks its shared-memory segments, a worker stops
its roles). Elsewhere (no ``prctl``) these functions do nothing and return False.
A process that is not its parent's child (a loader worker from a fork server) watches
the process instead (:func:`exit_with`).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2


def _prctl() -> Callable[..., int] | None:
    if sys.platform != "linux":
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def set_death_signal(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent ends (safe between
    fork and exec). Returns whether it was set."""
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def death_signal() -> int:
    """The signal this process gets when its parent ends (0: none)."""
    prctl = _prctl()
    if prctl is None:
        return 0
    out = ctypes.c_int(0)
    if prctl(_PR_GET_PDEATHSIG, ctypes.byref(out), 0, 0, 0) != 0:
        return 0
    return out.value


def die_with_parent(sig: int, parent: int | None = None) -> bool:
    """:func:`set_death_signal` for a running process; if the parent (``parent``, the pid
    it had at start) is gone already, ``sig`` is sent to this process now."""
    if not set_death_signal(sig):
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def graceful_with_parent() -> bool:
    """A process started to die with its parent (SIGKILL, as the launcher's supervisor
    asks) gets SIGTERM instead, to clean up on the way out; a process started without
    a death signal (a long-running store from a shell) keeps none. Call it once the
    SIGTERM handler is installed. (A parent that died before this call already killed
    this process: the signal was set before ``exec``.) Returns whether it was changed."""
    return death_signal() != 0 and set_death_signal(signal.SIGTERM)


def exit_with(pid: int, every_s: float = 0.5) -> None:
    """End this process (``os._exit(1)``) once process ``pid`` has ended, from a daemon
    thread: through a pidfd, or where there is none (Linux before 5.3) by looking for
    the pid every ``every_s``. Unlike :func:`set_death_signal` it watches any process,
    not only the parent, and not the thread that started this one."""

    def watch() -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already
            pass
        except OSError:  # no pidfd
            while _exists(pid):
                time.sleep(every_s)
        else:
            select.select([fd], [], [])  # readable when the process has ended
        os._exit(1)

    threading.Thread(target=watch, name=f"exit-with-{pid}", daemon=True).start()


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
