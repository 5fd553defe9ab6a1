"""An embedding refresh after 1,000 new edges against a full pass (issue 43, item 4).

    graphrun generate community /tmp/rf/pl200k --nodes 200000 --avg-degree 40 \\
        --exponent 2.1 --feat-dim 100 --classes 47
    graphrun partition /tmp/rf/pl200k /tmp/rf/parts --parts 2 --method random
    python benchmarks/refresh_embeddings.py /tmp/rf/parts [ROUNDS]

Two store servers (processes), a randomly initialised two-layer GraphSAGE (128 hidden,
fp32, seed 0; the input and output widths from the graph's feature and labels): the
plain whole-graph pass (``graphrun infer embed``'s, as ``graphrun bench serve`` times
it), a kept pass at the head, then ``ROUNDS`` (3) times 1,000 random new edges in one
write and a refresh to the head in a process of its own (as ``graphrun infer embed
--refresh`` runs it: every mapping and lazy import is its own), ``ROUNDS`` times more
in this process (``in_process``: a refresh called again, its tables attached again),
``ROUNDS`` times more by the loop of ``graphrun infer embed --follow`` in a thread of
this process (``following``: a refresher that stays up, tables attached and mapped
once; its CPU is the process's, ``cpu_s``), last a kept pass at the head to compare the
logits with. Prints JSON (benchmarks/README.md): wall seconds, this
process's (or the refresh process's) CPU seconds (``time.thread_time``) and the store
servers' of each, the refresh's share of the plain pass, with the load average.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from graphrun.distributed import DistGraph, initialize
from graphrun.distributed.writer import GraphWriter
from graphrun.local.stores import start_stores
from graphrun.partition import load_id_mapping
from graphrun.serving.embed import embed
from graphrun.serving.follow import follow
from graphrun.serving.refresh import States, full, refresh
from graphrun.store.client import ClientConfig, KVClient
from graphrun.train.distdata import DistGraphData
from graphrun.train.models import SAGE


def server_cpu_s(pids: list[int]) -> float:
    t = 0.0
    for pid in pids:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        t += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return t


def model_for(data: DistGraphData) -> SAGE:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    width = data.feature_dim("_N", "feat") or 1
    classes = int(data.node_table("_N", "label")[torch.arange(data.num_nodes("_N"))].max()) + 1
    return SAGE(width, 128, classes, 2, 0.5, "csr", "fp32").eval()


def one_refresh(addrs: list[str]) -> None:
    """The refresh process: join, refresh, print what it took."""
    with initialize(addrs, job="emb", timeout=600) as ctx:
        data = DistGraphData(DistGraph(ctx), 0, 1)
        model = model_for(data)
        t0, c0 = time.perf_counter(), time.thread_time()
        got = refresh(model, data, "_N", "feat", 8192)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    print(json.dumps({"refresh_s": round(wall, 4), "refresh_cpu_s": round(cpu, 4), **got}))


def write(addrs: list[str], rng: np.random.Generator, orig: np.ndarray, n: int) -> None:
    with KVClient(ClientConfig(addrs, job="writer", timeout=60)) as c:
        w = GraphWriter(c)
        src, dst = rng.integers(0, n, 1000), rng.integers(0, n, 1000)
        w.add_edges("_E", orig[src], orig[dst], orig=True)
        w.commit()


def follow_rounds(addrs: list[str], pids: list[int], model: SAGE, data: DistGraphData,
                  rng: np.random.Generator, orig: np.ndarray, n: int, rounds: int,
                  plain: dict[str, float]) -> list[dict[str, object]]:  # fmt: skip
    """``rounds`` writes, each refreshed by the loop of ``--follow`` (a thread here)."""
    got: queue.Queue[dict[str, object]] = queue.Queue()
    stop = threading.Event()
    loop = threading.Thread(target=follow, args=(model, data, "_N", "feat", 8192),
                            kwargs={"live": False, "poll_s": 0.01, "stop": stop,
                                    "report": got.put})  # fmt: skip
    loop.start()
    out = []
    try:
        got.get(timeout=600)  # its first refresh: nothing written since
        time.sleep(1.0)  # its tables mapped
        for _ in range(rounds):
            write(addrs, rng, orig, n)
            load, s0 = os.getloadavg()[0], server_cpu_s(pids)
            r = got.get(timeout=600)
            out.append({
                **{k: r[k] for k in ("refresh_s", "cpu_s", "per_layer", "updated", "find_s",
                                     "layer_s")},
                "server_cpu_s": round(server_cpu_s(pids) - s0, 3),
                "wall_share": round(float(r["refresh_s"]) / plain["full_pass_s"], 4),
                "cpu_share": round(float(r["cpu_s"]) / plain["full_pass_cpu_s"], 4),
                "load_avg": round(load, 1),
            })  # fmt: skip
    finally:
        stop.set()
        loop.join(60)
    return out


def main(parts: str, rounds: int) -> None:
    with start_stores(parts, 2, extensions=["graphrun.sampling.server:register"]) as stores:
        addrs, pids = [s.address for s in stores], [s.pid for s in stores]
        with initialize(addrs, job="emb", timeout=600) as ctx:
            data = DistGraphData(DistGraph(ctx), 0, 1)
            model = model_for(data)
            n = data.num_nodes("_N")
            t0, c0, s0 = time.perf_counter(), time.thread_time(), server_cpu_s(pids)
            embed(model, data, "_N", "feat", 8192)
            plain = {"full_pass_s": round(time.perf_counter() - t0, 3),
                     "full_pass_cpu_s": round(time.thread_time() - c0, 3),
                     "full_pass_server_cpu_s": round(server_cpu_s(pids) - s0, 3)}  # fmt: skip
            full(model, data, "_N", "feat", 8192)
            rng = np.random.default_rng(1)
            orig = load_id_mapping(parts).orig_nids
            runs, warm = [], []
            for r in range(2 * rounds):
                with KVClient(ClientConfig(addrs, job="writer", timeout=60)) as c:
                    w = GraphWriter(c)
                    src, dst = rng.integers(0, n, 1000), rng.integers(0, n, 1000)
                    w.add_edges("_E", orig[src], orig[dst], orig=True)
                    w.commit()
                load, s0 = os.getloadavg()[0], server_cpu_s(pids)
                if r >= rounds:  # in this process: what a refresher that stays up pays
                    t0, c0 = time.perf_counter(), time.thread_time()
                    got = refresh(model, data, "_N", "feat", 8192)
                    got["refresh_s"] = round(time.perf_counter() - t0, 4)
                    got["refresh_cpu_s"] = round(time.thread_time() - c0, 4)
                else:
                    cmd = [sys.executable, __file__, "--refresh", json.dumps(addrs)]
                    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
                    got = json.loads(out.stdout.strip().splitlines()[-1])
                (warm if r >= rounds else runs).append({
                    **{k: got[k] for k in ("refresh_s", "refresh_cpu_s", "per_layer",
                                           "recomputed_per_layer", "updated", "find_s",
                                           "layer_s")},
                    "server_cpu_s": round(server_cpu_s(pids) - s0, 3),  # with its join
                    "wall_share": round(got["refresh_s"] / plain["full_pass_s"], 4),
                    "cpu_share": round(got["refresh_cpu_s"] / plain["full_pass_cpu_s"], 4),
                    "load_avg": round(load, 1),
                })  # fmt: skip
            following = follow_rounds(addrs, pids, model, data, rng, orig, n, rounds, plain)
            ids = np.arange(n, dtype=np.int64)
            st = States(ctx.client, "_N")
            st.load()
            fresh = st.read("logits", ids)
            full(model, data, "_N", "feat", 8192)
            whole = st.read("logits", ids)
    print(json.dumps({
        "nodes": n, **plain, "refreshes": runs, "in_process": warm, "following": following,
        "refresh_max_abs_diff": float((fresh - whole).abs().max()),
        "load_avg": [round(x, 1) for x in os.getloadavg()],
    }))  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1] == "--refresh":
        one_refresh(json.loads(sys.argv[2]))
    else:
        main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
