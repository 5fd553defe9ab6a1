"""The write-ahead log's group commit alone (issue 42, the log): the wall and system
CPU time of each ``WriteAheadLog.sync`` of a group, on the disk of ``DIR``.

    python benchmarks/wal_sync.py            # GROUPS=300 RECORD=140000 PER=1 DIR=/tmp
    PYTHONPATH=<archive of older code> ...   # the same on another WriteAheadLog

``GROUPS`` syncs of ``PER`` records of ``RECORD`` bytes each (140 KB: a 5k-edge piece's
record) into a new log, after 20 warm-up groups; prints JSON: the wall ms of a sync
(p50, p90, p99, mean) and its system CPU ms (``RUSAGE_THREAD``) over the syncs that
wrote no extent of zeros, the wall ms of those that did (an in-place log's growth), the
file's size and the load average (benchmarks/README.md).
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time

import numpy as np

from graphrun.store.wal import WriteAheadLog

GROUPS = int(os.environ.get("GROUPS", "300"))
RECORD = int(os.environ.get("RECORD", "140000"))
PER = int(os.environ.get("PER", "1"))


def main() -> None:
    data = os.urandom(RECORD)
    wall, sys_cpu, grew = [], [], []
    with tempfile.TemporaryDirectory(dir=os.environ.get("DIR", "/tmp")) as tmp:
        path = os.path.join(tmp, "bench.wal")
        with WriteAheadLog(path) as wal:
            for g in range(20 + GROUPS):
                for k in range(PER):
                    wal.append(g * PER + k, data)
                size = os.path.getsize(path)
                r0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
                wal.sync()
                t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD)
                if os.path.getsize(path) > size + PER * (RECORD + 64):  # an extent of zeros
                    grew.append((t1 - t0) * 1e3)
                elif g >= 20:
                    wall.append((t1 - t0) * 1e3)
                    sys_cpu.append((r1.ru_stime - r0.ru_stime) * 1e3)
            size = os.path.getsize(path)
    w = np.asarray(wall)
    print(json.dumps({
        "sync_ms_p50": round(float(np.percentile(w, 50)), 3),
        "sync_ms_p90": round(float(np.percentile(w, 90)), 3),
        "sync_ms_p99": round(float(np.percentile(w, 99)), 3),
        "sync_ms_mean": round(float(w.mean()), 3),
        "sync_sys_ms_mean": round(float(np.mean(sys_cpu)), 3),
        "syncs_that_grew_an_extent": len(grew),
        "their_ms": [round(x, 1) for x in grew],
        "file_bytes": size,
        "load": [round(x, 2) for x in os.getloadavg()],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
