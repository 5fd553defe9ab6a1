"""``graphrun partition DATASET OUT --parts N``: partition a graph into a partition directory."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphrun.graph.imported import Imported
    from graphrun.partition.peaks import Phases

DESCRIPTION = """\
Partition a dataset into N parts and write a self-describing partition directory OUT
(partition.json + part-K/ + mapping/, see graphrun/partition/format.py).

Nodes are relabelled so every partition owns contiguous id ranges per node and edge
type; OUT/mapping/ maps new ids back to the original ones and vice versa. Every edge
belongs to the partition of its destination node.

  metis     METIS (pymetis) on the symmetrised graph, one process: small edge cut
  kaminpar  KaMinPar on the symmetrised graph, multi-threaded: small edge cut
  random    balanced random assignment: fast, large edge cut

--mode single (default) runs the method in one process on one core; --mode parallel
uses every core of this machine (KaMinPar, --threads to limit). --mode distributed
runs N rank processes (torch.distributed: they meet in a private file, gloo on
loopback; nothing listens elsewhere) that each read only
their share of a chunked dataset (`graphrun generate|import ... --chunks M`, M >= N)
and partition it together with XtraPuLP-style label propagation; each rank writes
its own part (graphrun/partition/distributed.py).

--balance-train / --balance-edges also balance training nodes (train_mask) and owned
edges: METIS gets combined vertex weights, then a rebalancing pass moves the cheapest
nodes (fewest edges newly cut) out of parts above (1 + tolerance) x mean. Balance costs
some edge cut; the cut and balance reached are printed and stored in partition.json.

