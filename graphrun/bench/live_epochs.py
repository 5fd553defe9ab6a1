"""``graphrun bench live``'s training epochs: undisturbed and while ingesting, in turns.

One pair is an epoch of GraphSAGE training (:class:`~graphrun.distributed.DistNodeDataLoader`,
following the head, the same seed and the same seeds' order every epoch, at most
``--epoch-batches`` batches) undisturbed and one while a second process commits
``--batch``-edge batches at ``--rate`` edges/s. ``--epoch-pairs`` pairs run in turns
(undisturbed first in even pairs, ingesting first in odd ones: U I I U U I ...), so that
what drifts during the run (the box's load, the delta's size) weighs on both sides alike;
``epoch_s_undisturbed`` and ``epoch_s_ingesting`` are the medians, each epoch's time is
listed too. A single pair of 20 batches moved by more than the 10% it is asked to show
(benchmarks/README.md, "the epoch while ingesting").

The ingesting process is started once, before the first pair, and waits between its
epochs; every epoch starts one second after the last ended (an ingesting one one second
into its ingest: :func:`lead`), so an undisturbed epoch does not start while the
servers still index the ingest before it. Each epoch also reports
where the CPU went: the trainer's (this process), the partition servers' (replicas
too) and the ingesting process's, from ``/proc`` (``epoch_cpu_s``: medians of each kind;
``epochs_cpu_s``: each epoch's), and the compactions the servers and replicas made
during it (a compaction starts by itself once the oldest commit is
:data:`~graphrun.store.compact.COMPACT_AGE_S` old: ``compactions_in_epochs``), and the
mean size of its batches (``epochs_batch``: sampled nodes and edges a batch; medians in
``epoch_batch``). The batches grow with the graph: ingested edges give the seeds'
neighbourhoods more nodes, so an epoch's model step costs more after an ingest whatever
else runs (an ingesting epoch's batches grow during it; the undisturbed epoch after it
samples the grown graph); their size tells that work from the ingest's CPU.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphrun.bench import cpu_seconds
from graphrun.errors import GraphrunError

if TYPE_CHECKING:
    from graphrun.store.client import KVClient

READY_S = 300.0  # the ingesting process connects (imports, a client) within this
LEAD_S = 1.0  # every epoch starts this long after the last (an ingesting one's ingest)
CPU_OF = ("trainer", "servers", "writer")  # the processes whose CPU an epoch reports
BATCH_OF = ("nodes", "edges")  # an epoch's batches' mean size


@dataclass(frozen=True)
class Epoch:
    """One epoch: its wall time after the loader was made, and its batches' mean number
    of sampled nodes and edges (the model step's work grows with them)."""

    wall_s: float
    nodes: float
    edges: float


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far; 0.0 once
    it is gone."""
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


def client(cfg: dict[str, Any], key: str, timeout: float = 60.0) -> KVClient:
    """A client of the bench's stores with ``key`` (a key acts as the job its file is
    named after); the bench's phases (:mod:`graphrun.bench.live`) use it too."""
    from graphrun.rpc.auth import load_keys
    from graphrun.store.client import ClientConfig, KVClient

    job, reps = Path(key).stem, [[k["address"]] for k in cfg.get("replica_kwargs", [])]
    return KVClient(ClientConfig(cfg["addresses"], job=job, keys=load_keys(key),
                                 timeout=timeout, replicas=reps))  # fmt: skip


def edges(rng: np.random.Generator, n: int, dst: np.ndarray | None, m: int) -> tuple[Any, Any]:
    src = rng.integers(0, n, m)
    return src, (rng.integers(0, n, m) if dst is None else rng.choice(dst, m))


def commit(w: Any, src: np.ndarray, dst: np.ndarray) -> float:
    t = time.perf_counter()
    w.add_edges("_E", src, dst)
    w.commit()
    return time.perf_counter() - t


