"""Process-level tuning for large messages, called once at the edge (CLI, worker start).

Every received frame and every gathered reply is a fresh buffer of tens of MB. With
glibc's defaults such buffers are ``mmap``-ed and returned to the kernel on ``free``,
so each message pays page faults on its whole size — on this machine that halves
loopback throughput. :func:`keep_large_allocations` raises the mmap and trim
thresholds (``mallopt``) so freed buffers are reused. It changes the whole process:
the library never calls it by itself; ``graphrun serve``, the trainer and ``graphrun
bench`` do. A no-op where glibc is not available.

What is kept is bounded. Freed buffers sit between live objects on the heap, so glibc
never returns them by itself: a trainer that filled its feature cache through a few
hundred MB of pulls, or a server that answered them, held those MB for the rest of its
life (a store server 31 -> 236 MiB of anonymous memory on the 2M-node graph's job,
every byte of it counted against a host of 1.5 GB). A daemon thread (:class:`Releaser`)
looks once a second at what the allocator has in use and, when it has stayed more than
``keep`` bytes below its high-water mark since the last release for ``hold`` looks in a
row, gives the freed pages back (``malloc_trim``). A steady state of messages or
training steps (in use moving less than ``keep``, or coming back to its peak every few
seconds) keeps its buffers; the memory of a transient peak (the feature cache filled, an
evaluation done) goes back within seconds.

:func:`small_pages_for_arrays` (a store server's) turns off numpy's request for
transparent huge pages, whose faults zero 2 MB each on fresh memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from dataclasses import dataclass

from graphrun.errors import ArgumentError

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: freed bytes a process keeps for reuse before :class:`Releaser` gives them back
KEEP_FREED_BYTES = 64 << 20
#: how often the releaser looks at the allocator, and how many looks in a row what is in
#: use must stay low before it releases
RELEASE_EVERY_S = 1.0
HOLD_LOOKS = 3
RELEASER_THREAD = "graphrun-release-freed"


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def in_use_bytes(libc: ctypes.CDLL) -> int | None:
    """Bytes the allocator has handed out and not had back (``mallinfo2``: heap chunks
    in use plus mmap-ed ones), or None before glibc 2.33."""
    try:
        fn = libc.mallinfo2
    except AttributeError:
        return None
    fn.restype = _MallInfo2
    info = fn()
    return int(info.uordblks + info.hblkhd)


@dataclass
class Releaser:
    """When to give freed memory back: once what is in use has stayed more than ``keep``
    bytes below its high-water mark since the last release for ``hold`` looks in a row
    (a pure rule: :meth:`due`, called once a look)."""

    keep: int = KEEP_FREED_BYTES
    hold: int = HOLD_LOOKS
    high: int = 0
    low_for: int = 0  # looks in a row below the mark by more than keep

    def due(self, in_use: int) -> bool:
        self.high = max(self.high, in_use)
        self.low_for = self.low_for + 1 if self.high - in_use > self.keep else 0
        if self.low_for < self.hold:
            return False
        self.high, self.low_for = in_use, 0
        return True


_started: dict[int, threading.Thread] = {}  # pid -> its releaser (a forked child has none)


def _release_loop(libc: ctypes.CDLL, rule: Releaser, every_s: float) -> None:
    trim = libc.malloc_trim
    while True:
        in_use = in_use_bytes(libc)
        if in_use is not None and rule.due(in_use):
            trim(0)  # ctypes lets go of the GIL: the process runs on meanwhile
        time.sleep(every_s)


def keep_large_allocations(
    threshold: int = 1 << 30, keep: int = KEEP_FREED_BYTES, every_s: float = RELEASE_EVERY_S
) -> bool:
    """Keep freed buffers up to ``threshold`` bytes for reuse, and give back what is
    freed beyond ``keep`` bytes below the peak (checked every ``every_s`` by one daemon
    thread per process); True if glibc accepted it."""
    if not (isinstance(keep, int) and 0 <= keep < 1 << 50):
        raise ArgumentError(f"keep: expected a number of bytes in [0, 2**50), got {keep!r}")
    if not (isinstance(every_s, int | float) and 0 < every_s <= 3600):
        raise ArgumentError(f"every_s: expected seconds in (0, 3600], got {every_s!r}")
    libc = _libc()
    if libc is None:
        return False
    try:
        mallopt = libc.mallopt
    except AttributeError:
        return False
    ok = mallopt(M_MMAP_THRESHOLD, threshold) == 1
    ok = mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1 and ok
    if ok and os.getpid() not in _started and in_use_bytes(libc) is not None:
        t = threading.Thread(
            target=_release_loop, args=(libc, Releaser(keep), every_s), daemon=True,
            name=RELEASER_THREAD,
        )  # fmt: skip
        t.start()
        _started[os.getpid()] = t
    return bool(ok)


def small_pages_for_arrays() -> bool:
    """Have numpy stop asking for transparent huge pages for its arrays (it
    ``madvise``-s every array of 4 MB or more to them). A process that allocates fresh
    arrays of MBs over and over pays each huge-page fault as a 2 MB page zeroed (and,
    with the kernel's ``defrag=madvise``, one made by compaction), where small pages
    zero only what the array touches: a store server's delta writes each merge's
    output into fresh memory, and on this box the merging thread spent a third to a
    half of its CPU in those faults (benchmarks/README.md, issue 42, path42). Process
    wide, like :func:`keep_large_allocations`; called once at the edge (``graphrun
    serve``). Returns whether numpy took it (False on a numpy without the switch)."""
    import numpy as np

    core = getattr(np, "_core", None) or getattr(np, "core", None)
    switch = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    if switch is None:
        return False
    switch(False)
    return True


#: how much nicer a server's background thread is than its loop (see :func:`background`)
BACKGROUND_NICE = 10


def background(nice: int = BACKGROUND_NICE) -> bool:
    """Make the calling thread background work: ``SCHED_BATCH`` (it does not preempt the
    thread running when it wakes) and ``nice`` steps nicer than it was (at most 19). A
    store server's loop answers reads; the delta's merging thread and a compaction only
    have to keep up, and on a machine whose cores a trainer also uses each burst of theirs
    otherwise preempts one of its threads (benchmarks/README.md, "the epoch while
    ingesting"). Not lower (``SCHED_IDLE``, nice 19): such a thread starved while it holds
    the GIL would stall the loop. Returns whether it was set (Linux only; Linux sets a
    thread's own priority by its id)."""
    try:
        tid = threading.get_native_id()
        os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + nice))
    except (AttributeError, OSError):
        return False
    return True
