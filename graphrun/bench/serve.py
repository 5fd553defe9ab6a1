"""``graphrun bench serve``: the inference endpoint's latency and throughput (prints JSON).

Generates a power-law graph (``community``; ``--dataset DIR`` takes a dataset instead),
partitions it (``--parts``), serves it with real ``graphrun serve`` processes (a job key
of their own), writes a checkpoint of the job's GraphSAGE (``--fanouts``; untrained
weights: a forward costs the same) and times ``graphrun infer embed``'s whole-graph
layer-wise pass (``full_pass_s``; its rows answer ``precomputed`` requests; the passes
run in the measuring process: one torch import, not four processes' of 4 CPU-s). Then a real
``graphrun infer serve`` process is driven by a bounded closed-loop load generator on
loopback (:mod:`graphrun.bench.httpload`: ``C`` kept-alive connections, each request one
random node): per mode (``--modes``: ``sampled``, ``full``, ``precomputed``) and
concurrency at most ``--requests`` requests or ``--seconds`` seconds, after a warm-up.

``--hosts local``: everything on this host's loopback (the endpoint reads co-located
partitions from shared memory). ``--hosts netns`` (root): two network-namespace hosts,
the store's servers on ``m1`` and the endpoint with the load generator on ``m0``
(:mod:`graphrun.local.netns`), so every sample and feature pull crosses the hosts' link.

Every run also says what it cost: ``server_cpu_s`` (the endpoint process's CPU seconds),
``client_cpu_s`` (the generator's), ``requests_per_server_cpu_s``, and ``load_avg`` (the
box's 1-minute load average at its end): on a shared box the latencies are indicative,
the CPU per request is not. Last, the incremental refresh (``--live``, 1,000 new random
edges written by a writer key, ``--refresh``) against a full pass at the new head
(``--live`` again; ``refresh_max_abs_diff``: the largest difference of their logits).
A refresher that stays up makes ``--refreshes`` of them, each after 1,000 new edges:
``refresh_s`` is their median and ``refreshes_s`` every one (one refresh of ~30 ms moves
with the load by more than the percent it is measured against)::

    {"nodes", "edges", "parts", "fanouts", "hosts", "window_ms", "load_avg",
     "runs": [{"mode", "concurrency", "requests", "errors", "p50_ms", "p99_ms",
               "requests_per_s", "server_cpu_s", "client_cpu_s",
               "requests_per_server_cpu_s", "load_avg"}],
     "full_pass_s", "refresh_s", "refreshes_s", "refresh_cpu_s", "refresh_own_process_s",
     "refresh_recomputed", "refresh_updated", "refresh_per_layer", "refresh_max_abs_diff"}
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

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
    p.add_argument("--modes", default="sampled,full", help="of sampled, full, precomputed")
    p.add_argument("--requests", type=int, default=5000, help="requests per run at most")
    p.add_argument("--seconds", type=float, default=30.0, help="seconds per run at most")
    p.add_argument("--threads", type=int, default=1, help="the endpoint's torch threads")
    p.add_argument(
        "--refreshes",
        type=int,
        default=5,
        help="refreshes timed, each after 1,000 new edges (the median is refresh_s)",
    )
    p.add_argument("--window-ms", type=float, default=2.0, help="the endpoint's --window-ms")
    p.add_argument("--hosts", choices=("local", "netns"), default="local",
                   help="netns: the store on one network-namespace host, the endpoint and "
                   "the load generator on another (root)")  # fmt: skip
    p.add_argument("--drive", type=Path, help=argparse.SUPPRESS)  # the netns host's half
    p.set_defaults(func=run)


MODES = ("sampled", "full", "precomputed")
MAX_REFRESHES = 100


def _check(args: argparse.Namespace) -> None:
    from graphrun.graph.format import META_FILE

    check_at_least(args, 1, "--requests", "--parts", "--threads", "--refreshes")
    if args.refreshes > MAX_REFRESHES:
        raise ArgumentError(f"--refreshes: at most {MAX_REFRESHES}, got {args.refreshes}")
    check_at_least(args, 0.1, "--seconds")
    check_at_least(args, 10, "--nodes")
    if not 0 <= args.window_ms <= 1000:
        raise ArgumentError(f"--window-ms: {args.window_ms} is not in [0, 1000]")
    args.fanout_list = int_list("--fanouts", args.fanouts)
    args.concurrency_list = int_list("--concurrency", args.concurrency)
    if max(args.concurrency_list) > 1024:
        raise ArgumentError(f"--concurrency: at most 1024 clients, got {args.concurrency}")
    args.mode_list = [m for m in args.modes.split(",") if m]
    for m in args.mode_list:
        if m not in MODES:
            raise ArgumentError(f"--modes: {m!r} is not one of {', '.join(MODES)}")
    if args.dataset is not None and not (args.dataset / META_FILE).is_file():
        raise ArgumentError(f"--dataset: {args.dataset} is not a dataset directory")
    if args.hosts == "netns":
        from graphrun.local.netns import unavailable_reason

        why = unavailable_reason()
        if why:
            raise ArgumentError(f"--hosts netns: {why}")


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


def _body(mode: str) -> Callable[[int], bytes]:
    head = b'{"parameters": {"mode": "%s"}, "inputs": [{"name": "node_ids", "shape": [1], ' % (
        mode.encode()
    )
    return lambda node: head + b'"datatype": "INT64", "data": [%d]}]}' % node


def _run_one(cfg: dict[str, Any], pid: int, mode: str, clients: int, requests: int,
             seconds: float) -> dict[str, Any]:  # fmt: skip
    """One run of the load generator, with the endpoint's CPU seconds over it."""
    from graphrun.bench import cpu_seconds
    from graphrun.bench.httpload import drive

    host, port = cfg["host"], cfg["port"]
    path, n = "/v2/models/bench/infer", cfg["num_nodes"]
    cpu0 = cpu_seconds(pid)
    load = asyncio.run(drive(host, port, path, cfg["token"], _body(mode), clients, requests,
                             seconds, n, seed=clients))  # fmt: skip
    server = cpu_seconds(pid) - cpu0
    return {
        "mode": mode, "concurrency": clients, **load.summary(),
        "server_cpu_s": round(server, 3),
        "requests_per_server_cpu_s": round(len(load.latencies) / server, 1) if server else None,
        "load_avg": round(os.getloadavg()[0], 2),
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


def measure(cfg: dict[str, Any]) -> dict[str, Any]:
    """Everything measured, from this host: the full pass, the runs, the refresh."""
    full_pass_s = _embed(cfg)["full_pass_s"]
    runs = drive(cfg)
    return {"runs": runs, "full_pass_s": full_pass_s, **_refresh(cfg)}


def drive(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The endpoint on this host (on the store of ``cfg["common"]``) and every run against
    it from this process, on loopback."""
    d = Path(cfg["dir"])
    ready = d / f"ready-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "graphrun", "infer", "serve", *cfg["common"], "--port", "0",
           "--ready-file", str(ready), "--token-file", str(d / "token"),
           "--threads", str(cfg["threads"]), "--max-queue", "2048",
           "--window-ms", str(cfg["window_ms"])]  # fmt: skip
    proc = _start(cmd, ready, d / "endpoint.log")
    try:
        url = urlsplit(json.loads(ready.read_text())["url"])
        cfg = {**cfg, "host": url.hostname, "port": url.port}
        runs = []
        for mode in cfg["modes"]:
            _run_one(cfg, proc.pid, mode, 4, 50, cfg["seconds"])  # warm-up
            for c in cfg["concurrency"]:
                runs.append(_run_one(cfg, proc.pid, mode, c, cfg["requests"], cfg["seconds"]))
        return runs
    finally:
        proc.terminate()
        proc.wait(30)


def _keys(d: Path) -> None:
    quiet = subprocess.DEVNULL
    keygen = [sys.executable, "-m", "graphrun", "keygen"]
    subprocess.run([*keygen, str(d / "store.key")], check=True, stdout=quiet)
    for name, grants in (("bench", []), ("writer", ["--grants", "write_graph"])):
        cmd = [*keygen, str(d / f"{name}.key"), "--store", str(d / "store.key"),
               "--clients", str(d / "clients"), *grants]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=quiet)
    (d / "token").write_text("bench-" + "0" * 26)


@contextlib.contextmanager
def _hosts(args: argparse.Namespace, d: Path) -> Iterator[tuple[list[str], tuple[str, ...]]]:
    """The store's servers (on host m1 with ``--hosts netns``), their addresses and the
    command prefix of the endpoint's host (none: this one)."""
    from graphrun.local.netns import NetnsNetwork
    from graphrun.local.stores import start_store

    with contextlib.ExitStack() as stack:
        net = stack.enter_context(NetnsNetwork(["m0", "m1"])) if args.hosts == "netns" else None
        address = "tcp://127.0.0.1:0" if net is None else f"tcp://{net.address('m1')}:0"
        launcher = () if net is None else net.prefix("m1")
        addresses, extra = [], ["--clients", str(d / "clients")]
        for part in range(args.parts):
            sp = start_store(d / "parts", part, key_file=d / "store.key", address=address,
                             launcher=launcher, extra_args=extra)  # fmt: skip
            stack.callback(sp.stop)
            addresses.append(sp.address)
        yield addresses, (() if net is None else net.prefix("m0"))


def _on_host(cfg: dict[str, Any], d: Path, prefix: tuple[str, ...]) -> dict[str, Any]:
    """:func:`measure` in a process on the host of ``prefix``."""
    (d / "drive.json").write_text(json.dumps(cfg))
    cmd = [*prefix, sys.executable, "-m", "graphrun", "bench", "serve", "--drive",
           str(d / "drive.json")]  # fmt: skip
    got = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # its stderr: ours
    if got.returncode != 0:
        raise GraphrunError(f"bench serve: the measuring process on m0 exited {got.returncode}")
    out: dict[str, Any] = json.loads(got.stdout.strip().splitlines()[-1])
    return out


def run(args: argparse.Namespace) -> int:
    if args.drive is not None:  # the half that runs on host m0
        print(json.dumps(measure(json.loads(args.drive.read_text()))))
        return 0
    _check(args)
    from graphrun.graph import save_dataset
    from graphrun.partition import partition_graph

    with tempfile.TemporaryDirectory(prefix="graphrun-bench-serve-") as tmp:
        d = Path(tmp)
        graph = _graph(args)
        save_dataset(graph, d / "data")
        partition_graph(graph, d / "parts", args.parts, "metis")
        job = _job(d, graph, args)
        _keys(d)
        with _hosts(args, d) as (addresses, prefix):
            stores = [a for s in addresses for a in ("--store", s)]
            cfg = {
                "dir": str(d), "common": [str(job), *stores, "--key-file", str(d / "bench.key")],
                "job": str(job), "stores": addresses, "key_file": str(d / "bench.key"),
                "threads": args.threads, "token": (d / "token").read_text(),
                "num_nodes": graph.num_nodes, "ntype": graph.node_types[0],
                "etype": list(graph.edge_types[0]), "modes": args.mode_list,
                "concurrency": args.concurrency_list, "requests": args.requests,
                "seconds": args.seconds, "window_ms": args.window_ms,
                "refreshes": args.refreshes,
            }  # fmt: skip
            got = measure(cfg) if not prefix else _on_host(cfg, d, prefix)
    print(json.dumps({
        "nodes": graph.num_nodes, "edges": graph.num_edges, "parts": args.parts,
        "fanouts": args.fanout_list, "hosts": args.hosts, "window_ms": args.window_ms,
        "load_avg": [round(x, 2) for x in os.getloadavg()], **got,
    }))  # fmt: skip
    return 0


def _embed(cfg: dict[str, Any], how: Literal["live", "refresh"] | None = None) -> dict[str, Any]:
    """``graphrun infer embed`` (``--live``, ``--refresh``) in this process."""
    from graphrun.serving.config import target
    from graphrun.serving.engine import embed_job

    t = target(Path(cfg["job"]), cfg["stores"], Path(cfg["key_file"]), None)
    return embed_job(t, threads=cfg["threads"], how=how)


def _refresh(cfg: dict[str, Any]) -> dict[str, Any]:
    """A refresher that stays up (``infer embed --live --follow``): its kept pass, then
    ``refreshes`` times 1,000 new edges and its refresh to them (``refresh_s``,
    ``refresh_cpu_s``: the medians; the counts are the last refresh's); then 1,000 more
    and a refresh that starts cold, with a store client of its own as a process of its
    own has (``refresh_own_process_s``); last a full pass at the head, whose logits the
    refreshed ones are compared with."""
    from graphrun.rpc.auth import load_keys
    from graphrun.serving.refresh import States
    from graphrun.store.client import ClientConfig, KVClient

    d = Path(cfg["dir"])
    stores, common = cfg["stores"], cfg["common"]
    n, ntype = cfg["num_nodes"], cfg["ntype"]
    rng = np.random.default_rng(0)
    cmd = [sys.executable, "-m", "graphrun", "infer", "embed", *common, "--live", "--follow",
           "--poll-s", "0.05"]  # fmt: skip
    follower = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        _line(follower)  # the kept pass
        each = []
        for _ in range(cfg["refreshes"]):
            _add_edges(cfg, stores, rng)
            each.append(_line(follower))
    finally:
        _stop(follower)
    _add_edges(cfg, stores, rng)
    own = _embed(cfg, "refresh")
    ids = np.arange(n, dtype=np.int64)
    with KVClient(ClientConfig(stores, job="bench", keys=load_keys(d / "bench.key"))) as c:
        st = States(c, ntype)
        st.load()
        fresh = st.read("logits", ids)
        _embed(cfg, "live")
        whole = st.read("logits", ids)
    got = each[-1]
    return {"refresh_s": float(np.median([g["refresh_s"] for g in each])),
            "refreshes_s": [g["refresh_s"] for g in each],
            "refresh_cpu_s": float(np.median([g["cpu_s"] for g in each])),
            "refresh_own_process_s": own["refresh_s"], "refresh_recomputed": got["recomputed"],
            "refresh_updated": got["updated"], "refresh_per_layer": got["per_layer"],
            "refresh_max_abs_diff": float((fresh - whole).abs().max())}  # fmt: skip


def _stop(proc: subprocess.Popen[str], grace_s: float = 60.0) -> None:
    """SIGTERM the follower and wait for it; killed if it outlives ``grace_s`` (a CI run's
    follower did not end within 30 s on a loaded box and went on after the stores
    stopped), and said so."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise GraphrunError(f"bench serve: the refresher did not stop within {grace_s:.0f} s "
                            "of SIGTERM: killed") from None  # fmt: skip


def _line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The next pass the follower reports."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise GraphrunError(f"bench serve: the refresher exited ({proc.wait(30)})")
    got: dict[str, Any] = json.loads(line)
    return got


def _add_edges(cfg: dict[str, Any], stores: list[str], rng: np.random.Generator) -> None:
    """1,000 new edges between random nodes, written by a writer key in one commit."""
    from graphrun.distributed.writer import GraphWriter
    from graphrun.partition import load_id_mapping
    from graphrun.rpc.auth import load_keys
    from graphrun.store.client import ClientConfig, KVClient

    d, n = Path(cfg["dir"]), cfg["num_nodes"]
    orig = load_id_mapping(d / "parts").orig_nids
    with KVClient(ClientConfig(stores, job="writer", keys=load_keys(d / "writer.key"))) as c:
        w = GraphWriter(c)
        w.add_edges(tuple(cfg["etype"]), orig[rng.integers(0, n, 1000)],
                    orig[rng.integers(0, n, 1000)], orig=True)  # fmt: skip
        w.commit()
