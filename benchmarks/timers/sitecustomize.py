"""Thread CPU by function inside a running ``graphrun serve`` (issue 42, rep42c): a
``sitecustomize`` that wraps a list of the server's functions with
``time.thread_time()`` (the calling thread's CPU, user and system) and writes each one's
total seconds and calls as JSON on SIGUSR1. Unlike cProfile (every call of every
function timed: Python-heavy code inflated 2-5x, numpy-heavy code not) it times only the
functions named, about 0.5 µs a call.

    cd /tmp && TIMERS=/tmp/out PYTHONPATH=/work/wt/X/benchmarks/timers:<code> \\
        WINDOW=4 REPLICAS=2 BATCHES=600 python /work/wt/X/benchmarks/live_ingest_cpu.py

(``live_ingest_cpu.py`` sends SIGUSR1 to each server after the batches when ``TIMERS``
is set): ``/tmp/out/{primary,replica}-PID.json``, ``{"module.function": [s, calls]}``.
Inclusive times: a function's time holds its callees' that are listed too. The totals
are the process's life (its start, the warm-up batch): divide by the batches only what
runs once a batch (the handlers; the guard's ticks run while idle too).
"""

import functools
import json
import os
import signal
import sys
import time


def _install(out_dir: str) -> None:
    from graphrun.rpc import codec, guard, transport
    from graphrun.store import (
        live,
        live_check,
        live_log,
        live_ops,
        live_wire,
        replicas,
        wal,
        writes,
    )

    acc: dict[str, list[float]] = {}

    def wrap(owner, name):
        f = getattr(owner, name, None)
        if f is None:  # another version's code: not there
            return
        label = f"{getattr(owner, '__name__', owner)}.{name}"
        tt = time.thread_time

        @functools.wraps(f)
        def timed(*a, **k):
            t = tt()
            try:
                return f(*a, **k)
            finally:
                e = acc.setdefault(label, [0.0, 0])
                e[0] += tt() - t
                e[1] += 1

        setattr(owner, name, timed)

    for owner, names in [
        (transport.RpcServer, ["poll", "_serve_one", "_reply", "_wait"]),
        (transport, ["decode"]),
        (codec, ["_header"]),
        (guard.GuardedRouter, ["tick", "recv", "drain_events"]),
        (writes, ["forward", "settle"]),
        (writes.Turn, ["end"]),
        (replicas, ["apply_write"]),
        (replicas.Replication, ["send", "collect"]),
        (live_ops, ["live_prepare", "live_begin", "_hold", "check_piece", "piece_from_wire",
                    "numbered_piece", "publish", "sync", "log_apply"]),
        (live_log.LiveLog, ["write", "sync"]),
        (wal.WriteAheadLog, ["append", "_grow", "_flush"]),
        (live.LiveDelta, ["hold"]),
        (live.Rows, ["array"]),
        (live_check, ["_ids", "_in", "_unique", "_new_ids", "id_runs", "_features"]),
        (live_wire, ["run_ids", "piece_from_wire"]),
    ]:
        for n in names:
            wrap(owner, n)
    tag = "replica" if "--replica-of" in sys.argv else "primary"
    path = os.path.join(out_dir, f"{tag}-{os.getpid()}.json")

    def dump(*_):
        with open(path, "w") as f:
            json.dump({k: [round(v[0], 5), v[1]] for k, v in acc.items()}, f, indent=0)

    signal.signal(signal.SIGUSR1, dump)


if os.environ.get("TIMERS") and "serve" in sys.argv:
    os.makedirs(os.environ["TIMERS"], exist_ok=True)
    _install(os.environ["TIMERS"])
