"""``graphrun import SRC OUT``: convert an npy folder or CSV/Parquet tables to a dataset."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Convert SRC into a graphrun dataset directory OUT (memory-mappable .npy + graph.json).

SRC is detected, or forced with --format:
  npy      a folder with src.npy, dst.npy [, feat.npy, label.npy,
           train_idx.npy, val_idx.npy, test_idx.npy]
  csv      edges.csv (columns src, dst [, etype] [, edge features]) or
           edges/SRCTYPE__REL__DSTTYPE.csv, plus optional nodes.csv
           (id [, type] [, label, train_mask, feat_0, feat_1, ...]) or nodes/TYPE.csv
  parquet  the same with .parquet files (list columns become 2-d features)

Original node ids (any integers or strings) are mapped to dense ids; the mapping
is stored in OUT/ids/<type>.npy. Every command taking a DATASET also accepts SRC
directly, but only `graphrun import` keeps the mapping on disk.

--chunks N writes the chunked layout instead (OUT/chunks.json + OUT/chunk-K/, see
graphrun/graph/chunked.py): `graphrun partition --mode distributed` reads it, each
rank only its share.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "import",
        help="convert an npy folder or CSV/Parquet tables into a dataset",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "src", type=Path, metavar="SRC", help="input folder (or a single edges.csv/.parquet file)"
    )
    p.add_argument(
        "out",
        type=Path,
        metavar="OUT",
        help="output dataset directory (must not exist or be empty)",
    )
    p.add_argument(
        "--format",
        choices=("npy", "csv", "parquet"),
        default=None,
        help="input format (default: detect)",
    )
    p.add_argument("--name", default=None, help="dataset name (default: SRC's name)")
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
    from graphrun.graph.importers import detect_format, import_graph

    if args.chunks is not None and args.chunks < 1:
        raise ArgumentError(f"--chunks: must be a positive integer, got {args.chunks}")
    ensure_free(args.out)
    t0 = time.perf_counter()
    fmt = args.format or detect_format(args.src)
    result = import_graph(args.src, fmt, args.name)
    g = result.graph
    if args.chunks is not None:
        save_chunked(g, args.out, args.chunks, result.id_maps)
    else:
        save_dataset(g, args.out, result.id_maps)
    print(
        f"imported {args.src} ({fmt}): {g.num_nodes} nodes, {g.num_edges} edges, "
        f"node types {list(g.node_types)}, {len(g.edge_types)} edge types -> {args.out} "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    return 0
