"""``graphrun run job.yaml``: run a whole GraphJob on this machine."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Any

from graphrun.arguments import number, output_dir

MAX_GRACE_S = 3600.0  # between SIGTERM and SIGKILL
MAX_MBIT = 1e6  # a link's rate: 1 Tbit/s

EPILOG = """\
Every role is a process: per machine one worker, its store servers and trainers.
Output lines carry a [role@machine] prefix; per-role logs are in RUN/logs/<machine>/.
A failed role fails the job (exit 1) naming the role, machine and exit code, unless
runPolicy.backoffLimit allows a restart from the last checkpoint. Ctrl-C or SIGTERM
stops every process of the job.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a GraphJob (YAML) on this machine",
        description="Partition, serve, sample and train: run a GraphJob with local processes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("job", type=Path, help="the GraphJob YAML file")
    p.add_argument("--resume", action="store_true", help="trainers resume from the checkpoint")
    p.add_argument(
        "--run-dir",
        type=output_dir,
        help="working directory of the job (default <job dir>/runs/<name>)",
    )
    p.add_argument(
        "--hosts",
        choices=("local", "netns"),
        help="machines as process groups on loopback, or as network-namespace hosts "
        "(root; default: the job's runtime.hosts)",
    )
    p.add_argument(
        "--bandwidth-mbit",
        type=number(0, MAX_MBIT, above=True),
        help="with --hosts netns: shape every link to this rate",
    )
    p.add_argument(
        "--cluster",
        type=Path,
        help="with --hosts netns: a cluster file (as graphrun plan takes) giving every host "
        "its CPU share, memory limit and link rate",
    )
    p.add_argument(
        "--profile",
        type=output_dir,
        metavar="DIR",
        help="trainers write per-batch timing records (JSON lines) to DIR/trainer-<rank>.jsonl",
    )
    p.add_argument(
        "--grace",
        type=number(0, MAX_GRACE_S),
        default=5.0,
        help="seconds between SIGTERM and SIGKILL on stop",
    )
    p.add_argument(
        "--no-warm-start",
        dest="warm_start",
        action="store_false",
        help="start every trainer as a new interpreter (by default, where a host runs two or "
        "more CPU trainers, they fork from one warm server that imported torch and PyG once; "
        "$GRAPHRUN_WARM_SOCKET names a running one that this host's jobs share)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show every role's raw output (default: phases, trainer 0's progress and one "
        "line per epoch; everything is in RUN/logs/ and RUN/metrics.jsonl)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphrun.job.spec import load_job
    from graphrun.local.console import Console
    from graphrun.local.runner import LocalJob, RunOptions
    from graphrun.signals import stop_on_signals

    job = load_job(args.job)
    opts = RunOptions(
        run_dir=args.run_dir,
        resume=args.resume,
        hosts=args.hosts,
        grace_s=args.grace,
        bandwidth_mbit=args.bandwidth_mbit,
        cluster=args.cluster,
        profile_dir=args.profile.resolve() if args.profile else None,
        warm_start=args.warm_start,
    )
    stop = threading.Event()
    stop_on_signals(stop, say="stopping the job")
    sink = sys.stdout if args.verbose else Console(sys.stdout)
    local = LocalJob(job, args.job, opts, sink=sink, stop=stop)
    report = local.run()
    codes = ", ".join(f"{r}={c}" for r, c in report.exits.items() if r.kind == "trainer")
    print(
        f"[graphrun] job {job.name} {report.state.phase.value} in {report.elapsed_s:.1f}s "
        f"(trainers: {codes}; logs: {report.paths.run_dir / 'logs'})"
    )
    return 0
