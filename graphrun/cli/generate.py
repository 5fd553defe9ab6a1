"""``graphrun generate community|academic OUT``: write a synthetic dataset directory."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from graphrun.graph.generate import GenParams

KINDS = ("community", "academic")

DESCRIPTION = """\
Generate a synthetic graph and write it as a dataset directory OUT.

  community  one node type; power-law degrees; communities = labels (`label`);
             features `feat` = noisy community centroid, so GraphSAGE (which
             averages neighbours) clearly beats an MLP on the features alone;
             train/val/test masks. Edges are undirected, stored both ways:
             about NODES * AVG_DEGREE edges.
  academic   paper / author / institution / field with writes, cites,
             affiliated_with, has_topic (and rev_* reverses unless
             --no-reverse); task: classify papers (`label` on paper).

Same flags and seed give the same graph. Example:
  graphrun generate community data/ --nodes 200000 --avg-degree 40
"""


def register(subparsers: Any) -> None:
    d = GenParams()
    p = subparsers.add_parser(
        "generate",
        help="write a synthetic dataset (community or academic graph)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kind", choices=KINDS, metavar="KIND", help="community or academic")
    p.add_argument(
        "out",
        type=Path,
        metavar="OUT",
        help="output dataset directory (must not exist or be empty)",
    )
    p.add_argument(
        "--nodes", type=int, default=d.nodes, help=f"number of nodes (default {d.nodes})"
    )
    p.add_argument(
        "--avg-degree",
        type=float,
        default=d.avg_degree,
        help=f"edges per node, counting both directions (default {d.avg_degree:g})",
    )
    p.add_argument(
        "--classes",
        type=int,
        default=d.classes,
        help=f"communities = label classes (default {d.classes})",
    )
    p.add_argument(
        "--feat-dim",
        type=int,
        default=d.feat_dim,
        help=f"node feature width (default {d.feat_dim})",
    )
    p.add_argument(
        "--homophily",
        type=float,
        default=d.homophily,
        help=f"fraction of edges inside a community (default {d.homophily:g})",
    )
    p.add_argument(
        "--feat-noise",
        type=float,
        default=d.feat_noise,
        help=f"std of the feature noise around unit centroids (default {d.feat_noise:g})",
    )
    p.add_argument(
        "--exponent",
        type=float,
        default=d.exponent,
        help=f"power-law exponent of the degree distribution (default {d.exponent:g})",
    )
    p.add_argument(
        "--train-frac",
        type=float,
        default=d.train_frac,
        help=f"share of (labelled) nodes in train_mask (default {d.train_frac:g})",
    )
    p.add_argument(
        "--val-frac",
        type=float,
        default=d.val_frac,
        help=f"share in val_mask (default {d.val_frac:g})",
    )
    p.add_argument(
        "--test-frac",
        type=float,
        default=d.test_frac,
        help=f"share in test_mask (default {d.test_frac:g})",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default 0)")
    p.add_argument("--name", default="", help="dataset name (default: the kind)")
    p.add_argument(
        "--no-reverse", action="store_true", help="academic: do not add rev_* reverse relations"
    )
    p.add_argument(
        "--chunks",
        type=int,
        metavar="N",
        help="write a chunked dataset of N pieces (for --mode distributed partitioning)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphrun.errors import ArgumentError
    from graphrun.graph.chunked import save_chunked
    from graphrun.graph.format import ensure_free, save_dataset
    from graphrun.graph.generate import academic, community

    params = GenParams(
        nodes=args.nodes,
        avg_degree=args.avg_degree,
        classes=args.classes,
        feat_dim=args.feat_dim,
        homophily=args.homophily,
        feat_noise=args.feat_noise,
        exponent=args.exponent,
        train_frac=args.train_frac,
        val_frac=args.val_frac,
        test_frac=args.test_frac,
        seed=args.seed,
        name=args.name,
    )
    params.validate()
    if args.chunks is not None and not 1 <= args.chunks <= params.nodes:
        raise ArgumentError(f"--chunks: must be in [1, --nodes], got {args.chunks}")
    ensure_free(args.out)
    t0 = time.perf_counter()
    if args.kind == "community":
        graph = community(params)
    else:
        graph = academic(params, reverse=not args.no_reverse)
    if args.chunks is not None:
        save_chunked(graph, args.out, args.chunks)
    else:
        save_dataset(graph, args.out)
    types = f"{len(graph.node_types)} node types, {len(graph.edge_types)} edge types, "
    print(
        f"generated {args.kind} graph {graph.name!r}: {graph.num_nodes} nodes, "
        f"{graph.num_edges} edges, {types if graph.is_hetero else ''}"
        f"{params.classes} classes, feat dim {params.feat_dim} -> {args.out} "
        f"{f'in {args.chunks} chunks ' if args.chunks is not None else ''}"
        f"({time.perf_counter() - t0:.1f} s)"
    )
    return 0
