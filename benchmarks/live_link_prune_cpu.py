"""CPU time of a link loader's check of its positives at an epoch's start on a followed
live graph (issue 42, stop 64): the positives deleted at the epoch's version leave it,
found by one ``graph_find_edges`` with ``missing`` over every positive.

    PARTS=/work/data/pl200k-parts python benchmarks/live_link_prune_cpu.py
    POSITIVES=4000000 DELETED=1000 ...      # the defaults: a trainer's half of 8M edges

Two store server processes (``graphrun serve`` with the sampling extension, no log) on
``PARTS``; a client following the graph at each epoch; a ``GraphWriter`` deletes
``DELETED`` random edges among the positives (every ``num_edges // POSITIVES``-th edge
id: both partitions' edges); then the loader's check, run ``REPEAT`` times (the
version taken as moved each time; the first includes each server's one sort of its
edge ids, made at its first ``graph_find_edges``). Prints JSON: per check, the
client thread's CPU ms (``time.thread_time``), each server's CPU ms (``/proc/PID/stat``,
user + system, every thread), the wall ms, the positives kept, and the load average.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

PARTS = Path(os.environ.get("PARTS", "/work/data/pl200k-parts"))
POSITIVES = int(os.environ.get("POSITIVES", "4000000"))
DELETED = int(os.environ.get("DELETED", "1000"))
REPEAT = int(os.environ.get("REPEAT", "5"))
SAMPLING = ("graphrun.sampling.server:register",)


def cpu_ms(pid: int) -> float:
    """A process's CPU so far (user + system, all its threads), in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return 1000 * (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    import torch

    from graphrun.distributed import DistGraph, DistLinkDataLoader, initialize
    from graphrun.distributed.writer import GraphWriter
    from graphrun.local.stores import start_store
    from graphrun.store.client import ClientConfig, KVClient

    stores = [start_store(PARTS, p, extensions=SAMPLING) for p in (0, 1)]
    try:
        addresses = [s.address for s in stores]
        with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
            dg = DistGraph(ctx, follow="epoch")
            step = max(dg.book.num_edges // POSITIVES, 1)  # spread over both partitions
            positives = np.arange(POSITIVES) * step
            gone = np.random.default_rng(0).choice(positives, DELETED, replace=False)
            with KVClient(ClientConfig(addresses, job="writer", timeout=60)) as c:
                w = GraphWriter(c)
                w.delete_edges("_E", gone)
                w.commit()
            loader = DistLinkDataLoader(dg, positives, [2], batch_size=1024)
            dg.refresh("epoch")
            out: dict[str, object] = {"positives": POSITIVES, "deleted": DELETED}
            runs = []
            for _ in range(REPEAT):
                loader.ids, loader._checked_at = torch.from_numpy(positives), None
                pids = [s.pid for s in stores]
                before = [cpu_ms(pid) for pid in pids]
                t, wall = time.thread_time(), time.perf_counter()
                loader._leave_deleted()
                spent = [round(cpu_ms(p) - b, 1) for p, b in zip(pids, before, strict=True)]
                runs.append({
                    "client_ms": round(1000 * (time.thread_time() - t), 1),
                    "servers_ms": spent,
                    "wall_ms": round(1000 * (time.perf_counter() - wall), 1),
                })  # fmt: skip
            out["kept"] = int(loader.ids.numel())
            out["runs"] = runs
            out["load_avg"] = os.getloadavg()
            print(json.dumps(out))
    finally:
        for s in stores:
            s.stop()


if __name__ == "__main__":
    main()
