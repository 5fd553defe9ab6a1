"""Where a refresh's time goes: each stage's wall and CPU seconds (issue 43, item 4).

    graphrun partition /work/data/pl200k /tmp/rs/parts --parts 2      # METIS, as bench serve
    python benchmarks/refresh_stages.py /tmp/rs/parts [ROUNDS]

Two CURVE-keyed ``graphrun serve`` processes (a store key, a job key ``bench`` and a
writer key, as ``graphrun bench serve`` makes them), a randomly initialised two-layer
GraphSAGE (:func:`refresh_embeddings.model_for`), a kept pass, the tables attached and
the kernels loaded as ``--follow`` does (:meth:`States.warm`), then ``ROUNDS`` (11)
times 1,000 random new edges and a refresh to the head. Each stage of
:mod:`graphrun.serving.refresh` is wrapped to add up its wall and thread CPU seconds;
the first refresh is left out (``moves.send`` and the wait for its answers are timed
where the sums move on their servers). Prints, per refresh (means, ms): the refresh's
wall and CPU, the two servers' CPU, each stage's calls, wall and CPU, and the bytes of
the requests' tensors by op (benchmarks/README.md).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

import graphrun.serving.refresh as R
from graphrun.distributed import DistGraph, initialize
from graphrun.distributed.writer import GraphWriter
from graphrun.local.stores import start_store
from graphrun.partition import load_id_mapping
from graphrun.rpc.auth import load_keys
from graphrun.store.client import ClientConfig, KVClient
from graphrun.train.distdata import DistGraphData

sys.path.insert(0, str(Path(__file__).parent))
from refresh_embeddings import model_for, server_cpu_s

STAGES = ("affected", "_ask", "_out_edges", "_first", "_last", "_rows", "move", "last_layer")
METHODS = ("load", "begin", "read", "flush", "save")
PLAN = ("ask", "out_edges")  # graphrun.serving.plan's, where refresh.py has one
took: collections.defaultdict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
sent: collections.Counter[str] = collections.Counter()


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        w, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            t = took[name]
            t[0] += time.perf_counter() - w
            t[1] += time.thread_time() - c
            t[2] += 1

    return wrapper


def count_bytes(session: Any) -> None:
    """Add up the bytes of the tensors each op's requests carry (``sent``)."""
    real = session.request

    def request(part: int, op: str, body: Any = None, tensors: Any = (), **kw: Any) -> Any:
        sent[op] += sum(np.asarray(t).nbytes for t in tensors)
        return real(part, op, body, tensors, **kw)

    session.request = request


def keys(d: Path) -> None:
    keygen = [sys.executable, "-m", "graphrun", "keygen"]
    subprocess.run([*keygen, str(d / "store.key")], check=True, stdout=subprocess.DEVNULL)
    for name, grants in (("bench", []), ("writer", ["--grants", "write_graph"])):
        cmd = [*keygen, str(d / f"{name}.key"), "--store", str(d / "store.key"),
               "--clients", str(d / "clients"), *grants]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def write(d: Path, addrs: list[str], rng: np.random.Generator, orig: np.ndarray, n: int) -> None:
    cfg = ClientConfig(addrs, job="writer", keys=load_keys(d / "writer.key"), timeout=60)
    with KVClient(cfg) as c:
        w = GraphWriter(c)
        w.add_edges("_E", orig[rng.integers(0, n, 1000)], orig[rng.integers(0, n, 1000)],
                    orig=True)  # fmt: skip
        w.commit()


def main(parts: str, rounds: int) -> None:
    for name in STAGES:
        if hasattr(R, name):  # an earlier refresh.py lacks some
            setattr(R, name, timed(name, getattr(R, name)))
    for name in METHODS:
        setattr(R.States, name, timed(f"States.{name}", getattr(R.States, name)))
    plan = sys.modules.get("graphrun.serving.plan")
    if plan is not None:  # out_edges sends, Plan.finish waits for the answers
        for name in PLAN:
            setattr(plan, name, timed(f"plan.{name}", getattr(plan, name)))
        plan.Plan.finish = timed("Plan.finish", plan.Plan.finish)
    if hasattr(R, "moves"):  # the sums moved on their servers: sending, then the answers
        send = R.moves.send
        R.moves.send = timed("moves.send", lambda *a: timed("moves.wait", send(*a)))
    with tempfile.TemporaryDirectory(prefix="refresh-stages-") as tmp, ExitStack() as stack:
        d = Path(tmp)
        keys(d)
        stores = []
        for p in range(2):
            sp = start_store(parts, p, key_file=d / "store.key",
                             extra_args=["--clients", str(d / "clients")])  # fmt: skip
            stack.callback(sp.stop)
            stores.append(sp)
        addrs, pids = [s.address for s in stores], [s.pid for s in stores]
        with initialize(addrs, job="bench", keys=load_keys(d / "bench.key"), timeout=600) as ctx:
            data = DistGraphData(DistGraph(ctx), 0, 1)
            model = model_for(data)
            n = data.num_nodes("_N")
            R.full(model, data, "_N", "feat", 8192)
            count_bytes(ctx.client.session)
            st = R.States(ctx.client, "_N")
            st.load()
            st.warm(data.node_table("_N", "feat"), len(model.convs), R.by_sums(model))
            rng, orig = np.random.default_rng(0), load_id_mapping(parts).orig_nids
            total = np.zeros(3)
            for r in range(rounds):
                write(d, addrs, rng, orig, n)
                head = int(ctx.client.follow())
                if r == 1:  # the first refresh is left out
                    took.clear()
                    sent.clear()
                    total[:] = 0
                w, c, s = time.perf_counter(), time.thread_time(), server_cpu_s(pids)
                R.refresh(model, data, "_N", "feat", 8192, head, st)
                total += [time.perf_counter() - w, time.thread_time() - c, server_cpu_s(pids) - s]
    k = 1e3 / (rounds - 1)
    print(f"load {os.getloadavg()[0]:.1f}: refresh wall {total[0] * k:.1f} ms, CPU "
          f"{total[1] * k:.1f} ms, servers' CPU {total[2] * k:.1f} ms")  # fmt: skip
    for name, (w, c, m) in sorted(took.items(), key=lambda x: -x[1][0]):
        print(f"  {name:16s} x{m / (rounds - 1):4.1f}  wall {w * k:7.2f}  CPU {c * k:7.2f}")
    print("  sent a refresh (MB): " + ", ".join(
        f"{op} {b / 1e6 / (rounds - 1):.2f}" for op, b in sent.most_common()))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 11)
