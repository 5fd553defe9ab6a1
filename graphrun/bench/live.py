"""``graphrun bench live``: the live graph's ingest, staleness, training and a crash (JSON).

Generates a power-law graph (``community``; ``--dataset DIR`` takes a dataset instead),
partitions it in two (metis), and serves each partition with a real ``graphrun serve``
process: on loopback (``--hosts local``) or one per network-namespace host
(``--hosts netns``, root: the bench's clients then run as one process on host ``m0``,
so partition 1 is reached over the hosts' link). A writer key (``--grants
write_graph``) writes, a job key reads. Measured, in this order:

* **ingest**: ``--batches`` commits of ``--batch`` new edges (random ends among the
  base nodes) through :class:`~graphrun.distributed.writer.GraphWriter`, back to back,
  ``--window`` batches in flight (``submit``/``flush``); ``ingest_edges_per_s`` is edges
  acknowledged per second divided by the partition servers (every batch touches both),
  with each batch's latency from its ``submit`` to its acknowledgement (as the writer's
  next call saw it);
* **staleness**: ``--probes`` commits of a batch holding a marker edge into a node of
  partition 1; from ``commit()`` returning (after the acknowledgement *and* the commits
  to the partitions) until a second client, following the head, sees the marker in
  ``graph_in_degrees`` (the sampler's op); ``staleness_p50_s``/``staleness_p99_s``;
* **training epochs** (GraphSAGE over :class:`~graphrun.distributed.DistNodeDataLoader`,
  ``--fanouts``, ``--batch-size``, at most ``--epoch-batches`` batches, following the
  head, ``--threads`` torch threads; after a 2-batch warm-up) undisturbed and while
  another process ingests at ``--rate`` edges/s (``ingest_rate_reached_edges_per_s``:
  what it managed; ``commit()`` a batch, or with ``--epoch-window N`` > 1 a pipelined
  stream, ``submit()`` with N batches in flight, each batch's decision carried by the
  next: ``epoch_window``; ``epoch_ack_p50_s``/``epoch_ack_p99_s``: a batch's latency
  from its ``commit()`` or ``submit()`` to its acknowledgement), ``--epoch-pairs``
  pairs in turns, medians reported (and each pair's ratio, ``epoch_pair_ratios``, with
  their median ``epoch_pair_ratio_median``), with the CPU the trainer, the servers and the
  ingesting process took in each and its batches' mean size (:mod:`graphrun.bench.live_epochs`);
* **compaction** of both partitions (``live_compact``: everything ingested so far folded
  into the base, the partition directory rewritten, the logs truncated) while a client
  reads in-degrees at a pinned version in a loop: ``compaction_s`` (the longest
  compaction, built off the loop), ``compaction_pause_s`` (the longest time a server's
  loop stood still to swap a compaction in: what a read waited because of it),
  ``compaction_read_max_s`` and ``read_max_s_before`` (the slowest read during the
  compaction and in as many reads before it, as the client saw them);
* **kill -9** of partition 1's server mid-ingest (after ``--kill-after`` acknowledged
  batches into a fixed set of destinations), the server restarted on its directory, and
  the acknowledged edges into partition 1 counted missing from its in-degrees at the
  new head: ``lost_acknowledged_writes`` (per fault);
* with ``--replicas 2`` (each partition's replica on the other host, each host its own
  log directory) the fault is instead **the loss of a machine** (``--lose m0``: partition
  0's primary, the sequencer, and partition 1's replica; ``--lose m1``: partition 1's
  primary and partition 0's replica): every store process of the host SIGKILLed and its
  log directory deleted (its disk) after ``--kill-after`` acknowledged batches; the
  writer goes on through the replicas for ``--kill-after`` more, and the acknowledged
  edges missing from both partitions' in-degrees at the new head are
  ``lost_acknowledged_writes["machine_m0"]`` (or ``m1``). The bench's own process is
  spared (it counts), on host ``m0`` too;
* ``streamed_cut_ratio``: :func:`graphrun.partition.streaming.measure_streamed` (LDG,
  half the nodes streamed onto a metis base) on the same graph.

Output (one object)::

    {"bench": "live", "hosts", "nodes", "edges", "parts", "batch", "window", "ingest_edges_per_s",
     "commit_p50_s", "commit_p99_s", "staleness_p50_s", "staleness_p99_s",
     "epoch_s_undisturbed", "epoch_s_ingesting", "epochs_s", "epoch_pairs", "epoch_cpu_s",
     "epochs_cpu_s", "epoch_batch", "epochs_batch", "compactions_in_epochs",
     "trainer_threads", "ingest_rate_edges_per_s", "ingest_rate_reached_edges_per_s",
     "epoch_window", "epoch_ack_p50_s", "epoch_ack_p99_s", "epoch_pair_ratios",
     "epoch_pair_ratio_median", "epoch_batches",
     "lost_acknowledged_writes":
     {"kill9_part1": n} (or {"machine_m0": n}), "acknowledged_into_part1" (or
     "acknowledged", "acknowledged_after_loss", "failovers"), "streamed_cut_ratio",
     "streamed", "compaction_s", "compaction_pause_s", "compaction_read_max_s",
     "read_max_s_before", "load_avg", "replicas"}

Timings are never asserted in tests; ``load_avg`` says how quiet the box was.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphrun.bench import check_at_least, int_list
from graphrun.bench.live_epochs import answered, client, commit, edges, epochs
from graphrun.errors import ArgumentError, GraphrunError
from graphrun.graph.format import META_FILE
from graphrun.machine.trainer_env import trainer_openmp

if TYPE_CHECKING:
    from graphrun.graph import Graph
    from graphrun.store.client import KVClient

PARTS = 2
MAX_EPOCH_PAIRS = 50
STOP_S = 30.0  # an interrupted run waits this long for its measuring process to stop


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "live", help="live graph: ingest, staleness, epoch while ingesting, kill -9",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--nodes",
        type=int,
        default=200_000,
        help="generated nodes (power law, exponent 2.1, 100 features, 47 classes)",
    )
    p.add_argument("--degree", type=float, default=40.0, help="generated average degree")
    p.add_argument("--dataset", type=Path, help="a dataset directory instead of a generated graph")
    p.add_argument("--hosts", choices=("local", "netns"), default="local")
    p.add_argument("--batch", type=int, default=10_000, help="new edges per commit")
    p.add_argument("--batches", type=int, default=100, help="commits timed for the ingest rate")
    p.add_argument("--window", type=int, default=16, help="batches in flight while ingesting")
    p.add_argument("--epoch-window", type=int, default=1,
                   help="the epochs' ingesting process: 1 commits each batch (commit()), "
                        "more pipelines them (submit(), that many in flight)")  # fmt: skip
    p.add_argument("--probes", type=int, default=50, help="staleness probes")
    p.add_argument("--rate", type=float, default=100_000.0, help="edges/s while training")
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epoch-batches", type=int, default=50, help="batches per timed epoch")
    p.add_argument("--epoch-pairs", type=int, default=3,
                   help="undisturbed and ingesting epochs, in turns (the medians are "
                        "reported)")  # fmt: skip
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="the trainer's torch threads (0: torch's default, every core)",
    )
    p.add_argument("--kill-after", type=int, default=20, help="acknowledged batches, then kill")
    p.add_argument("--replicas", type=int, choices=(1, 2), default=1,
                   help="2: a replica of each partition on the other host; the fault is "
                        "then a lost machine")  # fmt: skip
    p.add_argument(
        "--lose",
        choices=("m0", "m1"),
        help="with --replicas 2: the machine lost (default m0: the sequencer's)",
    )
    p.add_argument("--drive", type=Path, help=argparse.SUPPRESS)  # the netns host's half
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    check_at_least(args, 1, "--batch", "--batches", "--window", "--epoch-window", "--probes",
                   "--batch-size", "--epoch-batches", "--epoch-pairs", "--kill-after")  # fmt: skip
    check_at_least(args, 0, "--threads")
    if args.epoch_pairs > MAX_EPOCH_PAIRS:
        raise ArgumentError(f"--epoch-pairs: at most {MAX_EPOCH_PAIRS}, got {args.epoch_pairs}")
    if args.threads > 1024:
        raise ArgumentError(f"--threads: at most 1024, got {args.threads}")
    check_at_least(args, 100, "--nodes")
    check_at_least(args, 1.0, "--rate")
    from graphrun.distributed.writer import MAX_WINDOW

    for name in ("window", "epoch_window"):
        if getattr(args, name) > MAX_WINDOW:
            raise ArgumentError(f"--{name.replace('_', '-')}: at most {MAX_WINDOW} batches in "
                                f"flight, got {getattr(args, name)}")  # fmt: skip
    if args.batch > 1 << 20:
        raise ArgumentError(f"--batch: at most {1 << 20} edges per commit, got {args.batch}")
    args.fanout_list = int_list("--fanouts", args.fanouts)
    if args.lose is not None and args.replicas == 1:
        raise ArgumentError("--lose: a machine is lost only with --replicas 2 (its replicas "
                            "take over); with 1 the fault is kill -9 of partition 1")  # fmt: skip
    args.lose = args.lose or "m0"
    if args.dataset is not None and not (args.dataset / META_FILE).is_file():
        raise ArgumentError(f"--dataset: {args.dataset} is not a dataset directory")


def _graph(args: argparse.Namespace) -> Graph:
    from graphrun.graph import GenParams, community, load_dataset

    if args.dataset is not None:
        return load_dataset(args.dataset)
    params = GenParams(nodes=args.nodes, avg_degree=args.degree, exponent=2.1, feat_dim=100,
                       classes=47)  # fmt: skip
    return community(params)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- the measuring half (in this process, or on host m0) ------------------------------


def _ingest(cfg: dict[str, Any]) -> dict[str, Any]:
    from graphrun.distributed.writer import GraphWriter

    rng = np.random.default_rng(1)
    with client(cfg, cfg["writer_key"]) as c:
        w, n = GraphWriter(c, window=cfg["window"]), c.book.num_nodes
        commit(w, *edges(rng, n, None, cfg["batch"]))  # warm-up
        w.flush()
        lat: list[float] = []  # each batch's, from its submit (its tag) to its answer
        t0 = time.perf_counter()
        for _ in range(cfg["batches"]):
            w.add_edges("_E", *edges(rng, n, None, cfg["batch"]))
            w.submit(tag=time.perf_counter())
            lat += answered(w)
        w.flush()
        wall = time.perf_counter() - t0
        lat += answered(w)
        w.close()
    return {
        "window": cfg["window"],
        "ingest_edges_per_s": round(cfg["batches"] * cfg["batch"] / wall / PARTS, 1),
        "commit_p50_s": round(float(np.percentile(lat, 50)), 5),
        "commit_p99_s": round(float(np.percentile(lat, 99)), 5),
    }


def _in_degree(c: KVClient, part: int, ids: np.ndarray) -> np.ndarray:
    msg = c.session.call(part, "graph_in_degrees", {}, tensors=(ids,))
    return np.asarray(msg.tensors[0], np.int64)


def _staleness(cfg: dict[str, Any]) -> dict[str, Any]:
    from graphrun.distributed.writer import GraphWriter

    rng = np.random.default_rng(2)
    waits = []
    with (
        client(cfg, cfg["writer_key"]) as c,
        client(cfg, cfg["job_key"]) as r,
    ):
        w, n = GraphWriter(c), c.book.num_nodes
        lo, hi = (int(x) for x in c.book.node_offsets[1:3])  # partition 1's base nodes
        for _ in range(cfg["probes"]):
            marker = np.asarray([int(rng.integers(lo, hi))], np.int64)
            r.follow()
            before = int(_in_degree(r, 1, marker)[0])
            src, dst = edges(rng, n, None, cfg["batch"] - 1)
            w.add_edges("_E", np.append(src, 0), np.append(dst, marker))
            w.commit()
            acked = time.perf_counter()
            while True:
                r.follow()
                if int(_in_degree(r, 1, marker)[0]) > before:
                    break
            waits.append(time.perf_counter() - acked)
    return {
        "staleness_p50_s": round(float(np.percentile(waits, 50)), 5),
        "staleness_p99_s": round(float(np.percentile(waits, 99)), 5),
    }


def _compaction(cfg: dict[str, Any]) -> dict[str, Any]:
    """Compact both partitions while a reader at a pinned version reads in a loop."""
    lat: list[float] = []
    stop = threading.Event()
    with client(cfg, cfg["job_key"]) as r, client(cfg, cfg["writer_key"]) as c:
        r.follow()
        lo, hi = (int(x) for x in r.book.node_offsets[1:3])
        ids = np.arange(lo, min(hi, lo + 1024), dtype=np.int64)

        def read() -> None:
            while not stop.is_set():
                t = time.perf_counter()
                _in_degree(r, 1, ids)
                lat.append(time.perf_counter() - t)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        while len(lat) < 20:
            time.sleep(0.01)
        quiet = len(lat)
        stats = [c.session.call(p, "live_compact", {"start": True}, main_only=True).body
                 for p in range(PARTS)]  # fmt: skip
        while any(s["running"] for s in stats):
            time.sleep(0.05)
            stats = [c.session.call(p, "live_compact", {}, main_only=True).body
                     for p in range(PARTS)]  # fmt: skip
        stop.set()
        reader.join()
    return {
        "compaction_s": max(s["build_s"] for s in stats),
        "compaction_pause_s": max(s["max_pause_s"] for s in stats),
        "compaction_read_max_s": round(max(lat[quiet:], default=0.0), 5),
        "read_max_s_before": round(max(lat[:quiet]), 5),
        "compactions": [s["compactions"] for s in stats],
        "compaction_errors": [s["error"] for s in stats if s["error"]],
    }


def _kill(cfg: dict[str, Any], stores: list[Any]) -> dict[str, Any]:
    """kill -9 partition 1's server while batches into it are committed; the acknowledged
    edges it holds (from every phase before, and this one's) missing after its restart."""
    from graphrun.distributed.writer import GraphWriter
    from graphrun.local.stores import start_store

    rng = np.random.default_rng(4)
    acked = 0
    with client(cfg, cfg["job_key"]) as c:
        base = _edges_into(c, (1,))  # not following: the base graph
    with client(cfg, cfg["writer_key"], timeout=10) as c:
        c.follow()
        before = _edges_into(c, (1,))
        lo, hi = (int(x) for x in c.book.node_offsets[1:3])
        w, n = GraphWriter(c), c.book.num_nodes
        for k in range(cfg["kill_after"] + 1000):
            if k == cfg["kill_after"]:  # SIGKILL while the next batch is on its way
                threading.Timer(0.002, stores[1].proc.kill).start()
            try:
                commit(w, *edges(rng, n, np.arange(lo, hi), cfg["batch"]))
            except GraphrunError:
                break  # not acknowledged: the writer is told, the ingest stops
            acked += cfg["batch"]
    stores[1].proc.wait()
    stores[1] = start_store(cfg["parts_dir"], 1, **cfg["store_kwargs"][1])
    out: dict[str, Any] = {"acknowledged_into_part1": before - base + acked}
    with client(cfg, cfg["job_key"]) as c:
        c.follow()
        try:
            lost: int | None = max(before + acked - _edges_into(c, (1,)), 0)
        except GraphrunError as exc:  # the restarted partition cannot answer at the head
            lost, out["kill9_error"] = None, str(exc)
    return {"lost_acknowledged_writes": {"kill9_part1": lost}, **out}


def _edges_into(c: KVClient, parts: Sequence[int] = range(PARTS)) -> int:
    """Edges into the base nodes of ``parts`` at the client's version (their in-degrees)."""
    total = 0
    for p in parts:
        lo, hi = (int(x) for x in c.book.node_offsets[p : p + 2])
        total += sum(int(_in_degree(c, p, np.arange(a, min(a + 65536, hi))).sum())
                     for a in range(lo, hi, 65536))  # fmt: skip
    return total


def _start_replicas(cfg: dict[str, Any], stores: list[Any]) -> None:
    """Partition ``p``'s replica on the next host, registered before any client joins."""
    from graphrun.local.stores import start_store
    from graphrun.rpc.auth import load_keys
    from graphrun.rpc.transport import RpcClient

    for p, kw in enumerate(cfg.get("replica_kwargs", [])):
        extra = [*kw["extra_args"], "--replica-of", cfg["addresses"][p]]
        stores.append(start_store(cfg["parts_dir"], p, **{**kw, "extra_args": extra}))
        with RpcClient(cfg["addresses"][p], keys=load_keys(kw["key_file"]), timeout=30) as c:
            deadline = time.monotonic() + 60
            while not c.call("stats").body["replicas"]:
                if time.monotonic() > deadline:
                    raise GraphrunError(f"bench live: partition {p}'s replica never registered")
                time.sleep(0.1)


def _lose_machine(cfg: dict[str, Any], stores: list[Any]) -> dict[str, Any]:
    """Every store process of machine ``cfg["lose"]`` SIGKILLed and its log directory
    deleted mid-ingest; the writer goes on through the replicas; the acknowledged edges
    missing afterwards (see the module docstring)."""
    from graphrun.distributed.writer import GraphWriter

    m = int(cfg["lose"][1:])
    rng = np.random.default_rng(4)
    acked, after_loss, error = 0, 0, ""
    with client(cfg, cfg["job_key"]) as c:
        base = _edges_into(c)  # not following: the base graph
    with client(cfg, cfg["writer_key"], timeout=10) as c:
        c.follow()
        before = _edges_into(c)
        w, n = GraphWriter(c), c.book.num_nodes
        for k in range(2 * cfg["kill_after"]):
            if k == cfg["kill_after"]:  # the machine goes while the next batch is on its way
                threading.Timer(0.002, _kill_machine, (cfg, stores, m)).start()
            try:
                commit(w, *edges(rng, n, None, cfg["batch"]))
            except GraphrunError as exc:
                error = str(exc)  # not acknowledged: the writer is told, the ingest stops
                break
            acked += cfg["batch"]
            after_loss += cfg["batch"] if k >= cfg["kill_after"] else 0
        failovers = len(c.session.failovers)
    out: dict[str, Any] = {
        "acknowledged": before - base + acked,
        "acknowledged_after_loss": after_loss,
        "failovers": failovers,
    }
    if error:
        out["machine_error"] = error
    with client(cfg, cfg["job_key"], timeout=10) as c:
        c.follow()
        try:
            lost: int | None = max(before + acked - _edges_into(c), 0)
        except GraphrunError as exc:
            lost, out["machine_error"] = None, str(exc)
    return {"lost_acknowledged_writes": {f"machine_m{m}": lost}, **out}


def _kill_machine(cfg: dict[str, Any], stores: list[Any], m: int) -> None:
    """SIGKILL every store process of machine ``m``, then delete its disk (the logs)."""
    from graphrun.store.shm import DEFAULT_SHM_DIR, clean_stale

    hosts = [*range(PARTS), *((p + 1) % PARTS for p in range(PARTS))]  # primaries, replicas
    for sp, host in zip(stores, hosts, strict=True):
        if host == m:
            sp.proc.kill()
    for sp, host in zip(stores, hosts, strict=True):
        if host == m:
            sp.proc.wait()
    shutil.rmtree(cfg["live_dirs"][m])
    clean_stale(DEFAULT_SHM_DIR)  # what the killed servers left in shared memory


def drive(cfg: dict[str, Any]) -> dict[str, Any]:
    """Start the stores, measure, stop them."""
    from graphrun.local.stores import start_store
    from graphrun.rpc.tuning import keep_large_allocations

    keep_large_allocations()  # as graphrun ingest: the writer's batches are fresh buffers
    stores = [start_store(cfg["parts_dir"], p, **cfg["store_kwargs"][p]) for p in range(PARTS)]
    try:
        _start_replicas(cfg, stores)
        pids = [s.proc.pid for s in stores]  # replicas too (the launchers exec the servers)
        out = {**_ingest(cfg), **_staleness(cfg), **epochs(cfg, pids)}
        out["epoch_batches"] = cfg["epoch_batches"]
        # the epochs' trainer's OpenMP waiting, as its caller's environment set it
        out["trainer_omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "")
        out["trainer_gomp_spincount"] = os.environ.get("GOMP_SPINCOUNT", "")
        out.update(_compaction(cfg))
        out.update(_lose_machine(cfg, stores) if "lose" in cfg else _kill(cfg, stores))
    finally:
        for s in stores:
            s.stop()
    return out


# ---- the whole run ---------------------------------------------------------------------


def _keys(d: Path) -> None:
    quiet = subprocess.DEVNULL
    keygen = [sys.executable, "-m", "graphrun", "keygen"]
    subprocess.run([*keygen, str(d / "store.key")], check=True, stdout=quiet)
    for name, grants in (("writer", ["--grants", "write_graph"]), ("job", [])):
        cmd = [*keygen, str(d / f"{name}.key"), "--store", str(d / "store.key"),
               "--clients", str(d / "clients"), *grants]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=quiet)


def _config(
    args: argparse.Namespace, d: Path, graph: Graph, hosts: Sequence[tuple[str, Any]]
) -> dict[str, Any]:
    """The measuring half's settings; ``hosts``: each partition's primary (address and
    launcher); with ``--replicas 2`` partition ``p``'s replica is on host ``p + 1``."""
    label = graph.ndata[graph.node_types[0]]["label"]
    # the servers' write-ahead logs (part-K.wal): one directory, or one per host
    live = [d / "live"] if args.replicas == 1 else [d / f"live-m{m}" for m in range(PARTS)]
    for path in live:
        path.mkdir(exist_ok=True)

    def kwargs(address: str, launcher: Sequence[str], machine: int) -> dict[str, Any]:
        extra = ["--clients", str(d / "clients"), "--live-dir", str(live[machine % len(live)])]
        return {"key_file": str(d / "store.key"), "address": address, "launcher": list(launcher),
                "extra_args": extra, "log_dir": str(d)}  # fmt: skip

    extra: dict[str, Any] = {}
    if args.replicas == 2:
        reps = [kwargs(f"tcp://127.0.0.1:{_free_port()}", (), (p + 1) % PARTS)
                for p in range(PARTS)]  # fmt: skip
        extra = {"replica_kwargs": reps, "lose": args.lose, "live_dirs": [str(p) for p in live]}
    return {
        **extra,
        "store_kwargs": [kwargs(a, launcher, m) for m, (a, launcher) in enumerate(hosts)],
        "addresses": [h[0] for h in hosts], "parts_dir": str(d / "parts"),
        "writer_key": str(d / "writer.key"),
        "job_key": str(d / "job.key"), "batch": args.batch, "batches": args.batches,
        "probes": args.probes, "window": args.window, "rate": args.rate,
        "epoch_window": args.epoch_window,
        "fanouts": args.fanout_list,
        "batch_size": args.batch_size, "epoch_batches": args.epoch_batches,
        "epoch_pairs": args.epoch_pairs, "threads": args.threads,
        "kill_after": args.kill_after, "classes": int(np.max(label)) + 1,
    }  # fmt: skip


def _netns(cfg: dict[str, Any], d: Path) -> dict[str, Any]:
    """The measuring half as one process on host m0 (it starts the stores on m0, m1)."""
    from graphrun.local.netns import NetnsNetwork, unavailable_reason

    why = unavailable_reason()
    if why:
        raise ArgumentError(f"--hosts netns: {why}")
    with NetnsNetwork(["m0", "m1"]) as net:
        for p in range(PARTS):
            m = f"m{p}"
            cfg["addresses"][p] = f"tcp://{net.address(m)}:{_free_port()}"
            cfg["store_kwargs"][p]["address"] = cfg["addresses"][p]
            cfg["store_kwargs"][p]["launcher"] = list(net.prefix(m))
        for p, kw in enumerate(cfg.get("replica_kwargs", [])):  # on the next host
            m = f"m{(p + 1) % PARTS}"
            kw["address"] = f"tcp://{net.address(m)}:{_free_port()}"
            kw["launcher"] = list(net.prefix(m))
        return _apart(cfg, d, net.prefix("m0"))


def _apart(cfg: dict[str, Any], d: Path, prefix: Sequence[str]) -> dict[str, Any]:
    """The measuring half as a process of its own (on host m0 with netns hosts): its
    epochs' trainer imports torch with the OpenMP waiting a job's CPU trainers get
    (:func:`~graphrun.machine.trainer_env.trainer_openmp`: unless this process's
    environment sets its own)."""
    (d / "drive.json").write_text(json.dumps(cfg))
    cmd = [*prefix, sys.executable, "-m", "graphrun", "bench", "live",
           "--drive", str(d / "drive.json")]  # fmt: skip
    env = {**os.environ, **trainer_openmp(os.environ)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)  # stderr: ours
    try:
        stdout, _ = proc.communicate()
    except BaseException:  # interrupted (SIGTERM too): it stops its stores and its writer
        proc.terminate()
        try:
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    if proc.returncode != 0:
        raise GraphrunError(f"bench live: the measuring process exited {proc.returncode}")
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def run(args: argparse.Namespace) -> int:
    if args.drive is not None:  # the half that runs on host m0
        print(json.dumps(drive(json.loads(args.drive.read_text()))))
        return 0
    _check(args)
    from graphrun.partition import partition_graph
    from graphrun.partition.streaming import measure_streamed

    graph = _graph(args)
    with tempfile.TemporaryDirectory(prefix="graphrun-bench-live-") as tmp:
        d = Path(tmp)
        partition_graph(graph, d / "parts", PARTS, "metis")
        _keys(d)
        local = [(f"tcp://127.0.0.1:{_free_port()}", ()) for _ in range(PARTS)]
        cfg = _config(args, d, graph, local)
        out = _apart(cfg, d, ()) if args.hosts == "local" else _netns(cfg, d)
    streamed = measure_streamed(graph, PARTS, method="ldg")
    print(json.dumps({
        "bench": "live", "hosts": args.hosts, "nodes": graph.num_nodes,
        "edges": graph.num_edges, "parts": PARTS, "batch": args.batch,
        "replicas": args.replicas, **out,
        "streamed_cut_ratio": round(streamed.streamed_cut_ratio, 4),
        "streamed": streamed.to_dict(), "load_avg": list(os.getloadavg()),
    }))  # fmt: skip
    return 0
