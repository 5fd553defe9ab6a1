"""``graphrun bench train``: distributed GraphSAGE against single-process PyG, JSON out.

With ``--sync allreduce,ps,ps-async`` the job runs once per mode (DDP's all-reduce,
synchronous parameter servers, bounded-staleness asynchronous ones) on the same
partitions; each line then has ``sync`` and, beside an all-reduce run,
``test_acc_minus_allreduce`` and ``epoch_ratio_to_allreduce``.

Partitions ``--dataset`` in 2 (METIS by default, ``--partition-mode``; training nodes
balanced), runs a 2-machine job (1 store server + 1 trainer each; ``--hosts local`` on
loopback or ``netns`` as network-namespace hosts) training GraphSAGE (hidden 128, fanout
[25, 10], batch 1000 per trainer) for ``--epochs``, and — in the same run — PyG's
``NeighborLoader`` with the same model on the whole graph in one process. Prints one
JSON object per aggregation path (``--aggr scatter|csr|both``)::

    {"bench": "train", "hosts": "local", "aggr": "scatter", "epochs": 10,
     "partition_mode": "single" (``--partition-mode``), "edge_cut": of the partitions,
     "epoch_s": median seconds per training epoch (all trainers in parallel),
     "epoch_s_all": [...], "test_acc": after the last epoch,
     "eval_s": seconds of the last evaluation (val and test, ``--evaluation``),
     "time_to_acc": seconds of training until test accuracy first reached target_acc,
     "time_to_first_step_s": from starting the job to trainer 0's first step,
     "peak_rss_mb": {"m0": .., "m1": ..} (proportional set size of each machine's roles),
     "pyg_epoch_s": .., "pyg_test_acc": .., "pyg_time_to_acc": ..  (null without
     pyg-lib / torch-sparse, which PyG's NeighborLoader needs),
     "single_epoch_s": .., "single_test_acc": ..  (the same model and sampling kernels in
     one process on the whole graph), "load_avg": [...],
     "distdgl_epoch_s": .., "distdgl_test_acc": .., "distdgl_eval_s": ..,
     "distdgl_peak_rss_mb": {...}, "ratio_to_distdgl": epoch_s / distdgl_epoch_s
     (with ``--peer distdgl``: DistDGL on the same hosts, :mod:`graphrun.bench.distdgl`)}
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphrun.arguments import integer, integers, number, output_dir
from graphrun.bench import (
    MAX_BATCH_SIZE,
    MAX_EPOCHS,
    MAX_FANOUT,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_THREADS,
)
from graphrun.errors import ArgumentError
from graphrun.names import RoleName
from graphrun.record import FirstStep, Model, console_events

if TYPE_CHECKING:
    import torch


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train",
        help="distributed GraphSAGE (2 machines) vs single-process PyG",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dataset", type=Path, required=True, help="dataset directory")
    p.add_argument("--epochs", type=integer(1, MAX_EPOCHS), default=10)
    p.add_argument("--hosts", choices=("local", "netns"), default="local")
    p.add_argument("--aggr", choices=("scatter", "csr", "both"), default="csr")
    p.add_argument("--batch-size", type=integer(1, MAX_BATCH_SIZE), default=1000)
    p.add_argument("--fanouts", type=integers(-1, MAX_FANOUT, MAX_LAYERS), default=[25, 10],
                   help="comma-separated, one per layer (-1: all)")  # fmt: skip
    p.add_argument("--hidden", type=integer(1, MAX_HIDDEN), default=128)
    p.add_argument(
        "--threads",
        type=integer(1, MAX_THREADS),
        default=None,
        help="torch intra-op threads of each trainer (default: torch's, the machine's cores)",
    )
    p.add_argument(
        "--evaluation",
        choices=("auto", "layerwise", "sampled"),
        default=None,
        help="training.evaluation of the job (default: the spec's, auto)",
    )
    p.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        help="training.precision of the job (default: the spec's, auto)",
    )
    p.add_argument(
        "--feature-cache-mb",
        type=integer(0, 1 << 20),
        default=None,
        help="runtime.featureCacheMb of the job (default: the spec's default)",
    )
    p.add_argument(
        "--store-features",
        choices=("memory", "disk", "both"),
        default="memory",
        help="runtime.storeFeatures.storage of the job; both: each in turn on the same "
        "partitions, the disk run's record with its epoch's ratio to memory's and whether "
        "the losses are equal (docs/disk-features.md)",
    )
    p.add_argument(
        "--disk-cache-mb",
        type=number(0, float(1 << 30)),
        default=0.0,
        help="with --store-features disk or both: runtime.storeFeatures.cacheMb, each "
        "server's cache",
    )
    p.add_argument(
        "--sampler-workers",
        type=integer(0, 64),
        default=None,
        help="sampler worker processes per trainer (samplerWorkersPerTrainer; default: the "
        "spec's, 0 for CPU trainers and 4 for GPU trainers)",
    )
    p.add_argument("--bandwidth-mbit", type=number(0, 1e6, above=True),
                   help="with --hosts netns: link rate")  # fmt: skip
    p.add_argument(
        "--cluster", type=Path,
        help="with --hosts netns: a cluster file shaping each host (machines m0, m1: CPU "
        "share, memory, link rate), e.g. one link at 1 Gbit/s",
    )  # fmt: skip
    p.add_argument("--no-pyg", action="store_true", help="skip the single-process PyG baseline")
    p.add_argument(
        "--peer",
        choices=("distdgl",),
        help="also run this system in the same run, same graph, hosts and settings "
        "(distdgl: needs --hosts netns and --peer-python; see graphrun.bench.distdgl)",
    )
    p.add_argument("--peer-python", type=Path, help="the peer's Python (a venv with dgl 2.1)")
    p.add_argument("--peer-timeout", type=number(0, 7 * 86400, above=True), default=7200.0,
                   help="seconds (default 7200)")  # fmt: skip
    p.add_argument(
        "--no-single", action="store_true", help="skip graphrun's own single-process baseline"
    )
    p.add_argument(
        "--partition-mode",
        choices=("single", "parallel", "distributed"),
        default="single",
        help="how the 2 partitions are made: single (METIS, the default), parallel "
        "(KaMinPar) or distributed (2 ranks over a 2-chunk copy of the dataset)",
    )
    p.add_argument(
        "--sync",
        default="allreduce",
        help="comma-separated, each run in turn on the same partitions: allreduce (DDP), "
        "ps (synchronous parameter servers), ps-async (bounded staleness, --staleness); "
        "e.g. allreduce,ps,ps-async (default allreduce)",
    )
    p.add_argument("--staleness", type=int, default=2, help="ps-async: training.staleness")
    p.add_argument(
        "--parameter-servers", type=int, default=1, help="ps modes: runtime.parameterServers"
    )
    p.add_argument("--workdir", type=output_dir, help="keep partitions and logs here")
    p.add_argument("--eval-last", action="store_true", help="evaluate after the last epoch only")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the job with GPU trainers and, in the same run, with CPU trainers on the "
        "same machine (graphrun.bench.gpu; no PyG or single-process baselines)",
    )
    p.set_defaults(func=run)


SYNCS = ("allreduce", "ps", "ps-async")


def sync_modes(text: str, staleness: int, servers: int) -> list[str]:
    """The ``--sync`` list, checked (one line naming the flag when wrong)."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in SYNCS]
    if not modes or bad or len(set(modes)) != len(modes):
        raise ArgumentError(f"--sync: expected distinct modes of {', '.join(SYNCS)}, got {text!r}")
    if "ps-async" in modes and not 1 <= staleness <= 1000:
        raise ArgumentError(f"--staleness: expected 1..1000, got {staleness}")
    if not 1 <= servers <= 64:
        raise ArgumentError(f"--parameter-servers: expected 1..64, got {servers}")
    return modes


