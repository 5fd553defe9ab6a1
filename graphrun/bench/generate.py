"""``graphrun bench generate``: time and peak memory of ``graphrun generate`` (the whole
command, writing to disk).

Runs each setting in a fresh child process and reads its peak RSS from
``getrusage(RUSAGE_CHILDREN)``; prints one JSON object per setting; deletes the
output afterwards.

    graphrun bench generate --sizes 200000:40 2000000:40 --kind community
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from graphrun.errors import ArgumentError, GraphrunError


def run_one(kind: str, nodes: int, degree: float, feat_dim: int, workdir: Path) -> dict[str, Any]:
    out = workdir / f"{kind}-{nodes}"
    cmd = [
        sys.executable,
        "-m",
        "graphrun",
        "generate",
        kind,
        str(out),
        "--nodes",
        str(nodes),
        "--avg-degree",
        str(degree),
        "--feat-dim",
        str(feat_dim),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise GraphrunError(f"graphrun generate failed: {proc.stderr.strip()}")
    meta = json.loads((out / "graph.json").read_text())
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    shutil.rmtree(out)
    return {
        "bench": "generate",
        "kind": kind,
        "nodes": meta["num_nodes"],
        "edges": meta["num_edges"],
        "feat_dim": feat_dim,
        "seconds": round(seconds, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
        "dataset_mb": round(size / 2**20),
        "load1": round(os.getloadavg()[0], 2),
    }


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "generate",
        help="time and peak memory of graphrun generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", nargs="+", default=["200000:40"], help="NODES:AVG_DEGREE ...")
    p.add_argument("--kind", default="community", choices=("community", "academic"))
    p.add_argument("--feat-dim", type=int, default=64)
    p.add_argument("--workdir", type=Path, default=None)
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    sizes = []
    for size in a.sizes:
        nodes, _, degree = size.partition(":")
        try:
            sizes.append((int(nodes), float(degree)))
        except ValueError:
            raise ArgumentError(f"--sizes: {size!r} is not NODES:AVG_DEGREE") from None
    with tempfile.TemporaryDirectory(prefix="graphrun-gen-") as tmp:
        workdir = a.workdir or Path(tmp)
        for nodes, degree in sizes:
            # RUSAGE_CHILDREN is a maximum over all children so far: run settings in
            # increasing size, or one per invocation, to read each one's own peak.
            print(json.dumps(run_one(a.kind, nodes, degree, a.feat_dim, workdir)), flush=True)
    return 0
