"""``graphrun rendezvous``: serve a job's CURVE rendezvous apart from its trainers."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from graphrun.arguments import integer

DESCRIPTION = """\
Serve the table a job's trainers meet at (their torch.distributed store) until SIGTERM
or Ctrl-C. Trainer 0 serves it itself unless the hosts file says it is served apart
("rendezvous_external": true): the Kubernetes operator runs this command in a small
pod, <job>-rendezvous, for an elastic job (runtime.elastic), so the survivors of a lost
machine re-form there even when the machine lost is trainer 0's.

Every message is authenticated and encrypted (CURVE) with the job's key (--key-file):
a peer without it gets no answer and changes nothing. The table is bounded: keys and
values of at most --max-key and --max-value bytes, at most --max-keys keys and
--max-mb MiB of keys and values in all; a request beyond them is refused.

Example:
  graphrun rendezvous --bind 'tcp://*:30002' --key-file runs/job/keys/job.key
"""

# graphrun.rpc.rendezvous.Limits' defaults (not imported here: `graphrun --help` imports
# no zmq); tests/cli/test_rendezvous.py checks they agree
MAX_KEYS, MAX_KEY, MAX_VALUE, MAX_MB = 100_000, 1024, 64 * 1024, 64
# what the flags may raise them to: far above a job's need, far below a failed allocation
# (--max-value 1e20 was an OverflowError from ZeroMQ, --max-mb 1e15 was taken)
CAP_KEYS, CAP_KEY, CAP_VALUE, CAP_MB = 10_000_000, 64 * 1024, 16 << 20, 16 * 1024


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rendezvous",
        help="serve a job's trainer rendezvous apart (elastic jobs on Kubernetes)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bind", required=True, metavar="tcp://HOST:PORT",
                   help="ZeroMQ address to listen on, e.g. tcp://*:30002")  # fmt: skip
    p.add_argument("--key-file", type=Path, required=True, help="the job's key file (CURVE)")
    for flag, default, cap, what in (
        ("--max-keys", MAX_KEYS, CAP_KEYS, "keys held"),
        ("--max-key", MAX_KEY, CAP_KEY, "bytes of one key"),
        ("--max-value", MAX_VALUE, CAP_VALUE, "bytes of one value"),
        ("--max-mb", MAX_MB, CAP_MB, "MiB of keys and values in all,"),
    ):
        p.add_argument(
            flag, type=integer(1, cap), default=default,
            help=f"{what} at most (default {default}; {cap} at most)",
        )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphrun.errors import ArgumentError
    from graphrun.rpc.addresses import check_address
    from graphrun.rpc.auth import KeyPair, load_keys
    from graphrun.rpc.rendezvous import Limits, RendezvousServer

    if not args.bind.startswith("tcp://"):
        raise ArgumentError(f"--bind: {args.bind!r} is not tcp://HOST:PORT")
    try:
        check_address(args.bind)
    except ArgumentError as exc:
        raise ArgumentError(f"--bind: {exc}") from None
    keys = load_keys(args.key_file)
    limits = Limits(args.max_keys, args.max_key, args.max_value, args.max_mb << 20)
    # the job's own pair, never a running store's server key (as the trainers' key_store)
    try:
        server = RendezvousServer(args.bind, KeyPair(keys.public, keys.secret), limits)
    except ArgumentError as exc:  # the port is taken, the address is not this host's
        raise ArgumentError(f"--bind: {exc}") from None
    stop = {"signal": 0}

    def on_signal(signum: int, frame: Any) -> None:
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"graphrun rendezvous: serving on {server.endpoint}", flush=True)
    try:
        while not stop["signal"]:
            if server.wait(0.2):  # its thread ended by itself: a bug, not a stop
                raise RuntimeError("the rendezvous server's thread ended")
    finally:
        server.close()
    name = signal.Signals(stop["signal"]).name
    print(f"graphrun rendezvous: stopped ({name})", file=sys.stderr, flush=True)
    return 0