def make_partitions(graph: Any, workdir: Path, mode: str) -> float:
    """The 2 balanced partitions the job trains on, by ``mode``; their edge cut."""
    from graphrun.partition import load_partition_config, partition_graph

    out = workdir / "parts"
    if not (out / "partition.json").is_file():
        if mode == "distributed":
            from graphrun.graph.chunked import save_chunked
            from graphrun.partition.distributed import DistOptions, run_local

            chunked = workdir / "chunked-2"
            if not (chunked / "chunks.json").is_file():
                save_chunked(graph, chunked, 2)
            run_local(chunked, out, 2, DistOptions(balance_train=True))
        else:
            method = "kaminpar" if mode == "parallel" else "metis"
            partition_graph(graph, out, 2, method, balance_train=True)
    return float(load_partition_config(out)["quality"]["edge_cut"])


class RssSampler(threading.Thread):
    """Peak proportional set size (MiB) per machine, summed over its roles, and per role
    (from the workers' status files)."""

    def __init__(self, status_dir: Path, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.status_dir, self.interval = status_dir, interval
        self.peak: dict[str, float] = {}
        self.role_peak: dict[RoleName, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil

        from graphrun.record import read_status

        while not self.stop.wait(self.interval):
            for f in self.status_dir.glob("*.json"):
                st = read_status(f)
                total = 0
                for name, pid in (st.pids() if st is not None else {}).items():
                    try:
                        mem = psutil.Process(pid).memory_full_info()
                    except psutil.Error:
                        continue
                    size = getattr(mem, "pss", mem.rss)
                    total += size
                    self.role_peak[name] = max(self.role_peak.get(name, 0.0), size / 2**20)
                m = st.machine if st is not None else f.stem
                self.peak[m] = max(self.peak.get(m, 0.0), total / 2**20)


def run_sampled(path: Path, opts: Any, log: Path) -> tuple[str, RssSampler]:
    """Run the GraphJob file ``path`` with ``RunOptions`` ``opts`` (``run_dir`` set) while
    an :class:`RssSampler` watches its roles; its output goes to ``log``, also when it
    fails (JobFailed then propagates). Returns the output and the sampler."""
    import io

    from graphrun.job.spec import load_job
    from graphrun.local.runner import LocalJob

    sink = io.StringIO()
    rss = RssSampler(opts.run_dir / "status")
    rss.start()
    try:
        LocalJob(load_job(path), path, opts, sink=sink).run()
    finally:
        rss.stop.set()
        rss.join()
        log.write_text(sink.getvalue())
    return sink.getvalue(), rss


def _job_yaml(
    workdir: Path,
    args: argparse.Namespace,
    gpus: int = 0,
    name: str = "job.yaml",
    sync: str = "allreduce",
    storage: str = "memory",
) -> Path:
    """The benchmark's GraphJob; ``gpus``: ``runtime.gpusPerMachine`` (0: CPU trainers);
    ``sync``: allreduce, ps or ps-async."""
    import yaml

    runtime: dict[str, object] = {"machines": 2, "hosts": args.hosts}
    training: dict[str, object] = {
        "task": "node-classification", "epochs": args.epochs, "batchSize": args.batch_size,
        "fanouts": args.fanouts, "hidden": args.hidden, "lr": 0.003, "dropout": 0.5,
    }  # fmt: skip
    if args.sampler_workers is not None:
        runtime["samplerWorkersPerTrainer"] = args.sampler_workers
    if gpus:
        runtime["gpusPerMachine"] = gpus
    if args.eval_last:
        training["evalEvery"] = args.epochs
    if sync != "allreduce":
        training["sync"] = "ps"
        runtime["parameterServers"] = args.parameter_servers
        if sync == "ps-async":
            training["staleness"] = args.staleness
    if args.evaluation is not None:
        training["evaluation"] = args.evaluation
    if args.precision is not None:
        training["precision"] = args.precision
    if args.feature_cache_mb is not None:
        runtime["featureCacheMb"] = args.feature_cache_mb
    if storage != "memory":
        runtime["storeFeatures"] = {"storage": storage, "cacheMb": args.disk_cache_mb}
    job = {
        "apiVersion": "graphrun.io/v1alpha1", "kind": "GraphJob",
        "metadata": {"name": "bench"},
        "spec": {
            "graph": {"dataset": str(args.dataset.resolve())},
            "partition": {"parts": 2, "output": str(workdir / "parts")},
            "runtime": runtime,
            "training": training,
        },
    }  # fmt: skip
    path = workdir / name
    path.write_text(yaml.safe_dump(job))
    return path


def _time_to(accs: list[float | None], times: list[float], target: float) -> float | None:
    """Seconds of training until the first evaluation at ``target`` (None: not evaluated)."""
    elapsed = 0.0
    for acc, t in zip(accs, times, strict=True):
        elapsed += t
        if acc is not None and acc >= target:
            return round(elapsed, 3)
    return None


def run_distributed(
    args: argparse.Namespace,
    workdir: Path,
    aggr: str,
    sync: str = "allreduce",
    tag: str = "",
    gpus: int = 0,
    trainer_args: tuple[str, ...] = (),
    storage: str = "memory",
) -> dict[str, Any]:
    """The 2-machine job (``gpus`` per machine, dense gradients by ``sync``; ``tag``
    names its run directory and log); its median epoch, accuracy, start-up, memory and
    per-stage breakdown."""
    from graphrun.local.runner import RunOptions

    parts = (aggr, "" if sync == "allreduce" else sync, "" if storage == "memory" else storage)
    name = "-".join(x for x in (*parts, tag) if x)
    path = _job_yaml(workdir, args, gpus, f"job-{name}.yaml", sync, storage)
    run_dir = workdir / f"run-{name}"
    shutil.rmtree(run_dir, ignore_errors=True)
    threads = ("--threads", str(args.threads)) if args.threads else ()
    opts = RunOptions(
        run_dir=run_dir, hosts=args.hosts, bandwidth_mbit=args.bandwidth_mbit,
        cluster=args.cluster,
        trainer_args=("--aggr", aggr, *threads, *trainer_args),
        profile_dir=run_dir / "profile",
    )  # fmt: skip
    t0 = time.time()
    out, sampler = run_sampled(path, opts, workdir / f"job-{name}.log")
    events = console_events(out)
    first = next((e.time for e in events if isinstance(e, FirstStep)), None)
    precision = next((e.precision for e in events if isinstance(e, Model)), None)
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [r["epoch_s"] for r in recs]
    return {
        "precision": precision,
        "epoch_s": round(statistics.median(times), 4),
        "epoch_s_all": times,
        "test_acc": recs[-1]["test_acc"],
        "test_acc_all": [r.get("test_acc") for r in recs],  # --eval-last: the last only
        "eval_s": recs[-1].get("eval_s"),
        "time_to_first_step_s": round(first - t0, 2) if first else None,
        "peak_rss_mb": {m: round(v, 1) for m, v in sorted(sampler.peak.items())},
        "step": step_breakdown(run_dir / "profile"),
        "steps": recs[-1].get("steps"),
        "device_stats": {k: v for k, v in recs[-1].items() if k.startswith(("gpu_", "h2d_"))},
        "loss_all": [r["loss"] for r in recs],
        **{f"{k}_all": [r[k] for r in recs] for k in ("disk_hit_rate", "disk_bytes")
           if k in recs[-1]},  # features on disk: the cache's hits, the bytes read
    }  # fmt: skip


def storage_fields(storage: str, args: argparse.Namespace, dist: dict[str, Any],
                   memory: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """The record's store-feature fields; a disk run after a memory run of the same
    partitions also gets its epoch's ratio to memory's and whether the losses are equal."""
    out: dict[str, Any] = {"store_features": storage}
    if storage == "memory":
        return out
    out["disk_cache_mb"] = args.disk_cache_mb
    if memory is not None:
        out["epoch_ratio_to_memory"] = round(dist["epoch_s"] / memory["epoch_s"], 3)
        out["same_losses"] = dist["loss_all"] == memory["loss_all"]
    return out


def step_breakdown(profile_dir: Path) -> dict[str, Any]:
    """Medians over every trainer's batch records: milliseconds sampling, pulling features
    and computing a step, and megabytes of features per batch pulled over the network
    (from partitions other than the trainer's own), read from shared memory (its own
    partition) and served by the remote-feature cache."""
    from graphrun.placement.profile import read_records

    recs = [r for f in sorted(profile_dir.glob("trainer-*.jsonl")) for r in read_records(f)]
    if not recs:
        return {}

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 2)

    return {
        "sample_ms": med([r.sample_s * 1e3 for r in recs]),
        "fetch_ms": med([r.fetch_s * 1e3 for r in recs]),
        "compute_ms": med([r.compute_s * 1e3 for r in recs]),
        "remote_feature_mb": med(
            [sum(v for p, v in r.feature_bytes.items() if p != r.partition) / 1e6 for r in recs]
        ),
        "local_feature_mb": med([r.feature_bytes.get(r.partition, 0) / 1e6 for r in recs]),
        "cache_mb": med([r.cache_bytes / 1e6 for r in recs]),
    }


def pyg_forward(model: torch.nn.Module, b: Any) -> torch.Tensor:
    """PyG's ``GraphSAGE`` on a ``NeighborLoader`` batch, trimmed per layer when the loader
    gives per-hop counts (pyg-lib); its torch-sparse sampler does not, and then every
    layer runs over the whole sampled subgraph."""
    nodes, edges = getattr(b, "num_sampled_nodes", None), getattr(b, "num_sampled_edges", None)
    if nodes is None or edges is None:
        return model(b.x, b.edge_index)
    return model(
        b.x, b.edge_index, num_sampled_nodes_per_hop=nodes, num_sampled_edges_per_hop=edges
    )


def run_pyg(args: argparse.Namespace) -> dict[str, Any]:
    """PyG NeighborLoader on the whole graph in this process (needs pyg-lib/torch-sparse)."""
    import torch_geometric.typing as pyg_typing

    if not (pyg_typing.WITH_TORCH_SPARSE or pyg_typing.WITH_PYG_LIB):
        note = "NeighborLoader needs pyg-lib or torch-sparse; neither is installed"
        return {"pyg_epoch_s": None, "pyg_test_acc": None, "pyg_time_to_acc": None,
                "pyg_note": note}  # fmt: skip
    import torch
    import torch.nn.functional as F
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.nn.models import GraphSAGE

    from graphrun.graph import load_dataset
    from graphrun.graph.pyg import to_pyg

    data = to_pyg(load_dataset(args.dataset, mmap=False))
    fanouts = list(args.fanouts)
    classes = int(data.y.max()) + 1
    # PyG's own model, as a PyG user writes it (not graphrun's SAGE)
    model = GraphSAGE(data.x.size(1), args.hidden, len(fanouts), classes, dropout=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    train = NeighborLoader(data, fanouts, batch_size=args.batch_size, shuffle=True,
                           input_nodes=data.train_mask)  # fmt: skip
    test = NeighborLoader(data, fanouts, batch_size=4096, input_nodes=data.test_mask)
    times, accs = [], []
    for _ in range(args.epochs):
        model.train()
        t = time.perf_counter()
        for b in train:
            opt.zero_grad()
            out = pyg_forward(model, b)
            F.cross_entropy(out[: b.batch_size], b.y[: b.batch_size]).backward()
            opt.step()
        times.append(time.perf_counter() - t)
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for b in test:
                out = pyg_forward(model, b)
                correct += int((out[: b.batch_size].argmax(-1) == b.y[: b.batch_size]).sum())
                total += b.batch_size
        accs.append(correct / max(total, 1))
    return {"pyg_epoch_s": round(statistics.median(times), 4), "pyg_test_acc": accs[-1],
            "pyg_epoch_s_all": [round(t, 4) for t in times], "pyg_test_acc_all": accs}  # fmt: skip


def run_single(args: argparse.Namespace) -> dict[str, Any]:
    """The same model and sampler in one process on the whole graph (graphrun's kernels)."""
    import contextlib
    import io

    from graphrun.graph import load_dataset
    from graphrun.train.config import Fanouts, TrainConfig
    from graphrun.train.context import TrainContext
    from graphrun.train.data import LocalData
    from graphrun.train.ddp import DDPConfig
    from graphrun.train.loop import fit
    from graphrun.train.metrics import MetricsLog

    fanouts = Fanouts.of(args.fanouts)
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, fanouts=fanouts,
                      hidden=args.hidden)  # fmt: skip
    out = io.StringIO()
    data = LocalData(load_dataset(args.dataset, mmap=False))
    ctx = TrainContext(cfg, data, DDPConfig(0, 1, "127.0.0.1:0"), MetricsLog(None, out=out))
    with contextlib.redirect_stdout(io.StringIO()):
        fit(ctx)
    recs = [json.loads(x) for x in out.getvalue().splitlines()]
    times = [r["epoch_s"] for r in recs]
    return {"single_epoch_s": round(statistics.median(times), 4),
            "single_test_acc": recs[-1]["test_acc"], "single_epoch_s_all": times}  # fmt: skip


def sync_fields(
    sync: str, args: argparse.Namespace, dist: dict[str, Any], allreduce: dict[str, Any] | None
) -> dict[str, Any]:
    """``sync``, the parameter servers and staleness, and beside an allreduce run of the
    same invocation: the accuracy difference and the epoch ratio to it."""
    out: dict[str, Any] = {"sync": sync}
    if sync != "allreduce":
        out["parameter_servers"] = args.parameter_servers
        out["staleness"] = args.staleness if sync == "ps-async" else 0
        if allreduce is not None:
            out["test_acc_minus_allreduce"] = round(dist["test_acc"] - allreduce["test_acc"], 4)
            out["epoch_ratio_to_allreduce"] = round(dist["epoch_s"] / allreduce["epoch_s"], 3)
    return out


def run(args: argparse.Namespace) -> int:
    from graphrun.graph import load_dataset

    sync_modes(args.sync, args.staleness, args.parameter_servers)  # before any work

    if args.peer == "distdgl":
        from graphrun.bench.distdgl import check_peer_python

        if args.hosts != "netns":
            raise ArgumentError("--peer distdgl: needs --hosts netns (one DistDGL server per host)")
        check_peer_python(args.peer_python)
    if args.device == "cuda":
        from graphrun.bench.gpu import require_cuda

        if args.peer is not None:
            raise ArgumentError("--device cuda: runs no --peer")
        require_cuda()
    keep = args.workdir is not None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="graphrun-bench-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        graph = load_dataset(args.dataset)
        t_part = time.perf_counter()
        edge_cut = make_partitions(graph, workdir, args.partition_mode)
        if args.device == "cuda":
            from graphrun.bench.gpu import compare

            head = {
                "bench": "train", "dataset": str(args.dataset), "nodes": graph.num_nodes,
                "edges": graph.num_edges, "hosts": args.hosts, "epochs": args.epochs,
                "partition_mode": args.partition_mode, "edge_cut": round(edge_cut, 4),
                "partition_s": round(time.perf_counter() - t_part, 2),
            }  # fmt: skip
            aggr = "csr" if args.aggr == "both" else args.aggr
            got = compare(args, workdir, aggr, run_distributed)
            print(json.dumps({**head, **got}), flush=True)
            return 0
        base: dict[str, dict[str, Any]] = {}  # per aggr: the allreduce run, if any
        pyg = {} if args.no_pyg else run_pyg(args)
        single = {} if args.no_single else run_single(args)
        aggrs = ["scatter", "csr"] if args.aggr == "both" else [args.aggr]
        syncs = sync_modes(args.sync, args.staleness, args.parameter_servers)
        both = args.store_features == "both"
        storages = ["memory", "disk"] if both else [args.store_features]
        runs = [(a, m, f) for a in aggrs for m in syncs for f in storages]
        memory: dict[tuple[str, str], dict[str, Any]] = {}  # per aggr, sync: the memory run
        for aggr, sync, storage in runs:
            dist = run_distributed(args, workdir, aggr, sync, storage=storage)
            dist |= storage_fields(storage, args, dist, memory.get((aggr, sync)))
            if storage == "memory":
                memory[(aggr, sync)] = dist
            dist |= sync_fields(sync, args, dist, base.get(aggr))
            if sync == "allreduce" and storage == "memory":
                base[aggr] = dist
            peer: dict[str, Any] = {}
            if args.peer == "distdgl":
                from graphrun.bench.distdgl import run_distdgl

                peer = run_distdgl(args, workdir)
                peer["ratio_to_distdgl"] = round(dist["epoch_s"] / peer["distdgl_epoch_s"], 3)
            target = (pyg.get("pyg_test_acc") or dist["test_acc"]) - 0.01
            out: dict[str, Any] = {
                "bench": "train", "dataset": str(args.dataset), "nodes": graph.num_nodes,
                "edges": graph.num_edges, "hosts": args.hosts, "aggr": aggr,
                "partition_mode": args.partition_mode, "edge_cut": round(edge_cut, 4),
                "epochs": args.epochs, **dist,
                "time_to_acc": _time_to(dist["test_acc_all"], dist["epoch_s_all"], target),
                "target_acc": round(target, 4), **pyg, **single, **peer,
                "load_avg": [round(x, 2) for x in os.getloadavg()],
            }  # fmt: skip
            if pyg.get("pyg_test_acc") is not None:
                out["pyg_time_to_acc"] = _time_to(
                    pyg["pyg_test_acc_all"], pyg["pyg_epoch_s_all"], target
                )
                out["epoch_ratio"] = round(dist["epoch_s"] / pyg["pyg_epoch_s"], 3)
            print(json.dumps(out), flush=True)
        return 0
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
