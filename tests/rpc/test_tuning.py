"""Large allocations kept for reuse, and given back once they are freed beyond a bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from graphrun.rpc.tuning import BACKGROUND_NICE, Releaser, _libc, background, in_use_bytes
from graphrun.testing.procs import child_env

MB = 1 << 20

# in a process of its own (mallopt changes the whole process): 300 MB of buffers, each
# beside a small live object, as a pull's frames and the arrays made meanwhile lie
PEAK_AND_FREE = """
import json, re, sys, time
import numpy as np
from graphrun.rpc.tuning import keep_large_allocations

def anon():
    status = open("/proc/self/status").read()
    return int(re.search(r"RssAnon:\\s+(\\d+)", status).group(1)) >> 10

assert keep_large_allocations(keep=64 << 20, every_s=0.05)
base, small, bufs = anon(), [], []
for _ in range(15):
    bufs.append(np.ones(20 << 20, np.uint8))
    small.append(np.ones(1000))
peak = anon()
del bufs
time.sleep(1.0)
print(json.dumps({"base": base, "peak": peak, "after": anon()}))
"""


def _glibc_233() -> bool:
    libc = _libc()
    return sys.platform == "linux" and libc is not None and in_use_bytes(libc) is not None


@pytest.mark.skipif(not _glibc_233(), reason="glibc 2.33+ only")
def test_freed_buffers_beyond_the_bound_go_back_to_the_kernel():
    """A store server kept every buffer it ever freed (236 MiB after answering the
    feature-cache pulls of the 2M-node graph's trainers, for the rest of the job)."""
    out = subprocess.run(
        [sys.executable, "-c", PEAK_AND_FREE], capture_output=True, text=True, timeout=120,
        env=child_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    mb = json.loads(out.stdout)
    assert mb["peak"] - mb["base"] >= 290, mb  # the buffers were there
    assert mb["after"] - mb["base"] <= 64 + 16, mb  # and went back, but for what is kept


# a process forked after the releaser started (a warm server's trainer) starts its own
FORKED = """
import os, sys, threading
from graphrun.rpc.tuning import RELEASER_THREAD, keep_large_allocations

def releasers():
    return sum(t.name == RELEASER_THREAD for t in threading.enumerate())

assert keep_large_allocations() and keep_large_allocations() and releasers() == 1
pid = os.fork()
if pid == 0:
    ok = releasers() == 0 and keep_large_allocations() and releasers() == 1
    os._exit(0 if ok else 3)
sys.exit(os.waitpid(pid, 0)[1] >> 8)
"""


@pytest.mark.skipif(not _glibc_233(), reason="glibc 2.33+ only")
def test_one_releaser_a_process_and_a_forked_child_gets_its_own():
    out = subprocess.run(
        [sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=60,
        env=child_env(),
    )  # fmt: skip
    assert out.returncode == 0, (out.returncode, out.stderr)


def test_a_steady_state_keeps_its_buffers_and_a_fall_from_a_peak_releases_once():
    rule = Releaser(keep=64 * MB, hold=3)
    # messages come and go: in use moves by less than the bound, nothing is released
    assert not any(rule.due(n * MB) for n in (100, 160, 110, 150, 100, 163, 100))
    # training steps: far below the peak between steps, back at it within the hold
    assert not any(rule.due(n * MB) for n in (400, 200, 200, 400, 200, 200, 400, 200))
    assert [rule.due(200 * MB) for _ in range(3)] == [False, True, False]  # stayed low
    assert not any(rule.due(200 * MB) for _ in range(5))  # once: the mark is 200 now
    assert [rule.due(n * MB) for n in (300, 100, 100, 100)] == [False, False, False, True]


@pytest.mark.parametrize(
    "bad", [{"keep": -1}, {"keep": 1.5}, {"every_s": 0}, {"every_s": float("nan")}]
)
def test_bad_settings_are_refused_before_anything_changes(bad):
    from graphrun.errors import ArgumentError
    from graphrun.rpc.tuning import keep_large_allocations

    with pytest.raises(ArgumentError, match=next(iter(bad))):
        keep_large_allocations(**bad)


def _priority(tid: int) -> tuple[int, int]:
    return os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")
def test_a_background_thread_is_batch_and_nicer_and_only_it():
    main = threading.get_native_id()
    before = _priority(main)
    seen: list[tuple[int, int]] = []

    def work() -> None:
        assert background()
        seen.append(_priority(threading.get_native_id()))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == [(os.SCHED_BATCH, min(19, before[1] + BACKGROUND_NICE))]
    assert _priority(main) == before  # the caller's thread only, not the process


# in a process of its own (numpy's switch is process wide): whether the mapping that
# holds a fresh 64 MB array is marked for transparent huge pages ("hg" in its VmFlags)
HUGE_PAGE_FLAG = """
import sys
import numpy as np
from graphrun.rpc.tuning import small_pages_for_arrays

def marked(a):
    at = a.ctypes.data + a.nbytes // 2  # numpy marks the whole pages inside the array
    lines = open("/proc/self/smaps").read().splitlines()
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= at < hi
        elif inside and line.startswith("VmFlags:"):
            return " hg" in line
    raise SystemExit("no mapping holds the array")

before = np.ones(8 << 20)
ok = small_pages_for_arrays()
after = np.ones(8 << 20)
print(marked(before), ok, marked(after))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")
def test_small_pages_for_arrays_stops_numpy_asking_for_huge_pages():
    out = subprocess.run(
        [sys.executable, "-c", HUGE_PAGE_FLAG], capture_output=True, text=True, timeout=60,
        env=child_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    before, ok, after = out.stdout.split()
    if before != "True":  # a kernel without transparent huge pages: nothing to turn off
        pytest.skip("numpy marks no array for huge pages on this kernel")
    assert (ok, after) == ("True", "False")
