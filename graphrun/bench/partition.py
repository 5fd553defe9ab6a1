"""``graphrun bench partition``: time and memory of ``graphrun partition``, vs pymetis alone.

For every ``--parts`` value it runs the real command ``graphrun partition DATASET OUT``
as a child process (wall time and the child's peak RSS from ``wait4``), and pymetis
alone on the same graph (undirected, simple: built with scipy, default options), then
prints one JSON object per run::

    {"parts", "method", "nodes", "edges", "edge_cut", "node_balance", "edge_balance",
     "train_balance", "seconds", "cpu_seconds", "peak_rss_mb", "phases",
     "phase_peak_mb", "pymetis_edge_cut", "pymetis_seconds", "cut_vs_pymetis",
     "load_avg", ...}

``phases`` are the seconds of each phase of the command (``read``, ``graph``: the
symmetric adjacency, ``assign``, ``relabel``, ``write``; the distributed mode adds
``shuffle``) and ``phase_peak_mb`` the peak RSS (MiB) inside each phase: the command
resets Linux's high-water mark as a phase starts (:mod:`graphrun.partition.peaks`).
``peak_rss_mb`` is the largest, the command's peak. ``seconds`` is the child's wall
time, ``cpu_seconds`` its user + system CPU time (``--mode single`` is single-threaded,
so on a quiet machine the two agree; on a loaded one ``cpu_seconds`` is the better
guide). ``pymetis_seconds`` times the METIS call only.

``--mode distributed`` first writes the dataset as a chunked one (``--chunks``, default
the largest ``--parts``), runs ``graphrun partition --mode distributed`` on it (P rank
processes) and also ``graphrun partition --method metis`` with the same balance flags
on the whole dataset; the row adds ``peak_rss_mb_per_rank`` (each rank's peak RSS),
``phases`` (the slowest rank's seconds per phase), ``phase_peak_mb`` (the largest
rank's peak per phase), ``phase_peak_mb_per_rank`` (every rank's peak per phase),
``metis_edge_cut``,
``metis_seconds`` and ``cut_vs_metis``. ``peak_rss_mb`` is then the largest process.

Without ``--dataset`` it first generates the community graph of ``graphrun generate
community --nodes N --avg-degree E/N`` (edges stored both ways).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from graphrun.bench import check_at_least
from graphrun.errors import ArgumentError, GraphrunError, UserError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "partition",
        help="time graphrun partition against pymetis alone",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dataset", help="dataset directory (default: generate one)")
    p.add_argument("--nodes", type=int, default=200_000, help="generated nodes (default 200k)")
    p.add_argument("--edges", type=int, default=8_000_000, help="generated edges (default 8M)")
    p.add_argument("--parts", type=int, nargs="+", default=[2, 4], help="part counts (2 4)")
    p.add_argument("--method", choices=("metis", "random", "kaminpar"))
    p.add_argument(
        "--mode",
        choices=("single", "parallel", "distributed"),
        default="single",
        help="as graphrun partition",
    )
    p.add_argument("--init", choices=("local", "hash", "block"), help="distributed: as partition")
    p.add_argument("--chunks", type=int, help="distributed: chunks (default: the largest --parts)")
    p.add_argument("--balance-train", action="store_true")
    p.add_argument("--balance-edges", action="store_true")
    p.add_argument("--no-pymetis", action="store_true", help="skip the pymetis baseline")
    p.add_argument("--workdir", help="where to put generated data and outputs (default: tmp)")
    p.set_defaults(func=run)


def run_partition_command(dataset: Path, out: Path, parts: int, extra: list[str]) -> dict[str, Any]:
    """Run ``graphrun partition`` as a child; its JSON plus wall seconds and peak RSS."""
    cmd = [sys.executable, "-m", "graphrun", "partition", str(dataset), str(out)]
    cmd += ["--parts", str(parts), "--json", *extra]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    stdout = proc.stdout.read().decode() if proc.stdout else ""
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        # exit 2 is the child's one-line UserError (e.g. more parts than nodes): pass it on
        error = UserError if proc.returncode == 2 else GraphrunError
        reason = stderr.strip().removeprefix("graphrun: error: ")
        raise error(f"graphrun partition (exit {proc.returncode}): {reason}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result["seconds_inside"] = result.pop("seconds")
    result["seconds"] = round(seconds, 3)
    result["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 3)  # robust to load
    # the child resets its peak at each phase (graphrun.partition.peaks), so wait4's is
    # the peak since its last phase began: the child's own figure is the process's
    own = result.pop("peak_rss_mb", 0.0)
    result["peak_rss_mb"] = round(max(usage.ru_maxrss / 1024, own), 1)  # Linux: KiB
    result.pop("out", None)
    return result


def pymetis_baseline(dataset: Path, parts: int) -> dict[str, float]:
    """pymetis alone on the simple undirected graph: edge-cut fraction and seconds."""
    import numpy as np
    import pymetis
    import scipy.sparse as sp

    from graphrun.graph import load_dataset
    from graphrun.partition.quality import cut_edges

    g = load_dataset(dataset)
    n = g.num_nodes
    a = sp.csr_matrix((np.ones(g.num_edges, np.int8), (g.src, g.dst)), shape=(n, n))
    s = (a + a.T).tocsr()
    s.setdiag(0)
    s.eliminate_zeros()
    xadj = s.indptr.astype(np.int64)
    adjncy = s.indices.astype(np.int64)
    del a, s
    start, cpu = time.perf_counter(), time.process_time()
    _, membership = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(xadj, adjncy))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    part = np.asarray(membership, dtype=np.int64)
    return {
        "pymetis_edge_cut": cut_edges(part, g.src, g.dst) / max(g.num_edges, 1),
        "pymetis_seconds": round(seconds, 3),
        "pymetis_cpu_seconds": round(cpu, 3),
    }


def run(args: argparse.Namespace) -> int:
    check_at_least(args, 2, "--nodes")
    check_at_least(args, 1, "--edges", "--parts")
    if args.workdir and Path(args.workdir).exists() and not Path(args.workdir).is_dir():
        raise ArgumentError(f"--workdir: {args.workdir} exists and is not a directory")
    if not args.workdir:
        work = Path(tempfile.mkdtemp(prefix="graphrun-bench-partition-"))
        try:
            return _bench(args, work)
        finally:
            _remove(work)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    return _bench(args, Path(args.workdir))


def _bench(args: argparse.Namespace, work: Path) -> int:
    """One JSON row per part count; data and outputs under ``work``."""
    from graphrun.graph import load_dataset, save_dataset
    from graphrun.graph.generate import GenParams, community

    dataset = Path(args.dataset) if args.dataset else work / "dataset"
    if not args.dataset and not dataset.exists():
        params = GenParams(nodes=args.nodes, avg_degree=args.edges / args.nodes, seed=0)
        save_dataset(community(params), dataset)
    g = load_dataset(dataset)
    extra = ["--mode", args.mode, *(["--method", args.method] if args.method else [])]
    balance = ["--balance-train"] if args.balance_train else []
    balance += ["--balance-edges"] if args.balance_edges else []
    extra += balance + (["--init", args.init] if args.init else [])
    source = dataset
    if args.mode == "distributed":
        source = _chunked(dataset, work, args.chunks or max(args.parts))
    for parts in args.parts:
        out = work / f"out-{args.mode}-{args.method}-{parts}-{time.time_ns()}"
        row: dict[str, Any] = {"nodes": g.num_nodes, "edges": g.num_edges}
        row.update(run_partition_command(source, out, parts, extra))
        _remove(out)
        if args.mode == "distributed":
            row.update(_versus_metis(dataset, out, parts, balance, row))
        if not args.no_pymetis:
            row.update(pymetis_baseline(dataset, parts))
            row["cut_vs_pymetis"] = round(row["edge_cut"] / max(row["pymetis_edge_cut"], 1e-12), 4)
        row["load_avg"] = round(os.getloadavg()[0], 2)
        print(json.dumps(row), flush=True)
    return 0


def _chunked(dataset: Path, work: Path, chunks: int) -> Path:
    from graphrun.graph import load_dataset
    from graphrun.graph.chunked import save_chunked

    path = work / f"chunked-{chunks}"
    if not path.exists():
        save_chunked(load_dataset(dataset), path, chunks)
    return path


def _versus_metis(
    dataset: Path, out: Path, parts: int, balance: list[str], row: dict[str, Any]
) -> dict[str, Any]:
    """Per-rank peaks of a distributed row, and the single-machine METIS run to compare."""
    ranks = row.pop("ranks")
    metis = run_partition_command(dataset, out, parts, ["--method", "metis", *balance])
    _remove(out)
    phases = list(ranks[0]["phases"])
    return {
        "peak_rss_mb_per_rank": [
            max(p["peak_rss_mb"] for p in r["phases"].values()) for r in ranks
        ],
        "phase_peak_mb": {
            name: max(r["phases"][name]["peak_rss_mb"] for r in ranks) for name in phases
        },
        "phase_peak_mb_per_rank": [
            {name: p["peak_rss_mb"] for name, p in r["phases"].items()} for r in ranks
        ],
        "metis_edge_cut": metis["edge_cut"],
        "metis_seconds": metis["seconds"],
        "metis_peak_rss_mb": metis["peak_rss_mb"],
        "cut_vs_metis": round(row["edge_cut"] / max(metis["edge_cut"], 1e-12), 4),
    }


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
