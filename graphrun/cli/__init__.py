"""The ``graphrun`` command.

Each subcommand lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a function
``(args) -> int``. Heavy imports (torch, zmq) happen inside those functions so
that ``graphrun --help`` stays instant. A command line that names a subcommand
builds that one's parser only: the other modules (and what they import at the top:
numpy, yaml, the benchmarks) are not imported by a store server or a machine worker,
of which a job starts many (0.04 CPU-s each).

A :class:`graphrun.errors.UserError` reaching here is printed as one line,
``graphrun: error: <message>``, and the exit code is 2; so is an argument argparse
refuses (:class:`graphrun.arguments.OneLineParser`, whose bounded types check every
number and output path before any work). Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from graphrun import __version__
from graphrun.arguments import OneLineParser
from graphrun.errors import USER_ERROR_EXIT, GraphrunError, JobFailed, UserError

# Order is the order shown in --help: the workflow from data to a trained model.
SUBCOMMANDS = (
    "demo",
    "generate",
    "import_",
    "ingest",
    "partition",
    "serve",
    "ps",
    "keygen",
    "run",
    "report",
    "infer",
    "worker",
    "rendezvous",
    "plan",
    "profile",
    "probe",
    "operator",
    "render",
    "bench",
)


def command_of(name: str) -> str:
    """The subcommand a module of :data:`SUBCOMMANDS` registers (``import_``: ``import``)."""
    return name.rstrip("_")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand's parser, or only ``command``'s where it is one of them."""
    parser = OneLineParser(
        prog="graphrun",
        description=(
            "Distributed GNN training: generate or import a graph, partition it, serve the "
            "partitions, and train on them from one job spec.\n\n"
            "Start with `graphrun demo`. Then: `graphrun generate community data/` → "
            "`graphrun partition data/ parts/ --parts 2` → `graphrun run job.yaml`."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"graphrun {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = [n for n in SUBCOMMANDS if command_of(n) == command] or SUBCOMMANDS
    for name in names:
        try:
            module = importlib.import_module(f"graphrun.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"graphrun.cli.{name}":
                continue  # subcommand not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or an argument refused (its line printed)
        return exc.code if isinstance(exc.code, int) else USER_ERROR_EXIT
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.command == "bench":  # its with-blocks clean up (graphrun.signals)
        from graphrun.signals import interrupt_on_sigterm

        interrupt_on_sigterm()
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"graphrun: error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    except JobFailed as exc:
        print(f"graphrun: job failed: {exc}", file=sys.stderr)
        return 1
    except GraphrunError as exc:
        print(f"graphrun: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a full disk, a read-only directory: one line, no traceback
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"graphrun: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except MemoryError as exc:
        detail = f" ({exc})" if str(exc) else ""
        print(
            f"graphrun: error: out of memory in `graphrun {args.command}`{detail}", file=sys.stderr
        )
        return 1
    except KeyboardInterrupt:
        print("graphrun: interrupted", file=sys.stderr)
        return 130
