"""What following a live heterograph costs a trainer (issue 42, hetero42), and that a
homogeneous graph's following batches cost what they did.

    KIND=hetero python benchmarks/live_hetero_follow.py   # or KIND=homo
    NODES=20000 BATCHES=20 BATCH=512 NEW=200 RUNS=1 OUT=/tmp/hetero42/bench ...

A graph of ``NODES`` (``academic``: papers, authors, institutions, fields; or
``community``) in 2 partitions (made once under ``OUT``), both served by store threads
of this process; a loader following the head (``head``: the head before every batch)
over ``BATCHES`` batches of ``BATCH`` target seeds (fanouts 10, 5; epochs as needed),
and between two batches a writer commits ``NEW`` new target nodes, each citing (with
an edge to) two base nodes of its type and, on the heterograph, written by a base
author: the next batches' sampling meets them as in-neighbours. Prints one JSON line
per run: the trainer thread's CPU (``time.thread_time``, this thread only: the servers
are other threads) in the loader's ``next`` per batch (median and total), the new
nodes the batches held, the bytes the client got by op (``live_nodes``: the new nodes'
types; ``live_nodes_calls``), and the CPU of the types' look-ups
(``types_cpu_s_total``: ``LiveNodeTypes.of``, asks included).
Runs with older code too (``PYTHONPATH=<old> python benchmarks/...`` from /tmp).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np

from graphrun.distributed import DistGraph, DistNodeDataLoader, initialize
from graphrun.distributed.writer import GraphWriter
from graphrun.graph.generate import GenParams, academic, community
from graphrun.partition import load_id_mapping, partition_graph
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.server import ServerConfig
from graphrun.testing.store import store_threads

KIND = os.environ.get("KIND", "hetero")
NODES = int(os.environ.get("NODES", "20000"))
BATCHES = int(os.environ.get("BATCHES", "20"))
BATCH = int(os.environ.get("BATCH", "512"))
NEW = int(os.environ.get("NEW", "200"))
RUNS = int(os.environ.get("RUNS", "1"))
OUT = Path(os.environ.get("OUT", "/tmp/hetero42/bench"))


def parts_dir() -> Path:
    path = OUT / f"{KIND}-{NODES}"
    if not (path / "parts").exists():
        params = GenParams(nodes=NODES, avg_degree=10, feat_dim=16, classes=4, seed=0)
        graph = academic(params) if KIND == "hetero" else community(params)
        partition_graph(graph, path / "parts", 2, "random", seed=0)
    return path / "parts"


def write(addresses: list[str], parts: Path, step: int) -> None:
    """``NEW`` new target nodes with edges to base nodes (original ids)."""
    with KVClient(ClientConfig(addresses, job="writer", timeout=60)) as c:
        book, orig = c.book, load_id_mapping(parts).orig_nids
        t = "paper" if KIND == "hetero" else "_N"
        rng = np.random.default_rng(step)
        new = 10**12 + step * NEW + np.arange(NEW)
        rows = {}
        for info in c.list_tensors():
            if info.name.startswith(f"node/{t}/"):
                name = info.name.rsplit("/", 1)[1]
                rows[name] = np.ones((NEW, *info.row_shape), info.dtype)
        w = GraphWriter(c)
        w.add_nodes(t, new, rows)
        base = book.to_homo(t, rng.integers(0, book.num_nodes_of(t), 2 * NEW))
        if KIND == "hetero":
            w.add_edges("cites", np.tile(new, 2), orig[base], orig=True)
            author = book.to_homo("author", rng.integers(0, book.num_nodes_of("author"), NEW))
            w.add_edges("writes", orig[author], new, orig=True)
        else:
            w.add_edges("_E", np.tile(new, 2), orig[base], orig=True)
        w.commit()


def timed_types() -> list[float]:
    """CPU seconds in each look-up of new nodes' types (code that has the table)."""
    from graphrun.distributed import live

    spent: list[float] = []
    table = getattr(live, "LiveNodeTypes", None)
    if table is not None:
        real = table.of

        def of(self: object, ids: np.ndarray) -> np.ndarray:
            t0 = time.thread_time()
            try:
                return real(self, ids)
            finally:
                spent.append(time.thread_time() - t0)

        table.of = of
    return spent


def run(addresses: list[str], parts: Path) -> dict[str, object]:
    types_cpu = timed_types()
    with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx, follow="head")
        calls = Counter()
        real = ctx.client.live_nodes

        def counted(*a: object, **k: object) -> object:
            calls["live_nodes"] += 1
            return real(*a, **k)

        ctx.client.live_nodes = counted  # type: ignore[method-assign]
        ntype = "paper" if KIND == "hetero" else None
        seeds = dg.mask_ids("train_mask", ntype)
        loader = DistNodeDataLoader(dg, seeds, [10, 5], ntype=ntype, batch_size=BATCH,
                                    shuffle=True)  # fmt: skip
        it = iter(loader)
        before = Counter(ctx.client.traffic)
        cpu, held = [], 0
        for step in range(BATCHES):
            write(addresses, parts, step)
            t0 = time.thread_time()
            b = next(it, None)
            if b is None:  # the epoch's seeds are done: the next epoch's
                it = iter(loader)
                b = next(it)
            cpu.append(time.thread_time() - t0)
            ids = b[ntype].n_id if ntype else b.n_id
            held += int((ids >= dg.num_nodes()).sum())
        by_op: Counter[str] = Counter()
        for (_, op), n in (Counter(ctx.client.traffic) - before).items():
            by_op[op] += n
        return {
            "kind": KIND, "nodes": NODES, "batches": BATCHES, "batch": BATCH, "new": NEW,
            "next_cpu_ms_median": round(1e3 * statistics.median(cpu), 2),
            "next_cpu_s_total": round(sum(cpu), 3), "new_nodes_in_batches": held,
            "types_cpu_s_total": round(sum(types_cpu), 4), "types_lookups": len(types_cpu),
            "live_nodes_calls": calls["live_nodes"], "bytes_by_op": dict(sorted(by_op.items())),
            "load": os.getloadavg()[0],
        }  # fmt: skip


def main() -> None:
    parts = parts_dir()
    for _ in range(RUNS):
        cfg = ServerConfig(parts, 0, extensions=("graphrun.sampling.server:register",))
        with store_threads(cfg, 2) as threads:
            print(json.dumps(run([t.address for t in threads], parts)), flush=True)


if __name__ == "__main__":
    main()
