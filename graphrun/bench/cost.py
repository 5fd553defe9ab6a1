"""``graphrun bench cost``: each stage's cost fitted on measured sizes, and projected.

Reads rows of measured costs (JSON Lines, one object a line, as written in
``benchmarks/cost-rows.jsonl``)::

    {"stage": "partition-distributed", "nodes": 2000000, "edges": 80000000,
     "feat_dim": 100, "hosts": 4, "peak_mb": 1009.0, "cpu_s": 197.2, ...}

``hosts`` is the number of machines (or ranks) the stage's work was spread over,
``peak_mb`` the largest one's peak RSS (MiB) and ``cpu_s`` the user + system CPU
seconds of all of them together; other fields (``wall_s``, ``load_avg``, ``note``)
travel along unread. For every stage it fits, by least squares over its rows, one
host's memory and CPU seconds as

    cost = per_node * N/h + per_edge * E/h + per_feature_byte * 4*dim*N/h + constant

(N nodes, E edges, float32 features of width dim, spread over h hosts; ``--terms``
keeps fewer of the four), then projects the graph of ``--nodes --edges --feat-dim``
onto every ``--hosts``. A stage whose rows all ran on one host (generation, the
parallel partitioner) is projected on one host. Prints one JSON object per stage::

    {"stage", "rows", "terms", "memory": {"bytes_per_node", "bytes_per_edge",
     "bytes_per_feature_byte", "constant_mib"}, "cpu": {"us_per_node", "us_per_edge",
     "us_per_feature_byte", "constant_s"}, "max_rel_residual": {"memory", "cpu"},
     "projection": [{"hosts", "nodes_per_host", "edges_per_host", "peak_gib",
     "cpu_s"}, ...]}

A stage's rows must tell its terms apart (e.g. per node from per edge needs two
average degrees); when they cannot, the command says which stage and stops.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any

import msgspec

from graphrun.errors import ArgumentError, UserError
from graphrun.wire import convert

TERMS = ("node", "edge", "feature", "constant")
FEATURE_BYTES = 4  # float32
MAX_ROWS = 100_000
MAX_FILE_BYTES = 64 << 20
MAX_HOSTS = 1 << 16
Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 48)]


class CostRow(msgspec.Struct, kw_only=True):
    """One stage measured on one graph (see the module docstring)."""

    stage: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    nodes: Annotated[int, msgspec.Meta(ge=1, le=1 << 48)]
    edges: Count
    feat_dim: Annotated[int, msgspec.Meta(ge=0, le=1 << 20)]
    hosts: Annotated[int, msgspec.Meta(ge=1, le=MAX_HOSTS)]
    peak_mb: Annotated[float, msgspec.Meta(gt=0, le=2.0**40)]  # MiB
    cpu_s: Annotated[float, msgspec.Meta(ge=0, le=1e12)]


class Fit(msgspec.Struct, frozen=True):
    """A stage's coefficients per term (memory in bytes, CPU in seconds) and the
    largest relative miss over its rows."""

    stage: str
    rows: int
    terms: tuple[str, ...]
    memory: dict[str, float]
    cpu: dict[str, float]
    residual: dict[str, float]
    one_host: bool


def read_rows(path: Path) -> list[CostRow]:
    """The rows of ``path``; a UserError naming the file, line and field otherwise."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise UserError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB")
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    rows: list[CostRow] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(rows) == MAX_ROWS:
            raise UserError(f"{path}: more than {MAX_ROWS} rows")
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{number}: not JSON: {exc.msg}") from None
        rows.append(convert(CostRow, data, f"{path}:{number}", UserError))
    if not rows:
        raise UserError(f"{path}: no rows")
    return rows


def features(nodes: float, edges: float, feat_dim: int, hosts: int) -> dict[str, float]:
    """One host's share of each term."""
    return {
        "node": nodes / hosts,
        "edge": edges / hosts,
        "feature": FEATURE_BYTES * feat_dim * nodes / hosts,
        "constant": 1.0,
    }


def fit_stage(stage: str, rows: list[CostRow], terms: tuple[str, ...], where: str) -> Fit:
    """Least squares of one host's peak bytes and CPU seconds on ``terms``."""
    import numpy as np

    x = np.array([[features(r.nodes, r.edges, r.feat_dim, r.hosts)[t] for t in terms]
                  for r in rows])  # fmt: skip
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    rank = int(np.linalg.matrix_rank(x / scale))
    if rank < len(terms):
        raise UserError(
            f"{where}: stage {stage!r}: its {len(rows)} row(s) cannot tell the terms "
            f"{', '.join(terms)} apart (rank {rank} of {len(terms)}): measure it on graphs "
            "that differ in size, average degree and feature width, or keep fewer --terms"
        )
    out: dict[str, dict[str, float]] = {}
    residual: dict[str, float] = {}
    for name, y in (
        ("memory", np.array([r.peak_mb * 2**20 for r in rows])),
        ("cpu", np.array([r.cpu_s / r.hosts for r in rows])),
    ):
        coef = np.linalg.lstsq(x / scale, y, rcond=None)[0] / scale
        out[name] = {t: float(c) for t, c in zip(terms, coef, strict=True)}
        miss = np.abs(x @ coef - y) / np.maximum(np.abs(y), 1e-12)
        residual[name] = round(float(miss.max()), 4)
    one = all(r.hosts == 1 for r in rows)
    return Fit(stage, len(rows), terms, out["memory"], out["cpu"], residual, one)


