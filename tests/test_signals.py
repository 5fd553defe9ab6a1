"""``graphrun.signals``: the stop handlers of ``run``, ``demo``, ``worker``, ``infer embed
--follow`` and a trainer's StopFlag never wait for a lock the interrupted main thread
holds. Each scenario runs in a fresh interpreter, which must end (a hang fails it)."""

from __future__ import annotations

from graphrun.testing.procs import fresh_python

SETUP = """
import io, os, signal, sys, threading
from graphrun.signals import stop_on_signals

stop = threading.Event()
old = stop_on_signals(stop, say="stopping the job")
"""

# inside Event.wait (or Event.set) the main thread holds the event's condition lock when
# a signal lands: the ``infer embed --follow`` refresher that never ended (stop 61)
UNDER_WAIT = """
with stop._cond:
    os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, the lock held
print("stopped" if stop.wait(5) else "not stopped", flush=True)
"""

# a second SIGTERM that comes while the first one's work is inside ``stop.set()``, holding
# the event's lock (a launcher's death and a stop can come together)
NESTED = """
notify_all = stop._cond.notify_all

def second_signal_now():
    os.kill(os.getpid(), signal.SIGTERM)
    notify_all()

stop._cond.notify_all = second_signal_now
os.kill(os.getpid(), signal.SIGTERM)
print("stopped" if stop.wait(5) else "not stopped", flush=True)
"""

# a signal that lands while the main thread writes to stderr holds the stream's lock: a
# print in the handler raised ``RuntimeError: reentrant call`` in the middle of the
# main thread's write
INSIDE_A_WRITE = """
class Stderr(io.RawIOBase):
    def __init__(self):
        self.got = []

    def writable(self):
        return True

    def write(self, b):
        if bytes(b).startswith(b"a warning"):
            os.kill(os.getpid(), signal.SIGTERM)  # lands inside the write
        self.got.append(bytes(b))
        return len(b)

raw = Stderr()
sys.stderr = io.TextIOWrapper(io.BufferedWriter(raw), line_buffering=True)
print("a warning", file=sys.stderr)
stopped = stop.wait(5)
sys.stderr.flush()
print(stopped, b"".join(raw.got).decode().splitlines(), flush=True)
"""


# three Ctrl-Cs in a row: one line
SAYS_ONCE = """
os.dup2(1, 2)  # its stderr: the stdout the test reads
for _ in range(3):
    os.kill(os.getpid(), signal.SIGINT)
stop.wait(5)
for t in threading.enumerate():
    if t.name == "graphrun-stop":
        t.join(5)
"""

PUT_BACK = """
print(sorted(old) == sorted([signal.SIGTERM, signal.SIGINT]))
print(old[signal.SIGINT] is signal.default_int_handler)
print(signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL)
"""


def test_the_handler_does_not_wait_for_the_event_lock_the_main_thread_holds() -> None:
    assert fresh_python(SETUP + UNDER_WAIT) == "stopped\n"


def test_a_second_signal_inside_the_first_ones_stop_does_not_hang_the_process() -> None:
    """A worker whose launcher was killed with -9 hung for ever in its SIGTERM handler:
    a second signal's handler waited for the lock the first one's held."""
    assert fresh_python(SETUP + NESTED) == "stopped\n"


def test_a_signal_inside_a_write_to_stderr_says_its_line_after_it() -> None:
    out = fresh_python(SETUP + INSIDE_A_WRITE)
    assert out == "True ['a warning', '[graphrun] SIGTERM: stopping the job']\n"


def test_it_says_so_once_however_many_signals_come() -> None:
    assert fresh_python(SETUP + SAYS_ONCE) == "[graphrun] SIGINT: stopping the job\n"


def test_the_replaced_handlers_come_back_to_be_put_back() -> None:
    assert fresh_python(SETUP + PUT_BACK) == "True\nTrue\nTrue\n"
