"""KaMinPar (shared-memory parallel multilevel partitioner, MIT) for the ``parallel`` mode.

The ``kaminpar`` wheel's Python binding reads graphs from files only, so the undirected
adjacency of :func:`graphrun.partition.metis.symmetric_csr` is written once in the
ParHiP binary format (KaMinPar's ``docs/graph_file_format.md``) to a temporary file:

* a 24-byte header of three uint64 — a version bit field, ``n`` and ``m`` (directed
  adjacency entries). Version bits, least significant first: edge weights absent (1),
  node weights absent (1) / present (0), 64-bit edge ids (0), 64-bit node ids (0), 64-bit
  node weights (0);
* ``n + 1`` uint64 offsets, each the byte position in the file of a node's first
  neighbour;
* ``m`` uint64 neighbour ids, then ``n`` int64 node weights when present.

The binding is built with 64-bit ids (``kaminpar.__64bit__``): the (int32) adjacency
is widened as it is written, slice by slice.
KaMinPar balances one weight per node; training nodes and edges are balanced as with
METIS, through combined weights and :func:`graphrun.partition.balance.rebalance`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from graphrun.errors import GraphrunError
from graphrun.partition.arrays import SLICE
from graphrun.partition.metis import trivial_parts

HEADER = 24
EDGE_WEIGHTS_ABSENT = 1
NODE_WEIGHTS_ABSENT = 2


def write_parhip(
    path: Path, xadj: np.ndarray, adjncy: np.ndarray, vweights: np.ndarray | None
) -> None:
    n, m = len(xadj) - 1, len(adjncy)
    version = EDGE_WEIGHTS_ABSENT | (0 if vweights is not None else NODE_WEIGHTS_ABSENT)
    with open(path, "wb") as f:
        np.array([version, n, m], dtype=np.uint64).tofile(f)
        offsets = np.asarray(xadj, dtype=np.uint64) * np.uint64(8)
        offsets += np.uint64(HEADER + 8 * (n + 1))
        offsets.tofile(f)
        del offsets
        for i in range(0, m, SLICE):  # widened slice by slice: no 8-byte copy of it all
            np.asarray(adjncy[i : i + SLICE], dtype=np.uint64).tofile(f)
        if vweights is not None:
            np.asarray(vweights, dtype=np.int64).tofile(f)


def kaminpar_assign(
    xadj: np.ndarray,
    adjncy: np.ndarray,
    num_parts: int,
    *,
    vweights: np.ndarray | None = None,
    seed: int = 0,
    threads: int | None = None,
    imbalance: float = 0.03,
) -> np.ndarray:
    """Partition id (int64) of every vertex, by KaMinPar on ``threads`` (default: all) cores."""
    import kaminpar

    if (trivial := trivial_parts(xadj, num_parts)) is not None:
        return trivial
    threads = threads or len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="graphrun-kaminpar-") as tmp:
        path = Path(tmp) / "graph.parhip"
        try:
            write_parhip(path, xadj, adjncy, vweights)
        except OSError as exc:
            raise GraphrunError(f"{path}: cannot write KaMinPar's input ({exc.strerror})") from exc
        kaminpar.reseed(int(seed))
        graph = kaminpar.load_graph(str(path), kaminpar.GraphFileFormat.PARHIP)
    try:
        solver = kaminpar.KaMinPar(int(threads), kaminpar.default_context())
        parts = solver.compute_partition(graph, int(num_parts), float(imbalance))
    except (RuntimeError, ValueError, MemoryError) as exc:
        raise GraphrunError(f"KaMinPar failed to partition the graph: {exc}") from exc
    return np.asarray(parts, dtype=np.int64)