def fit_all(rows: list[CostRow], terms: tuple[str, ...], where: str) -> list[Fit]:
    """One :class:`Fit` per stage, in the order the stages first appear."""
    by_stage: dict[str, list[CostRow]] = defaultdict(list)
    for r in rows:
        by_stage[r.stage].append(r)
    return [fit_stage(s, rs, terms, where) for s, rs in by_stage.items()]


def project(fit: Fit, nodes: float, edges: float, feat_dim: int, hosts: int) -> dict[str, float]:
    """One host's peak (GiB) and CPU seconds for the graph spread over ``hosts``."""
    h = 1 if fit.one_host else hosts
    share = features(nodes, edges, feat_dim, h)
    memory = sum(c * share[t] for t, c in fit.memory.items())
    cpu = sum(c * share[t] for t, c in fit.cpu.items())
    return {
        "hosts": h,
        "nodes_per_host": round(nodes / h),
        "edges_per_host": round(edges / h),
        "peak_gib": round(memory / 2**30, 2),
        "cpu_s": round(cpu, 1),
    }


def describe_fit(fit: Fit) -> dict[str, Any]:
    """The fit in readable units: bytes and microseconds per unit, MiB and seconds."""
    unit = {"node": "per_node", "edge": "per_edge", "feature": "per_feature_byte"}
    memory = {f"bytes_{unit[t]}": round(c, 2) for t, c in fit.memory.items() if t in unit}
    cpu = {f"us_{unit[t]}": round(c * 1e6, 4) for t, c in fit.cpu.items() if t in unit}
    if "constant" in fit.memory:
        memory["constant_mib"] = round(fit.memory["constant"] / 2**20, 1)
        cpu["constant_s"] = round(fit.cpu["constant"], 2)
    return {"stage": fit.stage, "rows": fit.rows, "terms": list(fit.terms), "memory": memory,
            "cpu": cpu, "max_rel_residual": fit.residual}  # fmt: skip


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "cost",
        help="fit each stage's cost per node, edge and feature byte; project a graph",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("rows", type=Path, nargs="+", help="JSON Lines files of measured rows")
    p.add_argument("--nodes", type=float, default=111_059_956.0, help="(papers100M's)")
    p.add_argument("--edges", type=float, default=1_615_685_872.0, help="(papers100M's)")
    p.add_argument("--feat-dim", type=int, default=128, help="float32 features (128)")
    p.add_argument("--hosts", type=int, nargs="+", default=[8, 16], help="(8 16)")
    p.add_argument("--terms", default=",".join(TERMS), help="comma-separated (all four)")
    p.set_defaults(func=run)


def check(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``--terms`` asked for; an ArgumentError naming the first bad flag."""
    if not 1 <= args.nodes <= 2.0**48:
        raise ArgumentError(f"--nodes: expected 1..2^48, got {args.nodes}")
    if not 0 <= args.edges <= 2.0**48:
        raise ArgumentError(f"--edges: expected 0..2^48, got {args.edges}")
    if not 0 <= args.feat_dim <= 1 << 20:
        raise ArgumentError(f"--feat-dim: expected 0..{1 << 20}, got {args.feat_dim}")
    if not all(1 <= h <= MAX_HOSTS for h in args.hosts):
        raise ArgumentError(f"--hosts: expected 1..{MAX_HOSTS} each, got {args.hosts}")
    terms = tuple(t.strip() for t in args.terms.split(",") if t.strip())
    bad = [t for t in terms if t not in TERMS]
    if bad or not terms or len(set(terms)) != len(terms):
        raise ArgumentError(f"--terms: expected distinct names of {', '.join(TERMS)}, got "
                            f"{args.terms!r}")  # fmt: skip
    return terms


def run(args: argparse.Namespace) -> int:
    terms = check(args)
    rows = [(path, read_rows(path)) for path in args.rows]
    where = ", ".join(str(p) for p, _ in rows)
    for fit in fit_all([r for _, rs in rows for r in rs], terms, where):
        out = describe_fit(fit)
        out["projection"] = [
            project(fit, args.nodes, args.edges, args.feat_dim, h)
            for h in ([1] if fit.one_host else args.hosts)
        ]
        print(json.dumps(out), flush=True)
    return 0
