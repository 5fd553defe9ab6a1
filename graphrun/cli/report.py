"""``graphrun report RUN_DIR [-o report.html]``: one self-contained HTML page of a run."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Write one self-contained HTML file (plots embedded as PNG; nothing fetched when it is
opened) about a job's run directory (RUN, e.g. runs/<name>/ beside the job file): loss
and metrics per epoch; epoch time and its breakdown (sampling, fetching, compute,
all-reduce) per trainer; CPU and peak memory per machine; which role ran on which
machine; for a job with a placement.planFile, the plan's predicted epoch beside the
measured one and the simulated schedules of the plan and of co-location. A failed
run renders what exists and says where it failed. TensorBoard reads RUN/tensorboard/.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report",
        help="an HTML report of a run: metrics, time per trainer, machines, the plan",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the job's run directory")
    p.add_argument(
        "-o", "--output", type=Path, help="the HTML file to write (default RUN_DIR/report.html)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphrun.report import write_report

    out = write_report(args.run_dir, args.output)
    print(f"report: {out}")
    return 0
