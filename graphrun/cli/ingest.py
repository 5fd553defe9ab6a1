"""``graphrun ingest SRC --store ADDR... --key-file KEY``: stream node and edge tables into
a live store (issue 42), one checked chunk a write batch, ``--window`` batches in flight
(``GraphWriter.submit``: the rate ``graphrun bench live`` measures)."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from graphrun.arguments import integer, number, store_address

if TYPE_CHECKING:
    from graphrun.graph.ingest_tables import Chunk, EdgeChunk

MAX_CHUNK_ROWS = 1 << 21  # graphrun.graph.ingest_tables.MAX_CHUNK_ROWS (pyarrow: not at --help)
MAX_WINDOW = 16  # graphrun.distributed.writer.MAX_WINDOW (numpy and the client: not at --help)
DEFAULT_WINDOW = 8  # 16 no faster here (benchmarks/README.md, "Issue 42, ingest64")

DESCRIPTION = """\
Send the nodes and edges of SRC to a running live store, in chunks of --chunk-rows rows;
each chunk is one write batch (GraphWriter: add_nodes or add_edges, then submit), visible
whole at its version or not at all, --window batches in flight (1: each committed before
the next is sent). Node files are sent before edge files; the first edge chunk naming
ends by original id waits for the node chunks in flight. Progress counts the rows
acknowledged (committed), with their versions.

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
it is sent; the chunks before it are committed (the line says up to which row). A chunk
the store refuses stops it too, once the chunks in flight are answered: the line names
the refused chunk's rows, says every chunk before it is committed and which chunks after
it (in flight then) were committed as well; nothing after those was sent. To resume,
send the refused chunk's rows and those after the last committed ones. A chunk whose
commit was sent when the store was lost may be committed: its fate is asked again
(for min(--timeout, 5) s), and those still unknown are listed with their versions.
Run with --dry-run first to check whole files without a store.

The key needs the write_graph grant (graphrun keygen KEY --store STORE.key --clients DIR
--grants write_graph); the store's admin key may write too. Its file's name is the job
the writer acts as.

  graphrun ingest new/ --store tcp://10.0.0.1:7000 --store tcp://10.0.0.2:7000 \\
      --key-file ingest.key --chunk-rows 10000