def train_epoch(cfg: dict[str, Any], batches: int | None = None) -> Epoch:
    """One epoch (at most ``batches``, default ``--epoch-batches``) of GraphSAGE training
    that follows the head."""
    import torch
    from torch_geometric.nn import GraphSAGE

    from graphrun.distributed import DistGraph, DistNodeDataLoader, initialize
    from graphrun.rpc.auth import load_keys

    torch.manual_seed(0)
    keys = load_keys(cfg["job_key"])
    with initialize(cfg["addresses"], job="job", keys=keys, rank=0, world_size=1,
                    heartbeat_interval=0) as ctx:  # fmt: skip
        dg = DistGraph(ctx, follow="head")
        train = dg.mask_ids("train_mask")
        x_dim = int(dg.ndata["feat"].shape[1])
        classes = int(cfg["classes"])
        model = GraphSAGE(x_dim, 128, num_layers=len(cfg["fanouts"]), out_channels=classes)
        opt = torch.optim.Adam(model.parameters(), lr=0.003)
        loader = DistNodeDataLoader(dg, train, cfg["fanouts"], batch_size=cfg["batch_size"],
                                    shuffle=True)  # fmt: skip
        t0, done, nodes, edges = time.perf_counter(), 0, 0, 0
        for i, b in enumerate(loader):
            if i == (cfg["epoch_batches"] if batches is None else batches):
                break
            opt.zero_grad()
            out = model(b.x, b.edge_index)[: b.batch_size]
            torch.nn.functional.cross_entropy(out, b.y[: b.batch_size]).backward()
            opt.step()
            done, nodes, edges = done + 1, nodes + b.num_nodes, edges + b.num_edges
        wall = time.perf_counter() - t0
        return Epoch(wall, nodes / max(done, 1), edges / max(done, 1))


def ingest_at(cfg: dict[str, Any], ready: Any, go: Any, idle: Any, stop: Any, sent: Any) -> None:
    """While ``go`` is set, commit ``cfg["batch"]``-edge batches at ``cfg["rate"]`` edges/s
    (the rate counted from each ``go``); ``idle`` set between (no commit on its way);
    ``sent``: [edges, seconds] while going, then (once stopped) the median and 99th
    percentile of a batch's latency from its ``commit()`` or ``submit()`` to its
    acknowledgement (a pipelined batch is acknowledged a few submits later)."""
    from graphrun.distributed.writer import GraphWriter
    from graphrun.rpc.tuning import keep_large_allocations

    keep_large_allocations()  # a spawned process: as graphrun ingest
    rng = np.random.default_rng(3)
    window = int(cfg.get("epoch_window", 1))
    latency: list[float] = []
    with client(cfg, cfg["writer_key"]) as c:
        w, n = GraphWriter(c, window=window), c.book.num_nodes
        idle.set()
        ready.set()
        while not stop.is_set():
            if not go.wait(0.05):
                continue
            idle.clear()
            t0, mine = time.perf_counter(), 0
            while go.is_set() and not stop.is_set():
                if window == 1:
                    latency.append(commit(w, *edges(rng, n, None, cfg["batch"])))
                else:
                    w.add_edges("_E", *edges(rng, n, None, cfg["batch"]))
                    w.submit(tag=time.perf_counter())
                    latency += answered(w)
                mine += cfg["batch"]
                ahead = t0 + mine / cfg["rate"] - time.perf_counter()
                if ahead > 0:
                    stop.wait(ahead)
            if window > 1:  # the last batches decided before the next epoch
                w.flush()
                latency += answered(w)
            sent[0] += mine
            sent[1] += time.perf_counter() - t0
            idle.set()
    if latency:
        sent[2], sent[3] = np.percentile(latency, [50, 99])


def answered(w: Any) -> list[float]:
    """The latencies of ``w``'s batches answered since the last call, each submitted
    with its submit time as its tag (``GraphWriter.answered``)."""
    now = time.perf_counter()
    return [now - float(a.tag) for a in w.answered()]


def order(pairs: int) -> str:
    """The epochs' kinds in turn: ``U`` undisturbed, ``I`` ingesting (U I I U U I ...)."""
    return "".join("UI" if k % 2 == 0 else "IU" for k in range(pairs))


def lead(kind: str, go: Any, wait: Any = time.sleep) -> None:
    """Before an epoch of ``kind``: an ingesting one's ingest set going (``go``), and
    ``LEAD_S`` waited for either kind, so that the ingest is under way at an ingesting
    epoch's start and what an ingest left (the servers indexing its last commits) is
    not in the undisturbed epoch that follows it."""
    if kind == "I":
        go.set()
    wait(LEAD_S)


def _compactions(cfg: dict[str, Any], c: Any) -> int:
    """The compactions made so far, by every partition's server and replica (a replica
    compacts by itself, as its primary does)."""
    from graphrun.rpc.auth import load_keys
    from graphrun.rpc.transport import RpcClient

    parts = range(len(cfg["addresses"]))
    calls = [c.session.call(p, "live_compact", {}, main_only=True) for p in parts]
    made = sum(int(m.body["compactions"]) for m in calls)
    for kw in cfg.get("replica_kwargs", []):
        with RpcClient(kw["address"], keys=load_keys(kw["key_file"]), timeout=30) as r:
            made += int(r.call("live_compact", {}).body["compactions"])
    return made


