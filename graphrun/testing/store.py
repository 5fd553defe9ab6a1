"""In-process store servers and small partition directories for tests.

* :func:`make_partition_dir` — partition a seeded synthetic graph (homogeneous
  :func:`~graphrun.testing.graphs.community_graph` or ``hetero=True``) into
  ``num_parts`` with the real partitioner; returns ``(graph, path)``.
* :class:`StoreThread` — run :func:`~graphrun.store.server.run_server` for one
  partition in a thread of this process (real sockets and shared memory, no process
  start-up cost); ``with StoreThread(cfg) as s: s.address``. A failure in the server
  is re-raised on exit. Use :mod:`graphrun.local.stores` when a test must kill a
  server process.
* :func:`store_threads` — one per partition, as a context manager.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Self

import numpy as np

from graphrun.errors import GraphrunError
from graphrun.graph import Graph
from graphrun.partition import partition_graph
from graphrun.partition.book import PartitionBook
from graphrun.store.server import ServerConfig, run_server
from graphrun.testing.graphs import community_graph, hetero_graph
from graphrun.testing.threads import BackgroundLoop, stop_all


def make_partition_dir(
    out: str | Path,
    num_parts: int = 2,
    *,
    num_nodes: int = 600,
    num_edges: int = 3000,
    hetero: bool = False,
    method: str = "random",
    seed: int = 0,
) -> tuple[Graph, Path]:
    graph = (
        hetero_graph(seed=seed)
        if hetero
        else community_graph(num_nodes, num_edges, seed=seed, feat_dim=8)
    )
    path = Path(out)
    partition_graph(graph, path, num_parts, method=method, seed=seed)
    return graph, path


def range_book(sizes: list[int]) -> PartitionBook:
    """A homogeneous partition book whose partition ``k`` owns ``sizes[k]`` nodes (and as
    many edges), in order."""
    off = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return PartitionBook.from_config(
        {
            "num_parts": len(sizes),
            "node_types": ["_N"],
            "edge_types": [["_N", "_E", "_N"]],
            "node_offsets": off,
            "edge_offsets": off,
            "node_ranges": {"_N": off},
            "edge_ranges": {"_N:_E:_N": off},
        }
    )


class StoreThread(BackgroundLoop):
    """One store server in a background thread."""

    join_timeout = 20.0

    def __init__(self, cfg: ServerConfig, ready_timeout: float = 30.0) -> None:
        self.cfg = cfg
        self.address = ""
        self._ready = threading.Event()
        self._timeout = ready_timeout
        super().__init__(f"store-{cfg.part}")

    def _loop(self) -> None:
        def ready(address: str) -> None:
            self.address = address
            self._ready.set()

        run_server(self.cfg, should_stop=self._stop.is_set, on_ready=ready, waker=self.waker)

    def _failed(self) -> None:
        self._ready.set()

    def start(self) -> Self:
        super().start()
        if not self._ready.wait(self._timeout):
            raise GraphrunError(f"store thread of partition {self.cfg.part} not ready")
        if self._error is not None:
            raise self._error
        return self


@contextlib.contextmanager
def store_threads(cfg: ServerConfig, num_parts: int) -> Iterator[list[StoreThread]]:
    """One :class:`StoreThread` per partition (``cfg.part`` is replaced), stopped together."""
    threads: list[StoreThread] = []
    try:
        for p in range(num_parts):
            threads.append(StoreThread(replace(cfg, part=p)).start())
        yield threads
    finally:
        stop_all(threads)
