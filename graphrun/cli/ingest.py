"""``graphrun ingest SRC --store ADDR... --key-file KEY``: stream node and edge tables into
a live store (issue 42), one checked chunk a write batch."""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from graphrun import names
from graphrun.arguments import integer, number

if TYPE_CHECKING:
    from graphrun.graph.ingest_tables import Chunk

MAX_CHUNK_ROWS = 1 << 21  # graphrun.graph.ingest_tables.MAX_CHUNK_ROWS (pyarrow: not at --help)

DESCRIPTION = """\
Send the nodes and edges of SRC to a running live store, in chunks of --chunk-rows rows;
each chunk is one write batch (GraphWriter: add_nodes or add_edges, then commit), visible
whole at its version or not at all. Node files are sent before edge files.

SRC (detected, or --format):
  csv, parquet  nodes.EXT or nodes/TYPE.EXT (id [, type] [, label, train_mask,
                feat_0, feat_1, ...]); edges.EXT or edges/SRC__REL__DST.EXT (src, dst
                [, etype] [, edge features]); the column rules of `graphrun import`
  npy           nodes/id.npy [, NAME.npy: the node feature NAME, one row per id];
                edges/src.npy, edges/dst.npy [, NAME.npy: edge features]

Ids are your own integer ids: new nodes get graph ids in the store, which keeps the
mapping both ways; an edge's ends are new nodes or nodes already there. A new node must
come with every node feature of its type.

Every chunk is checked whole before it is sent: a bad one stops the command with one
line naming the file, the row (from 0, header not counted) or the column, and nothing of
it is sent; the chunks before it are committed (the line says up to which row). Run with
--dry-run first to check whole files without a store.

The key needs the write_graph grant (graphrun keygen KEY --store STORE.key --clients DIR
--grants write_graph); the store's admin key may write too. Its file's name is the job
the writer acts as.

  graphrun ingest new/ --store tcp://10.0.0.1:7000 --store tcp://10.0.0.2:7000 \\
      --key-file ingest.key --chunk-rows 10000
"""


def store_address(text: str) -> str:
    try:
        return names.store_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "ingest",
        help="stream node and edge tables (npy, CSV, Parquet) into a live store",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", type=Path, metavar="SRC", help="folder of tables (or one edges file)")
    p.add_argument("--store", action="append", type=store_address, metavar="ADDR",
                   help="the main server of every partition, in partition order")  # fmt: skip
    p.add_argument("--key-file", type=Path, help="a key with the write_graph grant")
    p.add_argument("--format", choices=("npy", "csv", "parquet"), help="default: detect")
    p.add_argument("--chunk-rows", type=integer(1, MAX_CHUNK_ROWS), default=10_000,
                   metavar="N", help="rows of a chunk, a write batch (default 10000)")  # fmt: skip
    p.add_argument("--timeout", type=number(0, 3600, above=True), default=30.0,
                   help="seconds a store request waits (default 30)")  # fmt: skip
    p.add_argument("--progress-s", type=number(0, 3600), default=1.0, metavar="S",
                   help="seconds between progress lines (0: one a chunk)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true",
                   help="read and check every chunk; connect to nothing, send nothing")  # fmt: skip
    p.set_defaults(func=run)


@dataclass
class Progress:
    """Rows read and sent, and their rate, printed every ``every`` seconds and at the end."""

    every: float
    out: TextIO = field(default_factory=lambda: sys.stderr)
    nodes: int = 0
    edges: int = 0
    chunks: int = 0
    versions: list[int] = field(default_factory=list)
    start: float = field(default_factory=time.perf_counter)
    shown: float = -math.inf  # the first line is shown whatever perf_counter reads

    def add(self, chunk: Chunk, version: int | None) -> None:
        from graphrun.graph.ingest_tables import NodeChunk

        if isinstance(chunk, NodeChunk):
            self.nodes += len(chunk.ids)
        else:
            self.edges += len(chunk.src)
        self.chunks += 1
        if version is not None:
            self.versions.append(version)
        now = time.perf_counter()
        if now - self.shown >= self.every:
            self.shown = now
            print(f"ingest: {self.line()}", file=self.out, flush=True)

    def line(self) -> str:
        rows = self.nodes + self.edges
        rate = rows / max(time.perf_counter() - self.start, 1e-9)
        v = f", versions {self.versions[0]}..{self.versions[-1]}" if self.versions else ""
        return (
            f"{rows} rows ({self.nodes} nodes, {self.edges} edges) in {self.chunks} chunks"
            f"{v}, {rate:.0f} rows/s"
        )


def _checked(args: argparse.Namespace) -> tuple[list[Any], Any]:
    """The sources and the key, every argument checked: nothing is connected yet."""
    from graphrun.errors import ArgumentError
    from graphrun.graph.ingest_tables import plan_sources

    keys = None
    if not args.dry_run:
        if not args.store:
            raise ArgumentError("--store: give the main server of every partition")
        if args.key_file is None:
            raise ArgumentError("--key-file: give a key with the write_graph grant")
        from graphrun.rpc.auth import load_keys

        keys = load_keys(args.key_file)
    return plan_sources(args.src, args.format), keys


def _writer(args: argparse.Namespace, keys: Any) -> Any:
    from graphrun.distributed.writer import GraphWriter
    from graphrun.store.client import KVClient
    from graphrun.store.session import ClientConfig

    config = ClientConfig(
        servers=list(args.store), job=args.key_file.stem, keys=keys, timeout=args.timeout,
        name="ingest", use_shm=False,
    )  # fmt: skip
    return GraphWriter(KVClient(config))


def send(writer: Any, chunk: Chunk) -> int:
    """One chunk as one write batch; a refused chunk is one line naming its rows."""
    from graphrun.errors import DatasetError, GraphrunError, StoreError, UserError
    from graphrun.graph.ingest_tables import NodeChunk

    try:
        if isinstance(chunk, NodeChunk):
            writer.add_nodes(chunk.ntype, chunk.ids, chunk.features)
        else:
            writer.add_edges(chunk.etype, chunk.src, chunk.dst, chunk.features, orig=True)
    except UserError as exc:
        raise DatasetError(f"{chunk.where()}: {exc}") from None
    try:
        return int(writer.commit())
    except UserError as exc:
        raise DatasetError(f"{chunk.where()}: {exc}") from None
    except GraphrunError as exc:
        raise StoreError(f"{chunk.where()}: not committed: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    from graphrun.errors import DatasetError, GraphrunError, StoreError, UserError
    from graphrun.graph.ingest_tables import read_chunks
    from graphrun.rpc.tuning import keep_large_allocations

    sources, keys = _checked(args)
    keep_large_allocations()  # a chunk's arrays and pieces are fresh buffers of 100s of KB
    writer = None if args.dry_run else _writer(args, keys)
    progress = Progress(args.progress_s)
    try:
        for chunk in read_chunks(sources, args.chunk_rows):
            progress.add(chunk, None if writer is None else send(writer, chunk))
    except GraphrunError as exc:
        done = "checked" if writer is None else "committed"
        line = f"{exc}; before it: {progress.line()} {done}"
        raise (DatasetError(line) if isinstance(exc, UserError) else StoreError(line)) from exc
    finally:
        if writer is not None:
            writer.client.close()
    what = "checked (dry run, nothing sent)" if writer is None else "committed"
    print(f"ingested {args.src}: {progress.line()} {what}")
    return 0
