"""``graphrun bench WHAT``: benchmarks that print JSON (one object per run or setting).

Each benchmark is a module ``graphrun.bench.<what>`` exposing ``register(subparsers)``
like a CLI subcommand. Numbers and the commands that produced them are recorded in
``benchmarks/README.md``. Timings are never asserted in tests.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

BENCHES = (
    "partition", "kv", "sampling", "step", "train", "placement", "generate", "sage_vs_mlp",
    "elastic", "serve", "live", "cost",
)  # fmt: skip


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="run a benchmark and print JSON",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="bench", metavar="WHAT", required=True)
    for name in BENCHES:
        try:
            module = importlib.import_module(f"graphrun.bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"graphrun.bench.{name}":
                continue
            raise
        module.register(sub)
