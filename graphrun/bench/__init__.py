"""graphrun.bench: benchmarks behind ``graphrun bench WHAT`` (see graphrun/cli/bench.py)."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from graphrun.errors import ArgumentError

# The job spec's bounds (graphrun.job.spec.base), for the benchmarks' own flags: not
# imported from there, since `graphrun --help` builds every benchmark's parser and the
# spec imports pydantic; tests/cli/test_command_input.py checks that they agree.
MAX_EPOCHS = 1_000_000
MAX_BATCH_SIZE = 1 << 20
MAX_FANOUT = 100_000
MAX_LAYERS = 16
MAX_HIDDEN = 1 << 16
MAX_THREADS = 1024  # torch intra-op threads


def check_at_least(args: argparse.Namespace, minimum: float, *flags: str) -> None:
    """Raise an :class:`ArgumentError` naming the first ``--flag`` below ``minimum``.

    A flag may hold one number or a list (``nargs="+"``); NaN fails too.
    """
    for flag in flags:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        for v in value if isinstance(value, list) else [value]:
            if not v >= minimum:
                raise ArgumentError(f"{flag}: must be at least {minimum:g}, got {v}")


def int_list(flag: str, text: str, minimum: int = 1) -> list[int]:
    """``"10,20"`` -> ``[10, 20]``; an ArgumentError naming ``flag`` otherwise."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ArgumentError(f"{flag}: expected comma-separated ints, got {text!r}") from None
    if not out or min(out) < minimum:
        raise ArgumentError(f"{flag}: expected ints >= {minimum}, got {text!r}")
    return out


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds process ``pid`` (all its threads) has used so far
    (Linux /proc); OSError once it is gone."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def call_times(fn: Callable[[], object], repeats: int) -> list[float]:
    """Seconds of ``repeats`` timed calls of ``fn``, after one untimed (the warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times
