"""``graphrun profile METRICS... -o PROFILE``: a job profile from runtime metrics."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from graphrun.arguments import output_file

DESCRIPTION = """\
Build a placement profile (empirical distributions of per-iteration compute times
and data volumes) from the JSON-lines metrics files a training run writes: one
{"kind": "batch", ...} record per mini-batch, one {"kind": "serve", ...} record per
store server and one {"kind": "ps", ...} per parameter server (`graphrun run --profile
DIR` writes them all: DIR/*.jsonl), schema in graphrun.placement.profile.
Use the result as `profile:` in a PlacementJob for `graphrun plan`.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "profile",
        help="build a placement profile from a run's metrics",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("metrics", type=Path, nargs="+", help="JSON-lines metrics file(s)")
    p.add_argument("-o", "--output", type=output_file, required=True, help="profile JSON to write")
    p.add_argument("--name", default=None, help="profile name (default: output file stem)")
    p.add_argument(
        "--skip",
        type=int,
        default=0,
        metavar="N",
        help="leave out each trainer's first N batches (warm-up: the first epoch's steps "
        "cost more CPU than the later ones; default 0)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphrun.errors import ArgumentError
    from graphrun.placement.profile import profile_from_records, read_metrics, save_profile

    if args.skip < 0:
        raise ArgumentError(f"--skip: must be >= 0, got {args.skip}")
    records, serves = read_metrics(args.metrics)
    if args.skip:  # iterations count from 1
        records = [r for r in records if r.iteration > args.skip]
    if not records:
        raise ArgumentError(f"--skip {args.skip}: leaves no batch records")
    prof = profile_from_records(records, args.name or args.output.stem, serves)
    save_profile(prof, args.output)
    means = ", ".join(f"{q}={e.mean:.4g}" for q, e in prof.quantities.items())
    print(f"{args.output}: {len(records)} batch records; means: {means}")
    return 0
