"""The stop handlers of ``graphrun run``, ``demo`` and ``worker`` (``install_stop_handlers``)."""

from __future__ import annotations

import subprocess
import sys

from graphrun.testing.procs import child_env

# A second SIGTERM that comes while the first one's handler is inside ``stop.set()``,
# holding the event's lock (here: sent from there, as a launcher's death and a stop can
# come together)
NESTED = """
import os, signal, threading
from graphrun.cli.run import install_stop_handlers

stop = threading.Event()
install_stop_handlers(stop)
notify_all = stop._cond.notify_all

def second_signal_now():
    os.kill(os.getpid(), signal.SIGTERM)
    notify_all()

stop._cond.notify_all = second_signal_now
os.kill(os.getpid(), signal.SIGTERM)
print("stopped" if stop.wait(5) else "not stopped", flush=True)
"""


def test_a_second_signal_inside_the_first_ones_handler_does_not_hang_the_process() -> None:
    """A worker whose launcher was killed with -9 hung for ever in its SIGTERM handler:
    a second signal's handler waited for the lock the first one's held."""
    try:
        out = subprocess.run([sys.executable, "-c", NESTED], env=child_env(),
                             capture_output=True, text=True, timeout=20)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AssertionError("the process hung in its signal handler") from None
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == "stopped\n"
