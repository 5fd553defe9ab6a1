"""A trainer's StopFlag: SIGTERM sets it, however the signals come."""

from __future__ import annotations

from graphrun.testing.procs import fresh_python

# a second SIGTERM that lands while the first one's ``Event.set`` holds the event's lock
# (a worker stopping its trainers and the trainer's death signal can come together)
NESTED = """
import os, signal
from graphrun.train.suspend import StopFlag

flag = StopFlag().install()
notify_all = flag._event._cond.notify_all

def second_signal_now():
    os.kill(os.getpid(), signal.SIGTERM)
    notify_all()

flag._event._cond.notify_all = second_signal_now
os.kill(os.getpid(), signal.SIGTERM)
print("stopped" if flag._event.wait(5) else "not stopped", flush=True)
"""


def test_a_second_sigterm_inside_the_first_ones_set_does_not_hang_the_trainer() -> None:
    assert fresh_python(NESTED, timeout=120) == "stopped\n"


def test_set_by_sigterm_once_installed_and_not_before() -> None:
    code = """
import os, signal, time
from graphrun.train.suspend import StopFlag

flag = StopFlag()
signal.signal(signal.SIGTERM, lambda *_: None)  # what was there before
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print(flag.is_set())
flag.install()
os.kill(os.getpid(), signal.SIGTERM)
print(flag._event.wait(5))
"""
    assert fresh_python(code, timeout=120) == "False\nTrue\n"
