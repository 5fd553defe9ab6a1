"""Signal handlers that stop a process: they start a thread and take no lock.

Python runs a signal handler in the main thread between two of its bytecodes, so
whatever lock that thread holds at that moment is held while the handler runs, and a
handler that takes it waits for itself for ever:

* a ``threading.Event``'s condition, held inside ``Event.wait`` and ``Event.set`` — also
  by a first handler's ``Event.set`` when a second signal lands inside it (a worker whose
  launcher was killed with -9 got two SIGTERMs and hung 30 minutes; an inference
  refresher's handler blocked under its own ``stop.wait``, py-spy);
* a buffered stream's lock, held inside a ``print`` or a log line (a ``print`` in the
  handler then raises ``RuntimeError: reentrant call`` in the middle of the main thread's).

So a graphrun handler does one of: assign a plain flag (``stop["flag"] = True``, an
attribute), write a byte to a non-blocking pipe (:class:`graphrun.rpc.waker.Waker`), or
— for an Event, and for anything that prints — :func:`stop_on_signal`: start a daemon
thread that does it. ``Thread.start`` takes only reentrant locks and waits for the new
thread's own event, and a daemon thread takes no lock the main thread may hold
(CPython 3.11 ``threading``). The event is set a moment after the handler returns; the
loops that read it poll it, or ``wait`` on it with a timeout.

At the bottom of the layers (the standard library only): ``graphrun.train`` (a trainer's
:class:`~graphrun.train.suspend.StopFlag`) and the CLI both use it.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signal(stop: threading.Event, say: str | None = None) -> Callable[[int, Any], None]:
    """A signal handler that sets ``stop`` from a thread of its own, first saying
    ``[graphrun] SIGTERM: <say>`` on stderr (once, and only if ``stop`` was not set)."""
    said = threading.Lock()  # taken by the threads, never by the handler

    def stop_now(signum: int) -> None:
        with said:
            if stop.is_set():
                return
            if say is not None:
                print(f"[graphrun] {signal.Signals(signum).name}: {say}", file=sys.stderr)
            stop.set()

    def on_signal(signum: int, frame: Any) -> None:
        threading.Thread(target=stop_now, args=(signum,), name="graphrun-stop", daemon=True).start()

    return on_signal


def stop_on_signals(
    stop: threading.Event, say: str | None = None, signals: Iterable[int] = STOP_SIGNALS
) -> dict[int, Any]:
    """Install :func:`stop_on_signal` for ``signals`` (SIGTERM and SIGINT by default; from
    the main thread). Returns the handlers it replaced, to put back."""
    on_signal = stop_on_signal(stop, say)
    return {s: signal.signal(s, on_signal) for s in signals}


def interrupt_on_sigterm() -> None:
    """SIGTERM raises ``KeyboardInterrupt`` in the main thread, as Ctrl-C does, so that a
    command's ``with`` blocks and ``finally`` clauses run: a benchmark killed so (a
    timeout, a CI job cancelled) stops its child processes and removes its network
    namespaces and temporary directory. Python's default for SIGTERM ends the process at
    once: a ``graphrun bench live --hosts netns`` killed so left its measuring process
    training and four store servers serving in two namespaces that stayed."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