"""


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
    p.add_argument("--window", type=integer(1, MAX_WINDOW), default=DEFAULT_WINDOW,
                   metavar="N", help=f"write batches in flight (default {DEFAULT_WINDOW}; "
                   "1: each committed before the next is sent)")  # fmt: skip
    p.add_argument("--timeout", type=number(0, 3600, above=True), default=30.0,
                   help="seconds a store request waits (default 30)")  # fmt: skip
    p.add_argument("--progress-s", type=number(0, 3600), default=1.0, metavar="S",
                   help="seconds between progress lines (0: one a chunk)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true",
                   help="read and check every chunk; connect to nothing, send nothing")  # fmt: skip
    p.set_defaults(func=run)


@dataclass
class Progress:
    """Rows acknowledged (or checked, in a dry run), their versions and rate, printed
    every ``every`` seconds and at the end."""

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
        v = f", versions {min(self.versions)}..{max(self.versions)}" if self.versions else ""
        return (
            f"{rows} rows ({self.nodes} nodes, {self.edges} edges) in {self.chunks} chunks"
            f"{v}, {rate:.0f} rows/s"
        )


@dataclass
class Sender:
    """Chunks into a writer, each one batch tagged with its number (``submit(tag=n)``;
    ``--window 1``: ``flush`` after each, today's ``commit``). A chunk's rows are counted
    once acknowledged. The first refusal stops it, every batch in flight answered first
    (each is atomic on its own): the error names the refused chunk and the chunks after
    it that were committed all the same, so a user can resume.

    With a window, a chunk is held until the next one is read: an edge chunk's ends
    (original ids) are asked of the sequencer then (``lookup_request``), while the chunk
    before it is submitted, and it is sent by graph ids; ``add_edges(orig=True)`` would
    ask them at its ``submit``, waiting (1.6 of the command's 2.9 s for 2M edges:
    benchmarks/README.md, "Issue 42, ingest64"). Not while a node chunk is in flight
    (its nodes are not known yet), nor where an end is unknown (``orig=True`` then: the
    writer's line names it)."""

    writer: Any
    progress: Progress
    sent: dict[int, Chunk] = field(default_factory=dict)  # submitted, not answered yet
    refused: dict[int, tuple[Chunk, Exception]] = field(default_factory=dict)
    unknown: dict[int, tuple[Chunk, int, Exception]] = field(default_factory=dict)  # version
    settle_s: float = 5.0  # how long the fates of the unknown ones are asked again
    count: int = 0  # chunks submitted (or refused before)
    stopped: bool = False
    held: Chunk | None = None  # read, not submitted yet
    ahead: Any = None  # the held chunk's ends asked (a Pending live_lookup)

    def send(self, chunk: Chunk) -> None:
        """Submit ``chunk`` (``--window 1``), or the chunk held, holding this one."""
        if self.writer.window == 1:
            self._submit(chunk, None)
            return
        held, ahead = self.held, self.ahead
        self.held, self.ahead = chunk, self._ask(chunk, held)
        if held is not None:
            self._submit(held, ahead)

    def finish(self) -> None:
        """The chunk held submitted, every chunk in flight answered; the first refusal
        raised as one line."""
        held, self.held = self.held, None
        if held is not None:
            self._submit(held, self.ahead)
        self._stop(None, None, None)

    def _ask(self, chunk: Chunk, held: Chunk | None) -> Any:
        """The ends of edge ``chunk`` asked now (None: not asked), unless node chunks
        are in flight or held (their nodes are not known yet)."""
        import numpy as np

        from graphrun.errors import GraphrunError
        from graphrun.graph.ingest_tables import NodeChunk

        nodes = [c for c in (held, *self.sent.values()) if isinstance(c, NodeChunk)]
        if isinstance(chunk, NodeChunk) or nodes:
            return None
        try:
            return self.writer.lookup_request(np.concatenate([chunk.src, chunk.dst]))
        except GraphrunError:  # not sent: its submit asks again, and names the chunk
            return None

    def _submit(self, chunk: Chunk, ahead: Any) -> None:
        from graphrun.errors import GraphrunError
        from graphrun.graph.ingest_tables import NodeChunk

        n, self.count = self.count, self.count + 1
        try:
            if isinstance(chunk, NodeChunk):
                self.writer.add_nodes(chunk.ntype, chunk.ids, chunk.features)
            else:
                self._add_edges(chunk, ahead)
            self.sent[n] = chunk
            self.writer.submit(tag=n)
            if self.writer.window == 1:
                self.writer.flush()
        except GraphrunError as exc:
            self._stop(exc, n, chunk)
        self._take()
        if self.refused:
            self._stop(None, n, chunk)

    def _add_edges(self, chunk: EdgeChunk, ahead: Any) -> None:
        ids = None if ahead is None else self.writer.looked_up(ahead)
        if ids is None or (ids < 0).any():  # not asked, or an end unknown: the writer's
            self.writer.add_edges(chunk.etype, chunk.src, chunk.dst, chunk.features, orig=True)
            return
        n = len(chunk.src)
        self.writer.add_edges(chunk.etype, ids[:n], ids[n:], chunk.features)

    def _take(self) -> list[tuple[int, Chunk]]:
        """The answers here: acknowledged chunks counted, refused ones kept, and those
        whose fate is unknown (the answer to their commit lost) kept with their version."""
        acked = []
        for a in self.writer.answered():
            chunk = self.sent.pop(a.tag)
            if a.unknown and a.error is not None:
                self.unknown[a.tag] = (chunk, a.version, a.error)
            elif a.error is None:
                self.progress.add(chunk, a.version)
                acked.append((a.tag, chunk))
            else:
                self.refused[a.tag] = (chunk, a.error)
        return acked

    def _settle(self) -> list[tuple[int, Chunk]]:
        """The chunks whose fate was unknown asked again (``GraphWriter.settle``: their
        decision sent again, through a replica or the restarted sequencer): those it
        answers move to the acknowledged or the refused; the rest stay unknown."""
        acked = []
        if self.unknown:
            for a in self.writer.settle(timeout=self.settle_s):
                chunk, *_ = self.unknown.pop(a.tag)
                if a.error is None:
                    self.progress.add(chunk, a.version)
                    acked.append((a.tag, chunk))
                else:
                    self.refused[a.tag] = (chunk, a.error)
        return acked

    def _stop(self, exc: Exception | None, n: int | None, chunk: Chunk | None) -> None:
        """Wait for every batch in flight; raise the first refusal (``exc``: raised while
        giving chunk ``n``: its own, unless it is an earlier batch's answer)."""
        from graphrun.errors import GraphrunError

        with contextlib.suppress(GraphrunError):  # its batch's answer says it
            self.writer.flush()
        acked = self._take()
        answers = [*self.refused.values(), *((c, e) for c, _, e in self.unknown.values())]
        known = any(e is exc for _, e in answers)
        if exc is not None and not known and n is not None and chunk is not None:
            self.sent.pop(n, None)  # refused before it was sent
            self.refused[n] = (chunk, exc)
        acked += self._settle()
        if self.refused or self.unknown:
            self.stopped = True
            raise self._error(acked)

    def _error(self, acked: list[tuple[int, Chunk]]) -> Exception:
        """One line: the first chunk refused (or of unknown fate), what is committed,
        what after it too, and the chunks whose fate is unknown with their versions."""
        from graphrun.errors import DatasetError, StoreError, UserError

        first = min(self.refused.keys() | self.unknown.keys())
        if first in self.refused:
            chunk, exc = self.refused[first]
            user = isinstance(exc, UserError)
            line = f"{chunk.where()}: {exc}" if user else f"{chunk.where()}: not committed: {exc}"
        else:
            chunk, user = self.unknown[first][0], False
            line = f"{chunk.where()}: fate unknown: the store was lost with its commit sent"
        line += f"; committed: {self.progress.line()}: every chunk before it"
        after = [c for k, c in acked if k > first]
        if after:
            line += f", and after it (in flight then) {_spans(after)}"
        others = [c for k, (c, _) in sorted(self.refused.items()) if k != first]
        if others:
            line += f"; refused too: {_spans(others)}"
        if after or others or self.unknown.keys() - {first}:
            line += "; nothing after them was sent"
        return (DatasetError if user else StoreError)(line + self._unknown_line())

    def _unknown_line(self) -> str:
        """The chunks whose fate is unknown, their versions, and how to learn it."""
        if not self.unknown:
            return ""
        chunks = [c for _, (c, _, _) in sorted(self.unknown.items())]
        versions = ", ".join(str(v) for _, (_, v, _) in sorted(self.unknown.items()))
        return (f"; fate unknown (committed or not: their commit was sent and the store "
                f"lost before it answered): {_spans(chunks)}, versions {versions}; once "
                "the store is back, GraphWriter.fate(V) asks the sequencer each version's "
                "(a node chunk sent again is refused if its ids are in the store)")  # fmt: skip


def _spans(chunks: list[Chunk]) -> str:
    """Chunks' rows, consecutive chunks of one file as one span (``f: rows 0..29``)."""
    spans: list[list[Any]] = []
    for c in chunks:
        lo, hi = int(c.rows[0]), int(c.rows[-1])
        if spans and spans[-1][0] == c.file and spans[-1][2] + 1 == lo:
            spans[-1][2] = hi
        else:
            spans.append([c.file, lo, hi])
    return ", ".join(f"{f}: rows {lo}..{hi}" for f, lo, hi in spans)


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
    return GraphWriter(KVClient(config), window=args.window)


def run(args: argparse.Namespace) -> int:
    from graphrun.errors import DatasetError, GraphrunError, StoreError, UserError
    from graphrun.graph.ingest_tables import read_chunks
    from graphrun.rpc.tuning import keep_large_allocations

    sources, keys = _checked(args)
    keep_large_allocations()  # a chunk's arrays and pieces are fresh buffers of 100s of KB
    writer = None if args.dry_run else _writer(args, keys)
    progress = Progress(args.progress_s)
    sender = None if writer is None else Sender(writer, progress, settle_s=min(args.timeout, 5))
    try:
        for chunk in read_chunks(sources, args.chunk_rows):
            if sender is None:
                progress.add(chunk, None)
            else:
                sender.send(chunk)
        if sender is not None:
            sender.finish()
            sender.writer.close()  # the partitions' last decisions delivered before it ends
    except GraphrunError as exc:
        if sender is not None and sender.stopped:
            raise  # one line already: the refused chunk and what was committed
        if sender is not None:
            sender.finish()  # a bad file: the chunks in flight answered first
        done = "checked" if writer is None else "committed"
        line = f"{exc}; before it: {progress.line()} {done}"
        raise (DatasetError(line) if isinstance(exc, UserError) else StoreError(line)) from exc
    finally:
        if writer is not None:
            writer.client.close()
    what = "checked (dry run, nothing sent)" if writer is None else "committed"
    print(f"ingested {args.src}: {progress.line()} {what}")
    return 0
