"""``graphrun bench serve``: the inference endpoint's latency and throughput (prints JSON).

Generates a power-law graph (``community``; ``--dataset DIR`` takes a dataset instead),
partitions it (``--parts``), serves it with real ``graphrun serve`` processes on loopback
(a job key of their own), writes a checkpoint of the job's GraphSAGE (``--fanouts``;
untrained weights: a forward costs the same), starts a real ``graphrun infer serve``
process and drives it with a bounded load generator of this process (asyncio + httpx,
``C`` clients in a closed loop, each request one random node): per mode and concurrency
at most ``--requests`` requests or ``--seconds`` seconds, after a warm-up. Then
``graphrun infer embed`` times one whole-graph layer-wise pass, and the incremental
refresh (``--live``, 1,000 new random edges written by a writer key, ``--refresh``)
against a full pass at the new head (``--live`` again; ``refresh_max_abs_diff``: the
largest difference of their logits)::

    {"nodes", "edges", "parts", "fanouts",
     "runs": [{"mode", "concurrency", "requests", "errors", "p50_ms", "p99_ms",
               "requests_per_s"}],
     "full_pass_s", "refresh_s", "refresh_recomputed", "refresh_updated",
     "refresh_per_layer", "refresh_max_abs_diff"}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphrun.bench import check_at_least, int_list
from graphrun.errors import ArgumentError, GraphrunError

if TYPE_CHECKING:
    from graphrun.graph import Graph


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve", help="inference endpoint latency and throughput", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--nodes", type=int, default=200_000, help="generated nodes")
    p.add_argument("--degree", type=float, default=10.0, help="generated average degree")
    p.add_argument("--dataset", type=Path, help="a dataset directory instead of a generated graph")
    p.add_argument("--parts", type=int, default=2)
    p.add_argument("--fanouts", default="25,10")
    p.add_argument("--concurrency", default="1,8,64", help="clients in flight, per run")
    p.add_argument("--modes", default="sampled,full")
    p.add_argument("--requests", type=int, default=5000, help="requests per run at most")
    p.add_argument("--seconds", type=float, default=30.0, help="seconds per run at most")
    p.add_argument("--threads", type=int, default=1, help="the endpoint's torch threads")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    from graphrun.graph.format import META_FILE

    check_at_least(args, 1, "--requests", "--parts", "--threads")
    check_at_least(args, 0.1, "--seconds")
    check_at_least(args, 10, "--nodes")
    args.fanout_list = int_list("--fanouts", args.fanouts)
    args.concurrency_list = int_list("--concurrency", args.concurrency)
    if max(args.concurrency_list) > 1024:
        raise ArgumentError(f"--concurrency: at most 1024 clients, got {args.concurrency}")
    args.mode_list = [m for m in args.modes.split(",") if m]
    for m in args.mode_list:
        if m not in ("sampled", "full"):
            raise ArgumentError(f"--modes: {m!r} is not sampled or full")
    if args.dataset is not None and not (args.dataset / META_FILE).is_file():
        raise ArgumentError(f"--dataset: {args.dataset} is not a dataset directory")


def _graph(args: argparse.Namespace) -> Graph:
    from graphrun.graph import GenParams, community, load_dataset

    if args.dataset is not None:
        return load_dataset(args.dataset)
    return community(GenParams(nodes=args.nodes, avg_degree=args.degree, classes=8, feat_dim=32))


def _job(d: Path, graph: Any, args: argparse.Namespace) -> Path:
    """A job file and a checkpoint of its (untrained) GraphSAGE."""
    import torch
    import yaml

    from graphrun.train.checkpoint import Checkpoint, save_checkpoint
    from graphrun.train.models import SAGE

    spec = {
        "apiVersion": "graphrun.io/v1alpha1", "kind": "GraphJob", "metadata": {"name": "bench"},
        "spec": {
            "graph": {"dataset": "data"}, "partition": {"parts": args.parts, "output": "parts"},
            "runtime": {"machines": args.parts},
            "training": {"task": "node-classification", "fanouts": args.fanout_list,
                         "hidden": 128, "precision": "fp32"},
        },
    }  # fmt: skip
    path = d / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    x = graph.ndata[graph.node_types[0]]["feat"]
    classes = int(np.max(graph.ndata[graph.node_types[0]]["label"])) + 1
    torch.manual_seed(0)
    model = SAGE(int(x.shape[1]), 128, classes, len(args.fanout_list), 0.5, "csr", "fp32")
    save_checkpoint(d / "runs" / "bench" / "checkpoints", Checkpoint(0, model.state_dict(), {}))
    return path


async def _load(url: str, token: str, mode: str, clients: int, n: int, seconds: float,
                num_nodes: int) -> dict[str, Any]:  # fmt: skip
    import httpx

    rng = np.random.default_rng(clients)
    lat: list[float] = []
    errors = 0
    left = n
    deadline = time.perf_counter() + seconds
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]  # as curl: no wait for ACKs
    transport = httpx.AsyncHTTPTransport(limits=limits, socket_options=nodelay)
    async with httpx.AsyncClient(base_url=url, headers=headers, transport=transport,
                                 timeout=30) as c:  # fmt: skip

        async def one() -> None:
            nonlocal left, errors
            while left > 0 and time.perf_counter() < deadline:
                left -= 1
                node = int(rng.integers(num_nodes))
                ids = {"name": "node_ids", "shape": [1], "datatype": "INT64", "data": [node]}
                body = {"parameters": {"mode": mode}, "inputs": [ids]}
                t0 = time.perf_counter()
                r = await c.post("/v2/models/bench/infer", json=body)
                if r.status_code == 200:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(clients)))
        wall = time.perf_counter() - t0
    ms = np.asarray(lat) * 1000 if lat else np.asarray([np.nan])
    return {
        "mode": mode, "concurrency": clients, "requests": len(lat), "errors": errors,
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "requests_per_s": round(len(lat) / wall, 1),
    }  # fmt: skip


def _start(
    cmd: list[str], ready: Path, log: Path, timeout: float = 300.0
) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise GraphrunError(f"{' '.join(cmd[2:5])} did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)
    return proc


def run(args: argparse.Namespace) -> int:
    _check(args)
    from graphrun.graph import save_dataset
    from graphrun.local.stores import start_stores
    from graphrun.partition import partition_graph

    with tempfile.TemporaryDirectory(prefix="graphrun-bench-serve-") as tmp:
        d = Path(tmp)
        graph = _graph(args)
        save_dataset(graph, d / "data")
        partition_graph(graph, d / "parts", args.parts, "metis")
        job = _job(d, graph, args)
        quiet = subprocess.DEVNULL
        subprocess.run([sys.executable, "-m", "graphrun", "keygen", str(d / "store.key")],
                       check=True, stdout=quiet)  # fmt: skip
        subprocess.run([sys.executable, "-m", "graphrun", "keygen", str(d / "bench.key"), "--store",
                        str(d / "store.key"), "--clients", str(d / "clients")],
                       check=True, stdout=quiet)  # fmt: skip
        subprocess.run([sys.executable, "-m", "graphrun", "keygen", str(d / "writer.key"),
                        "--store", str(d / "store.key"), "--clients", str(d / "clients"),
                        "--grants", "write_graph"], check=True, stdout=quiet)  # fmt: skip
        token = "bench-" + "0" * 26
        (d / "token").write_text(token)
        with start_stores(d / "parts", args.parts, key_file=d / "store.key",
                          extra_args=["--clients", str(d / "clients")]) as stores:  # fmt: skip
            store_args = [a for s in stores for a in ("--store", s.address)]
            common = [str(job), *store_args, "--key-file", str(d / "bench.key")]
            cmd = [sys.executable, "-m", "graphrun", "infer", "serve", *common, "--port", "0",
                   "--ready-file", str(d / "ready.json"), "--token-file", str(d / "token"),
                   "--threads", str(args.threads), "--max-queue", "2048"]  # fmt: skip
            proc = _start(cmd, d / "ready.json", d / "endpoint.log")
            try:
                url = json.loads((d / "ready.json").read_text())["url"]
                runs = []
                n = graph.num_nodes
                for mode in args.mode_list:
                    asyncio.run(_load(url, token, mode, 4, 50, args.seconds, n))  # warm-up
                    for c in args.concurrency_list:
                        runs.append(asyncio.run(_load(url, token, mode, c, args.requests,
                                                      args.seconds, n)))  # fmt: skip
            finally:
                proc.terminate()
                proc.wait(30)
            embed = subprocess.run(
                [sys.executable, "-m", "graphrun", "infer", "embed", *common,
                 "--threads", str(args.threads)],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            full_pass_s = json.loads(embed.stdout.strip().splitlines()[-1])["full_pass_s"]
            fresh = _refresh(d, [*common, "--threads", str(args.threads)], graph)
    print(json.dumps({
        "nodes": graph.num_nodes, "edges": graph.num_edges, "parts": args.parts,
        "fanouts": args.fanout_list, "runs": runs, "full_pass_s": full_pass_s, **fresh,
    }))  # fmt: skip
    return 0


def _embed(args: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "graphrun", "infer", "embed", *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return got


def _refresh(d: Path, common: list[str], graph: Graph) -> dict[str, Any]:
    """The kept pass, 1,000 new edges, the refresh, and a full pass at the new head."""
    from graphrun.distributed.writer import GraphWriter
    from graphrun.partition import load_id_mapping
    from graphrun.rpc.auth import load_keys
    from graphrun.serving.refresh import States
    from graphrun.store.client import ClientConfig, KVClient

    stores = [common[i + 1] for i, a in enumerate(common) if a == "--store"]
    n, ntype, etype = graph.num_nodes, graph.node_types[0], graph.edge_types[0]
    _embed([*common, "--live"])
    rng = np.random.default_rng(0)
    orig = load_id_mapping(d / "parts").orig_nids
    with KVClient(ClientConfig(stores, job="writer", keys=load_keys(d / "writer.key"))) as c:
        w = GraphWriter(c)
        w.add_edges(etype, orig[rng.integers(0, n, 1000)], orig[rng.integers(0, n, 1000)],
                    orig=True)  # fmt: skip
        w.commit()
    got = _embed([*common, "--refresh"])
    ids = np.arange(n, dtype=np.int64)
    with KVClient(ClientConfig(stores, job="bench", keys=load_keys(d / "bench.key"))) as c:
        st = States(c, ntype)
        st.load()
        fresh = st.read("logits", ids)
        _embed([*common, "--live"])
        whole = st.read("logits", ids)
    return {"refresh_s": got["refresh_s"], "refresh_recomputed": got["recomputed"],
            "refresh_updated": got["updated"], "refresh_per_layer": got["per_layer"],
            "refresh_max_abs_diff": float((fresh - whole).abs().max())}  # fmt: skip
