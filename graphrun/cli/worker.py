"""``graphrun worker``: run one machine of a job (its store servers, samplers and trainers).

Used by Kubernetes pods, by network-namespace hosts and by ``graphrun run`` itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphrun.arguments import number, output_dir
from graphrun.errors import ArgumentError
from graphrun.machine.stopmark import JOIN_ENV  # "1": --join (a replacement pod)

if TYPE_CHECKING:
    from graphrun.machine.launch import MachineLaunch

MAX_WAIT_S = 3600.0  # --grace, --stop-mark-wait


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "worker",
        help="run one machine of a job: its store servers, samplers and trainers",
        description=(
            "Start one machine's store servers, wait until every store server of the job "
            "accepts connections, then start its samplers and trainers; stop everything "
            "if any role fails. Exit 0 once its trainers succeeded and its store servers "
            "were stopped by the job or it was told to stop (SIGTERM) — at once for a "
            "machine without store servers — 1 if a role failed (the failing role, machine "
            "and exit code are printed and written to the status file). In an elastic job "
            "given --stop-mark, a SIGTERM without the mark is this machine leaving alone: "
            "its roles are killed at once and the others go on (exit 143). With "
            "GRAPHRUN_ELASTIC_JOIN=1 only the machine's trainers run (a replacement)."
        ),
    )
    p.add_argument("--job", type=Path, help="the GraphJob YAML")
    p.add_argument("--machine", help="this machine: its index (0, 1, ...) or name (m0, ...)")
    p.add_argument("--hosts-file", type=Path, help="the job's hosts file (JSON)")
    p.add_argument("--keys", type=Path, help="directory holding the job's key")
    p.add_argument("--resume", action="store_true", help="trainers resume from the checkpoint")
    p.add_argument(
        "--plan", type=Path, help="a resolved machine launch plan (JSON) instead of --job"
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        help="the job's run directory: metrics.jsonl and tensorboard/ (default: runs/<name> "
        "beside the job file)",
    )
    p.add_argument("--status-dir", type=output_dir, help="write STATUS_DIR/<machine>.json")
    p.add_argument("--log-dir", type=output_dir, help="write one log file per role here")
    p.add_argument(
        "--grace", type=number(0, MAX_WAIT_S), default=5.0,
        help="seconds between SIGTERM and SIGKILL",
    )  # fmt: skip
    p.add_argument(
        "--stop-mark",
        type=Path,
        help='runtime.elastic: a file that says graphrun.io/stop="job" when the whole job '
        "stops; a SIGTERM without it is this machine leaving alone (its roles are killed, the "
        "others go on) rather than a stop that checkpoints (the pods' downward-API file)",
    )
    p.add_argument(
        "--stop-mark-wait",
        type=number(0, MAX_WAIT_S),
        default=None,
        help="seconds to wait for the stop mark after SIGTERM (default 10)",
    )
    p.add_argument(
        "--join",
        action="store_true",
        help=f"this machine comes back into a running elastic job (also {JOIN_ENV}=1): start "
        "only its trainers, which join at the next epoch boundary, and no store servers "
        "(docs/elastic.md)",
    )
    p.add_argument(
        "--warm-socket",
        type=Path,
        help="fork CPU trainers from the warm server listening here (started by graphrun run "
        "for the machines of one host: graphrun.machine.warm); without it, or where it cannot, "
        "each trainer is a new interpreter",
    )
    p.set_defaults(func=run)


def _launch(args: argparse.Namespace) -> MachineLaunch:
    from graphrun.machine.launch import MachineLaunch

    if args.plan is not None:
        return MachineLaunch.read(args.plan)
    if args.job is None or args.machine is None or args.hosts_file is None:
        raise ArgumentError("worker: give --plan, or --job with --machine and --hosts-file")
    from graphrun.machine.roles import load_job_launch

    return load_job_launch(
        args.job, args.machine, args.hosts_file, args.keys, resume=args.resume,
        run_dir=args.run_dir,
    )  # fmt: skip


def _leave_alone(args: argparse.Namespace, elastic: bool) -> Callable[[], bool] | None:
    """Asked when told to stop while training: does this machine leave the job alone?
    (:mod:`graphrun.machine.stopmark`; without ``--stop-mark``: never)."""
    from graphrun.machine import stopmark

    if args.stop_mark is None or not elastic:
        return None
    parent = os.getppid()
    wait = stopmark.MARK_WAIT_S if args.stop_mark_wait is None else args.stop_mark_wait

    def leave_alone() -> bool:
        orphaned = os.getppid() != parent  # the launcher died: every machine stops
        marked = orphaned or stopmark.wait_for_mark(args.stop_mark, wait)
        return stopmark.leaves_alone(elastic, marked, orphaned)

    return leave_alone


def joins(args: argparse.Namespace, environ: Mapping[str, str]) -> bool:
    """Whether this machine comes back into a running elastic job: ``--join``, or
    ``GRAPHRUN_ELASTIC_JOIN=1`` (set by the operator on a replacement pod)."""
    return bool(args.join) or environ.get(JOIN_ENV, "") == "1"


def run(args: argparse.Namespace) -> int:
    from graphrun.machine.process import Supervisor
    from graphrun.machine.warm import WarmStarter
    from graphrun.machine.worker import run_machine
    from graphrun.names import RoleName
    from graphrun.signals import stop_on_signals

    launch = _launch(args)
    # a replacement pod of a lost machine (the operator sets the variable), or a lost
    # machine started again by graphrun run (--join): its trainers only
    if joins(args, os.environ):
        launch = launch.joining()
    launch = launch.with_trainer_openmp(os.environ)  # unless the job sets its own
    stop = threading.Event()
    stop_on_signals(stop)
    warm = WarmStarter(args.warm_socket) if args.warm_socket is not None else None
    sup = Supervisor[RoleName](log_dir=args.log_dir, sink=sys.stdout, grace_s=args.grace, warm=warm)
    with sup:
        leave = _leave_alone(args, launch.elastic)
        result = run_machine(launch, sup, stop, status_dir=args.status_dir, leave_alone=leave)
    if result.failure is not None:
        with contextlib.suppress(OSError):  # the launcher (our stderr) may be gone
            print(
                f"[worker@{launch.machine}] failed: {result.failure}", file=sys.stderr, flush=True
            )
        return 1
    return 0 if result.state == "done" else 143  # stopped, or left an elastic job alone
