"""``graphrun ps --index J``: a parameter server of a job (one shard of its dense parameters)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from graphrun.arguments import add_plaintext_flags, integer, output_file

MAX_INDEX = 63  # runtime.parameterServers is at most 64 (graphrun.job.spec.runtime)

DESCRIPTION = """\
Serve shard J of a job's dense parameters until stopped (a `stop` request from the
job's trainer 0, SIGTERM or Ctrl-C). The trainers of a job with `training.sync: ps`
push their gradients here and pull fresh parameters each step; the server owns the
optimizer state (Adam) and applies the updates (graphrun.store.ps_state). The launcher
and the operator start these roles (`ps:J`); a person rarely does.

Every message is authenticated and encrypted (CURVE) with the job's key (--key-file):
only the job's own processes get in.

Example:
  graphrun ps --index 0 --address tcp://0.0.0.0:7100 --key-file runs/job/keys/job.key
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "ps",
        help="serve a job's parameter-server shard",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--index", type=integer(0, MAX_INDEX), required=True, help="shard J (role ps:J)")
    p.add_argument("--address", default="tcp://127.0.0.1:0", help="ZeroMQ address to bind")
    p.add_argument("--key-file", type=Path, help="the job's key file (CURVE)")
    add_plaintext_flags(p)
    p.add_argument(
        "--profile", type=output_file, metavar="FILE",
        help="at stop, append this server's CPU seconds and pushes (a placement profile line)",
    )  # fmt: skip
    p.add_argument("--log-level", type=str.upper, default="INFO",
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"))  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphrun.arguments import check_plaintext_address
    from graphrun.errors import ArgumentError
    from graphrun.rpc.addresses import check_address
    from graphrun.rpc.auth import load_keys
    from graphrun.store.ps_server import PSConfig, run_ps

    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if (args.key_file is None) == (not args.insecure):
        raise ArgumentError("--key-file: give the job's key file (or --insecure, for tests)")
    check_address(args.address)
    check_plaintext_address("--address", args.address, args.insecure, args.insecure_non_loopback)
    keys = load_keys(args.key_file) if args.key_file else None
    stop = {"flag": False}

    def on_signal(signum: int, frame: Any) -> None:
        stop["flag"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def on_ready(address: str) -> None:
        print(f"graphrun ps: ps:{args.index} ready on {address}", flush=True)

    cfg = PSConfig(args.index, args.address, keys, args.profile)
    run_ps(cfg, lambda: stop["flag"], on_ready)
    return 0
