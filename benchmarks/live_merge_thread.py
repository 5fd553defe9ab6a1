"""The delta's merging thread alone (issue 42, merge63): a ``LiveDelta(background=True)``
fed ``N`` commits of ``E`` new edges between random base nodes (destinations among 100k
rows, edge ids growing), one every ``P`` s as a paced ingest's partition gets them, in a
process tuned as ``graphrun serve`` is (``keep_large_allocations``,
``small_pages_for_arrays``; ``TUNE=0``: neither). The thread's CPU is read from
``/proc/self/task/TID/schedstat`` (nanoseconds: the 10 ms ticks of ``stat`` that
``live_ingest_cpu.py`` reads charge ~18 ticks to the thread over 150 batches, too coarse
to tell 15% apart).

    python benchmarks/live_merge_thread.py        # N=150 E=5000 P=0.1

Prints JSON: the merging thread's CPU ms and minor faults a commit, the runs left, the
index entries written a commit (``LiveDelta.work``), the index's and the kept batches'
MB, the process's peak resident MB.
"""

import json
import os
import threading
import time
from pathlib import Path

import numpy as np

from graphrun.rpc.tuning import keep_large_allocations, small_pages_for_arrays
from graphrun.store.live import LiveDelta
from graphrun.store.live_index import Batch

N, E = int(os.environ.get("N", "150")), int(os.environ.get("E", "5000"))
P = float(os.environ.get("P", "0.1"))
BASE_NODES, BASE_EDGES = 100_000, 8_000_000


def thread_cpu_faults(tid: int) -> tuple[int, int]:
    """(ns on the CPU, minor faults) of one thread of this process."""
    ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return ns, int(fields[7])


def commits(rng: np.random.Generator):
    for v in range(1, N + 1):
        e = np.empty((3, E), np.int64)
        e[0], e[1] = rng.integers(0, 2 * BASE_NODES, E), rng.integers(0, BASE_NODES, E)
        e[2] = np.arange(BASE_EDGES + (v - 1) * E, BASE_EDGES + v * E)
        none = np.empty(0, np.int64)
        yield Batch(v, none, none.astype(np.int32), none, e, np.zeros(E, np.int32), none, {}, {})


def main() -> None:
    if os.environ.get("TUNE", "1") == "1":
        keep_large_allocations()
        small_pages_for_arrays()
    delta = LiveDelta(background=True)
    delta.warm(wait=True)
    assert delta._merger is not None
    tid = delta._merger.native_id
    assert tid is not None and tid != threading.get_native_id()
    cpu0, faults0 = thread_cpu_faults(tid)
    for batch in commits(np.random.default_rng(0)):
        delta.hold(batch, 0.0)
        delta.commit(batch.version)
        time.sleep(P)
    while delta._fresh:
        time.sleep(0.05)
    time.sleep(0.5)  # the last merges
    cpu1, faults1 = thread_cpu_faults(tid)
    runs = delta._runs
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    print(json.dumps({
        "merge_ms_per_commit": round((cpu1 - cpu0) / 1e6 / N, 3),
        "merge_faults_per_commit": round((faults1 - faults0) / N, 1),
        "runs": len(runs),
        "work_per_commit": delta.work // N,
        "index_mb": round(sum(r.edges.nbytes + r.nodes.nbytes for r in runs) / 2**20, 1),
        "batches_mb": round(sum(b.nbytes for b in delta.committed.values()) / 2**20, 1),
        "peak_rss_mb": round(int(status["VmHWM"].split()[0]) / 1024, 1),
    }))  # fmt: skip
    delta.close()


if __name__ == "__main__":
    main()
