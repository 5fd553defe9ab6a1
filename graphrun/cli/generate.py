"""``graphrun generate community|academic OUT``: write a synthetic dataset directory."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from graphrun.arguments import add_fields, from_fields
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
    add_fields(p, GenParams)  # --nodes, --avg-degree, ... as GenParams declares them
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

    params = from_fields(GenParams, args)
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
