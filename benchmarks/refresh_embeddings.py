"""An embedding refresh after 1,000 new edges against a full pass (issue 43, item 4).

    graphrun generate community /tmp/rf/pl200k --nodes 200000 --avg-degree 40 \\
        --exponent 2.1 --feat-dim 100 --classes 47
    graphrun partition /tmp/rf/pl200k /tmp/rf/parts --parts 2 --method random
    python benchmarks/refresh_embeddings.py /tmp/rf/parts

Two store servers (processes), a randomly initialised two-layer GraphSAGE (128 hidden,
fp32, seed 0): a kept full pass at version 0, 1,000 random new edges in one write, the
refresh to the head, a full pass at the head; prints JSON (benchmarks/README.md): wall
seconds and CPU seconds (this process and the two store servers, whatever else the box
runs) of each, with the load average.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphrun.distributed import DistGraph, initialize
from graphrun.distributed.writer import GraphWriter
from graphrun.local.stores import start_stores
from graphrun.partition import load_id_mapping
from graphrun.serving.refresh import States, full, refresh
from graphrun.store.client import ClientConfig, KVClient
from graphrun.train.distdata import DistGraphData
from graphrun.train.models import SAGE


def cpu_s(pids: list[int]) -> float:
    """CPU seconds so far of this process and of the processes ``pids``."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    t = r.ru_utime + r.ru_stime
    for pid in pids:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        t += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return t


def timed(pids: list[int], fn: Callable[..., Any], *args: Any) -> tuple[Any, float, float]:
    """``fn(*args)``, its wall seconds and the CPU seconds of :func:`cpu_s`."""
    t0, c0 = time.perf_counter(), cpu_s(pids)
    got = fn(*args)
    return got, round(time.perf_counter() - t0, 3), round(cpu_s(pids) - c0, 3)


def main(parts: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = SAGE(100, 128, 47, 2, 0.5, "csr", "fp32").eval()
    with start_stores(parts, 2, extensions=["graphrun.sampling.server:register"]) as stores:
        addrs = [s.address for s in stores]
        pids = [s.pid for s in stores]
        with initialize(addrs, job="emb", heartbeat_interval=0, timeout=600) as ctx:
            data = DistGraphData(DistGraph(ctx), 0, 1)
            n = data.num_nodes("_N")
            full(model, data, "_N", "feat", 8192)
            rng = np.random.default_rng(1)
            orig = load_id_mapping(parts).orig_nids
            with KVClient(ClientConfig(addrs, job="writer", timeout=60)) as c:
                w = GraphWriter(c)
                src, dst = rng.integers(0, n, 1000), rng.integers(0, n, 1000)
                w.add_edges("_E", orig[src], orig[dst], orig=True)
                w.commit()
            got, refresh_s, refresh_cpu = timed(pids, refresh, model, data, "_N", "feat", 8192)
            ids = np.arange(n, dtype=np.int64)
            st = States(ctx.client, "_N")
            st.load()
            fresh = st.read("logits", ids)
            _, full_s, full_cpu = timed(pids, full, model, data, "_N", "feat", 8192)
            whole = st.read("logits", ids)
    print(json.dumps({
        "nodes": n, "full_pass_s": full_s, "full_pass_cpu_s": full_cpu,
        "refresh_s": refresh_s, "refresh_cpu_s": refresh_cpu, "per_layer": got["per_layer"],
        "recomputed_per_layer": got["recomputed_per_layer"], "updated": got["updated"],
        "find_s": got["find_s"], "layer_s": got["layer_s"],
        "refresh_max_abs_diff": float((fresh - whole).abs().max()),
        "load_avg": [round(x, 1) for x in os.getloadavg()],
    }))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
