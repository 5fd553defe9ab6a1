"""``graphrun demo``: the whole pipeline on one machine in about 15 seconds (2 cores).

1. generate a community graph (100k nodes, 2M edges, 64 noisy features, 10 classes);
2. partition it in 2 with METIS and print the partition quality;
3. run a 2-machine job locally (per machine one store server and one trainer, every
   role a process) training GraphSAGE for a few epochs, with progress;
4. print GraphSAGE's test accuracy next to an MLP trained on the same features;
5. write the job's report (``graphrun report``: one HTML file) and print its path.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from graphrun.arguments import integer

MAX_EPOCHS = 1_000_000  # the job spec's (graphrun/job/spec/base.py), without pydantic here
NODES = (100, 10_000_000)  # two parts with training nodes each; a graph that fits a laptop


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="generate, partition and train on 2 local machines (about 15 seconds)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nodes", type=integer(*NODES), default=100_000,
                   help="nodes of the generated graph")  # fmt: skip
    p.add_argument("--epochs", type=integer(1, MAX_EPOCHS), default=3,
                   help="GraphSAGE training epochs")  # fmt: skip
    p.add_argument("--workdir", type=Path, help="keep dataset, partitions and logs here")
    p.add_argument(
        "--hosts", choices=("local", "netns"), default="local", help="machines as process "
        "groups on loopback or as network-namespace hosts (root)"
    )  # fmt: skip
    p.add_argument("--no-train", action="store_true", help="stop after generating and partitioning")
    p.add_argument(
        "--report", type=Path, help="the HTML report to write (default: RUN/report.html with "
        "--workdir, else graphrun-demo-report.html in this directory)",
    )  # fmt: skip
    p.set_defaults(func=run)


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def demo_job(workdir: Path, epochs: int, hosts: str) -> Path:
    """The GraphJob the demo runs (written next to its data, shown in the README)."""
    job = {
        "apiVersion": "graphrun.io/v1alpha1",
        "kind": "GraphJob",
        "metadata": {"name": "demo"},
        "spec": {
            "graph": {"dataset": "data"},
            "partition": {"method": "metis", "parts": 2, "output": "parts"},
            "runtime": {"machines": 2, "storeServersPerMachine": 1, "trainersPerMachine": 1,
                        "hosts": hosts},
            "training": {"task": "node-classification", "model": "sage", "epochs": epochs,
                         "batchSize": 1000, "fanouts": [10, 5], "hidden": 128, "lr": 0.003},
            "runPolicy": {"activeDeadlineSeconds": 900},
        },
    }  # fmt: skip
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def train_job(job_file: Path) -> tuple[float, Path]:
    """Run the demo job; returns the final test accuracy the trainers reported and the
    run directory."""
    import json
    import threading

    from graphrun.errors import RunFileError
    from graphrun.job.spec import load_job
    from graphrun.local.console import Console
    from graphrun.local.runner import LocalJob, RunOptions
    from graphrun.record import parse_epoch
    from graphrun.signals import stop_on_signals

    stop = threading.Event()
    stop_on_signals(stop, say="stopping the job")
    sink = Console(sys.stdout)  # phases, progress, one line per epoch; the rest in logs/
    report = LocalJob(load_job(job_file), job_file, RunOptions(), sink=sink, stop=stop).run()
    lines = (report.paths.run_dir / "metrics.jsonl").read_text().splitlines()
    last = parse_epoch(json.loads(lines[-1]), "metrics.jsonl", RunFileError)
    return float(last.test_acc or 0.0), report.paths.run_dir


def run(args: argparse.Namespace) -> int:
    from graphrun.graph import save_dataset
    from graphrun.graph.generate import GenParams, community
    from graphrun.partition import partition_graph

    t0 = time.monotonic()
    keep = args.workdir is not None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="graphrun-demo-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        data, parts = workdir / "data", workdir / "parts"
        say(f"1/4 generating a community graph with {args.nodes:,} nodes ...")
        graph = community(GenParams(nodes=args.nodes, seed=0))
        if not data.exists():
            save_dataset(graph, data)
        say(f"    {graph.num_nodes:,} nodes, {graph.num_edges:,} edges -> {data}")
        say("2/4 partitioning in 2 with METIS ...")
        if parts.exists():
            shutil.rmtree(parts)
        res = partition_graph(graph, parts, 2, "metis", balance_train=True)
        say(f"    {res.quality.summary()} ({res.seconds:.1f}s) -> {parts}")
        if args.no_train:
            return 0
        from graphrun.train.baseline import mlp_baseline

        job_file = demo_job(workdir, args.epochs, args.hosts)
        say(f"3/4 training GraphSAGE on 2 local machines ({job_file}) ...")
        sage, run_dir = train_job(job_file)
        say("4/4 training an MLP on the same features (no graph) ...")
        mlp = mlp_baseline(graph, epochs=max(20, args.epochs * 10))
        say(f"test accuracy: GraphSAGE {sage:.3f}   MLP {mlp:.3f}")
        from graphrun.report import write_report

        default = run_dir / "report.html" if keep else Path("graphrun-demo-report.html")
        out = write_report(run_dir, args.report or default).resolve()
        say(f"report: {out} (open it in a browser)")
        if keep:
            say(f"TensorBoard: tensorboard --logdir {run_dir / 'tensorboard'}")
        say(f"done in {time.monotonic() - t0:.0f}s")
        return 0
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"kept {workdir}")
        sys.stdout.flush()
