"""Process-level tuning for large messages, called once at the edge (CLI, worker start).

Every received frame and every gathered reply is a fresh buffer of tens of MB. With
glibc's defaults such buffers are ``mmap``-ed and returned to the kernel on ``free``,
so each message pays page faults on its whole size — on this machine that halves
loopback throughput. :func:`keep_large_allocations` raises the mmap and trim
thresholds (``mallopt``) so freed buffers are reused. It changes the whole process:
the library never calls it by itself; ``graphrun serve``, ``graphrun worker`` and
``graphrun bench`` do. A no-op where glibc is not available.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def keep_large_allocations(threshold: int = 1 << 30) -> bool:
    """Keep freed buffers up to ``threshold`` bytes for reuse; True if glibc accepted it."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(M_MMAP_THRESHOLD, threshold) == 1
    return bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1 and ok)
