"""The CPU of a co-located client's pull loop after a compaction (issue 42, stop 62: a
compacted partition's untouched base rows read from shared memory, graphrun/store/
live_stale.py): two ``graphrun serve`` with CURVE keys on this machine, ``UPDATES``
base rows of partition 0 updated in ``BATCHES`` commits and compacted on both
partitions, then ``PULLS`` pulls of ``IDS`` random base node ids (following the head)
after ``WARMUP`` unmeasured ones. Prints one JSON line: the client's CPU over the loop
(this process: user + system, its ZeroMQ threads included), each server's CPU
(``/proc/PID/stat``), the requests each served (``pull``, ``live_stale``) and the load.

    PYTHONPATH=<code> python benchmarks/live_colo_pull_cpu.py
    NODES=200000 EDGES=1000000 IDS=20000 PULLS=20 WARMUP=2 UPDATES=2000 BATCHES=4 ...

Run from outside a checkout (``python -m`` and scripts put their own directory first
on sys.path: copy the script to /tmp), old and new code in turns (benchmarks/README.md,
"colo62").
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from graphrun.distributed.writer import GraphWriter
from graphrun.local.stores import start_stores
from graphrun.rpc.auth import generate_keys
from graphrun.store.client import ClientConfig, KVClient
from graphrun.testing.store import make_partition_dir

FEAT = "node/_N/feat"


def env(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="colo62-"))
    parts = make_partition_dir(tmp / "parts", 2, num_nodes=env("NODES", 200_000),
                               num_edges=env("EDGES", 1_000_000))[1]  # fmt: skip
    key_file = tmp / "job.key"
    keys = generate_keys(key_file)
    rng = np.random.default_rng(0)
    with start_stores(parts, 2, key_file=key_file, log_dir=tmp) as procs:
        c = KVClient(ClientConfig([p.address for p in procs], keys=keys, timeout=60))
        try:
            n0 = int(c.book.node_offsets[1])  # partition 0's base nodes: [0, n0)
            w = GraphWriter(c)
            updated = rng.choice(n0, env("UPDATES", 2000), replace=False)
            for chunk in np.array_split(updated, env("BATCHES", 4)):
                w.update_features("_N", "feat", chunk, np.full((len(chunk), 8), -1, np.float32))
                w.commit()
            c.follow()
            for p in (0, 1):
                c.session.call(p, "live_compact", {"start": True}, main_only=True)
                while c.session.call(p, "live_compact", {}, main_only=True).body["running"]:
                    time.sleep(0.05)
            ids = [rng.integers(0, c.book.num_nodes, env("IDS", 20_000)) for _ in range(4)]
            for i in range(env("WARMUP", 2)):
                c.pull(FEAT, ids[i % 4])
            served = [c.stats(p)["served"] for p in (0, 1)]
            before = own_cpu_s(), [cpu_s(p.pid) for p in procs], time.perf_counter()
            for i in range(env("PULLS", 20)):
                c.pull(FEAT, ids[i % 4])
            after = own_cpu_s(), [cpu_s(p.pid) for p in procs], time.perf_counter()
            now = [c.stats(p)["served"] for p in (0, 1)]
            print(json.dumps({
                "client_cpu_s": round(after[0] - before[0], 3),
                "servers_cpu_s": [round(a - b, 3) for a, b in zip(after[1], before[1], strict=True)],
                "wall_s": round(after[2] - before[2], 3),
                "pulls_served": [n.get("pull", 0) - s.get("pull", 0) for n, s in zip(now, served, strict=True)],
                "live_stale_served": [n.get("live_stale", 0) for n in now],
                "shm_bytes": int(sum(v for (p, op), v in c.traffic.items() if op == "pull:shm")),
                "load": os.getloadavg()[0],
            }))  # fmt: skip
        finally:
            c.close()


if __name__ == "__main__":
    main()