def epochs(cfg: dict[str, Any], server_pids: list[int]) -> dict[str, Any]:
    """The pairs of epochs (see the module docstring); ``server_pids``: the partition
    servers' processes, replicas too (their CPU per epoch)."""
    import torch

    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    ctx = mp.get_context("spawn")
    train_epoch(cfg, 2)  # warm-up: the first batches pay for imports and first connections
    ready, go, idle, stop = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
    sent = ctx.Array("d", 4)
    proc = ctx.Process(target=ingest_at, args=(cfg, ready, go, idle, stop, sent))
    proc.start()
    assert proc.pid is not None  # started
    runs: dict[str, list[dict[str, float]]] = {"U": [], "I": []}
    try:
        if not ready.wait(READY_S):
            raise GraphrunError("bench live: the ingesting process did not start")
        with client(cfg, cfg["writer_key"]) as admin:
            for kind in order(cfg["epoch_pairs"]):
                lead(kind, go)
                runs[kind].append(_measured(cfg, admin, server_pids, proc.pid))
                go.clear()
                if not idle.wait(READY_S):  # its last commit is in before the next epoch
                    raise GraphrunError("bench live: the ingesting process did not pause")
    finally:
        stop.set()
        go.clear()
        proc.join(120)
        if proc.is_alive():  # stuck in a commit: it must not write into the next phase
            proc.kill()
            proc.join()
    reached = sent[0] / sent[1] if sent[1] else 0.0
    out = summary(runs, cfg["rate"], reached, torch.get_num_threads())
    return {**out, "epoch_window": int(cfg.get("epoch_window", 1)),
            "epoch_ack_p50_s": round(sent[2], 5), "epoch_ack_p99_s": round(sent[3], 5)}  # fmt: skip


def _measured(
    cfg: dict[str, Any], admin: Any, server_pids: list[int], writer: int
) -> dict[str, float]:
    """One epoch's wall time, with the CPU each process took during it."""
    c0 = [cpu_s(p) for p in server_pids], cpu_s(writer), time.process_time()
    k0 = _compactions(cfg, admin)
    run = train_epoch(cfg)
    c1 = [cpu_s(p) for p in server_pids], cpu_s(writer), time.process_time()
    return {
        "wall_s": run.wall_s,
        "nodes": run.nodes,
        "edges": run.edges,
        "trainer": c1[2] - c0[2],
        "servers": sum(b - a for a, b in zip(c0[0], c1[0], strict=True)),
        "writer": c1[1] - c0[1],
        "compactions": _compactions(cfg, admin) - k0,
    }


def summary(
    runs: dict[str, list[dict[str, float]]], rate: float, reached: float, threads: int
) -> dict[str, Any]:
    """The bench's JSON fields of the epochs ``runs`` (per kind, in the order run)."""

    def med(kind: str, key: str) -> float:
        return round(float(np.median([r[key] for r in runs[kind]])), 3)

    names = {"U": "undisturbed", "I": "ingesting"}
    return {
        "epoch_s_undisturbed": med("U", "wall_s"),
        "epoch_s_ingesting": med("I", "wall_s"),
        "epochs_s": {names[k]: [round(r["wall_s"], 3) for r in v] for k, v in runs.items()},
        "epoch_pairs": len(runs["U"]),
        "epochs_cpu_s": {  # each epoch's [trainer, servers, writer]
            names[k]: [[round(r[key], 3) for key in CPU_OF] for r in v] for k, v in runs.items()
        },
        "epoch_cpu_s": {names[k]: {key: med(k, key) for key in CPU_OF} for k in runs},
        "epochs_batch": {  # each epoch's batches' mean [nodes, edges]
            names[k]: [[round(r[key], 1) for key in BATCH_OF] for r in v] for k, v in runs.items()
        },
        "epoch_batch": {names[k]: {key: med(k, key) for key in BATCH_OF} for k in runs},
        "compactions_in_epochs": {
            names[k]: int(sum(r["compactions"] for r in v)) for k, v in runs.items()
        },
        "trainer_threads": threads,
        "ingest_rate_edges_per_s": rate,
        "ingest_rate_reached_edges_per_s": round(reached, 1),
        **pair_ratios(runs),
    }


def pair_ratios(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Each pair's ingesting epoch over its undisturbed one, less 1 (pair k: the k-th of
    each kind, run next to each other), and their median: the machine's speed drifting
    over a run (a VM's moved 2x in minutes: benchmarks/README.md, "Quiet runs at stop
    64") weighs on both epochs of a pair alike, less on the medians of each kind."""
    pairs = [i["wall_s"] / u["wall_s"] - 1 for u, i in zip(runs["U"], runs["I"], strict=False)]
    median = round(float(np.median(pairs)), 4) if pairs else None
    return {"epoch_pair_ratios": [round(r, 4) for r in pairs], "epoch_pair_ratio_median": median}