Example:  graphrun partition data/ parts/ --parts 4 --balance-train
"""


DEFAULT_TIMEOUT = 600.0
MAX_TIMEOUT = 1e8  # a timedelta's range, and far beyond any wait anybody means
# flags of --mode distributed only, and those of one rank (--rank) only
DISTRIBUTED_ONLY = ("rank", "rendezvous", "into", "init", "timeout")
RANK_ONLY = ("rendezvous", "into")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "partition",
        help="partition a graph (METIS or random) into a partition directory",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "dataset",
        metavar="DATASET",
        help="dataset directory (chunked for --mode distributed; other modes read chunks "
        "whole), or a folder graphrun import understands (npy, CSV, Parquet)",
    )
    p.add_argument("out", metavar="OUT", help="partition directory to create (must not exist)")
    p.add_argument("--parts", type=int, required=True, metavar="N", help="number of partitions")
    p.add_argument(
        "--method",
        choices=("metis", "random", "kaminpar"),
        help="algorithm (default: metis; kaminpar with --mode parallel)",
    )
    p.add_argument(
        "--mode",
        choices=("single", "parallel", "distributed"),
        default="single",
        help="one core, every core of this machine, or several machines (default single)",
    )
    p.add_argument("--threads", type=int, help="KaMinPar's threads (default: 1, parallel: all)")
    p.add_argument("--balance-train", action="store_true", help="balance training nodes too")
    p.add_argument("--balance-edges", action="store_true", help="balance owned edges too")
    p.add_argument(
        "--halo",
        type=int,
        default=1,
        metavar="HOPS",
        help="halo hops stored with each partition (0: none; default 1)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="allowed max/mean imbalance above 1 for the balance pass (default 0.05)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--init",
        choices=("local", "hash", "block"),
        help="distributed: label propagation's start (default local: METIS per chunk)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        help="distributed: seconds any rank waits for the others, the rendezvous "
        f"included (default {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument(
        "--rank",
        type=int,
        default=None,
        help="distributed, one rank per machine (graphrun run, the operator's worker pods): "
        "be this one rank, joining the others at --rendezvous",
    )
    p.add_argument(
        "--rendezvous",
        help="with --rank: tcp://HOST:PORT, an address of rank 0's machine (rank 0 listens "
        "there only; unauthenticated, see SECURITY.md), or file://PATH (ranks on one host)",
    )
    p.add_argument(
        "--into",
        type=Path,
        help="with --rank: write into this staging directory, which the launcher renames to "
        "OUT; without it rank 0 makes the staging directory and renames it once all ranks "
        "have written",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=run)


def resolve_mode(mode: str, method: str | None, threads: int | None) -> tuple[str, int | None]:
    """The algorithm and thread count a ``--mode`` / ``--method`` / ``--threads`` asks for."""
    from graphrun.errors import ArgumentError

    if threads is not None and threads < 1:
        raise ArgumentError(f"--threads: must be a positive integer, got {threads}")
    if mode == "distributed":
        if method is not None or threads is not None:
            flag = "--method" if method is not None else "--threads"
            raise ArgumentError(f"{flag}: --mode distributed runs xtrapulp on one rank per part")
        return "xtrapulp", None
    if mode == "parallel":
        if method not in (None, "kaminpar"):
            raise ArgumentError(
                f"--method {method}: runs in one process; --mode parallel uses kaminpar"
            )
        return "kaminpar", threads
    method = method or "metis"
    if threads is not None and method != "kaminpar":
        raise ArgumentError(f"--threads: only kaminpar takes threads, not {method}")
    return method, threads if threads is not None else (1 if method == "kaminpar" else None)


def _load(path: str, scratch: Path | None = None) -> Imported:
    from graphrun.graph.chunked import is_chunked_dir, load_chunked_whole
    from graphrun.graph.imported import Imported
    from graphrun.graph.importers import import_graph

    if is_chunked_dir(path):  # one machine: every chunk joined into one graph
        graph, id_maps = load_chunked_whole(path, scratch)
        return Imported(graph, id_maps)
    return import_graph(path)


@contextlib.contextmanager
def _scratch(dataset: str, out: str) -> Iterator[Path | None]:
    """Where a chunked dataset's chunks are joined (memory-mapped files) while it is
    partitioned in one process: a hidden directory beside OUT (on the disk the user chose
    for the output), removed afterwards however the command ends; None for a dataset
    that is not chunked."""
    from graphrun.graph.chunked import is_chunked_dir

    if not is_chunked_dir(dataset):
        yield None
        return
    parent = Path(out).resolve().parent
    where = parent if parent.is_dir() else None
    with tempfile.TemporaryDirectory(prefix=".graphrun-chunks-", dir=where) as d:
        yield Path(d)


def check_mode_flags(args: argparse.Namespace) -> None:
    """Refuse a flag that the mode would ignore (a rank flag without --mode distributed
    partitioned the whole graph in one process instead)."""
    from graphrun.errors import ArgumentError

    given = [f for f in DISTRIBUTED_ONLY if getattr(args, f) is not None]
    if args.mode != "distributed" and given:
        raise ArgumentError(f"--{given[0]}: only with --mode distributed, not --mode {args.mode}")
    given = [f for f in RANK_ONLY if getattr(args, f) is not None]
    if args.rank is None and given:
        raise ArgumentError(
            f"--{given[0]}: only with --rank (one rank of several started on their own); "
            "without it this command starts every rank on this machine"
        )


def run(args: argparse.Namespace) -> int:
    from graphrun.errors import ArgumentError

    check_mode_flags(args)
    if not math.isfinite(args.tolerance) or args.tolerance < 0:
        raise ArgumentError(f"--tolerance: must be a finite number >= 0, got {args.tolerance}")
    if args.parts < 1:
        raise ArgumentError(f"--parts: must be a positive integer, got {args.parts}")
    method, threads = resolve_mode(args.mode, args.method, args.threads)
    if args.mode == "distributed":
        return _run_distributed(args)
    from graphrun.partition.peaks import Phases

    phases = Phases()
    phases.start("read")
    with _scratch(args.dataset, args.out) as scratch:
        return _partition_one(args, method, threads, phases, _load(args.dataset, scratch))


def _partition_one(
    args: argparse.Namespace, method: str, threads: int | None, phases: Phases, imported: Imported
) -> int:
    from graphrun.partition import partition_graph

    graph = imported.graph
    result = partition_graph(
        graph,
        args.out,
        parts=args.parts,
        method=method,
        balance_train=args.balance_train,
        balance_edges=args.balance_edges,
        halo_hops=args.halo,
        seed=args.seed,
        tolerance=args.tolerance,
        id_maps=imported.id_maps,
        threads=threads,
        phases=phases,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "out": str(result.path),
                    "parts": result.num_parts,
                    "method": result.method,
                    "seconds": round(result.seconds, 3),
                    **result.quality.to_dict(),
                    "phases": {k: round(v, 3) for k, v in result.phases.items()},
                    "phase_peak_mb": result.peaks,
                    "peak_rss_mb": round(result.peak_mb, 1),
                }
            )
        )
    else:
        print(
            f"partitioned {graph.name!r} ({graph.num_nodes} nodes, {graph.num_edges} edges) "
            f"into {result.num_parts} parts with {result.method} in {result.seconds:.1f} s "
            f"-> {result.path}"
        )
        print(result.quality.summary())
    return 0


def _run_rank(args: argparse.Namespace, opts: Any) -> int:
    """One rank on its machine: with ``--into`` (``graphrun run``) the launcher renames
    the staging directory once every rank has exited 0; without it (the operator's
    worker pods) rank 0 does, once every rank has written."""
    from graphrun.errors import PEER_LOST_EXIT, PeerLost
    from graphrun.partition.distributed import run_rank, run_rank_to_output

    try:
        if args.into is not None:
            report = run_rank(
                args.dataset, args.into, args.parts, args.rank, args.rendezvous, opts,
                timeout=args.timeout,
            )  # fmt: skip
        else:
            report = run_rank_to_output(
                args.dataset, args.out, args.parts, args.rank, args.rendezvous, opts,
                timeout=args.timeout,
            )  # fmt: skip
    except PeerLost as exc:  # another rank failed first: the launcher blames that one
        print(f"graphrun: error: {exc}", file=sys.stderr)
        return PEER_LOST_EXIT
    secs = sum(p.get("seconds", 0.0) for p in report.phases.values())
    peak = max((p.get("peak_rss_mb", 0.0) for p in report.phases.values()), default=0.0)
    phases = ", ".join(f"{name} {p['seconds']:.1f}" for name, p in report.phases.items())
    print(
        f"partition rank {args.rank} of {args.parts}: part-{args.rank} written in {secs:.1f} s "
        f"({phases}; peak {peak:.0f} MiB)"
    )
    return 0


def _rank_environment(rendezvous: str) -> None:
    """gloo listens on the interface this rank reaches rank 0 through (loopback for a
    file:// rendezvous), not on whatever the host name resolves to; GLOO_SOCKET_IFNAME,
    where set (graphrun run sets it), decides instead. This process is the edge."""
    import os

    from graphrun.partition.rendezvous import gloo_interface, parse_rendezvous

    rdv = parse_rendezvous(rendezvous)
    # torch's C++ warnings while the ranks wait for each other (several lines each, a
    # stack trace some) bury the one line that says what went wrong; set it to see them
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if not os.environ.get("GLOO_SOCKET_IFNAME"):
        iface = gloo_interface(rdv)
        if iface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = iface


def _run_distributed(args: argparse.Namespace) -> int:
    from graphrun.errors import ArgumentError

    if args.timeout is None:
        args.timeout = DEFAULT_TIMEOUT
    if not 0 < args.timeout <= MAX_TIMEOUT:
        raise ArgumentError(
            f"--timeout: must be a number of seconds in (0, {MAX_TIMEOUT:g}], got {args.timeout}"
        )
    if args.rank is not None:
        if args.rendezvous is None:
            raise ArgumentError("--rank: needs --rendezvous (where the ranks meet)")
        _rank_environment(args.rendezvous)  # before torch is imported
    from graphrun.partition.distributed import DistOptions, run_local
    from graphrun.partition.quality import Quality
    from graphrun.partition.xtrapulp import LPOptions

    if args.init is None:
        args.init = "local"
    opts = DistOptions(
        halo_hops=args.halo,
        balance_train=args.balance_train,
        balance_edges=args.balance_edges,
        tolerance=args.tolerance,
        seed=args.seed,
        lp=LPOptions(init=args.init),
    )
    if args.rank is not None:
        return _run_rank(args, opts)
    res = run_local(args.dataset, args.out, args.parts, opts, timeout=args.timeout)
    ranks = [{"rank": r.rank, "phases": r.phases, **r.stats} for r in res.ranks]
    if args.json:
        print(
            json.dumps(
                {
                    "out": str(res.path),
                    "parts": res.num_parts,
                    "method": "xtrapulp",
                    "mode": "distributed",
                    "init": args.init,
                    "seconds": round(res.seconds, 3),
                    **res.quality,
                    "phases": res.phase_seconds(),
                    "ranks": ranks,
                }
            )
        )
        return 0
    print(
        f"partitioned {args.dataset} into {res.num_parts} parts with xtrapulp "
        f"({res.num_parts} ranks, init {args.init}) in {res.seconds:.1f} s -> {res.path}"
    )
    print(Quality(**res.quality).summary())
    for r in res.ranks:
        cells = ", ".join(
            f"{name} {v['seconds']:.1f} s / {v['peak_rss_mb']:.0f} MiB"
            for name, v in r.phases.items()
        )
        print(f"rank {r.rank}: {cells}")
    return 0
