"""``partition_graph``: assign, relabel, measure and write a partition directory.

The pipeline works from the graph's (memory-mapped) arrays with vectorised numpy:

1. assign every node a partition: METIS (one process) or KaMinPar (every core of this
   machine, the ``parallel`` mode, :mod:`graphrun.partition.kaminpar`) on the
   symmetrised graph — with combined vertex weights and a rebalancing pass when
   training nodes or edges must be balanced, see :mod:`graphrun.partition.balance` —
   or a balanced random deal;
2. relabel nodes and edges so every partition owns contiguous id ranges per type
   (:mod:`graphrun.partition.relabel`);
3. measure edge cut and balance (:mod:`graphrun.partition.quality`);
4. write the partition directory part by part into a temporary sibling of ``out``
   and rename it when complete (:mod:`graphrun.partition.format`).

Heterographs are partitioned as one homogeneous graph.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphrun.errors import ArgumentError, DatasetError
from graphrun.files import atomic_dir, write_failed
from graphrun.graph import Graph
from graphrun.graph.graph import release
from graphrun.partition import balance
from graphrun.partition.arrays import pieces
from graphrun.partition.book import PartitionBook
from graphrun.partition.format import (
    WriteOptions,
    write_partition,
)
from graphrun.partition.kaminpar import kaminpar_assign
from graphrun.partition.metis import metis_assign, symmetric_csr
from graphrun.partition.peaks import Phases
from graphrun.partition.quality import Quality, measure, train_mask_of
from graphrun.partition.relabel import relabel

METHODS = ("metis", "random", "kaminpar")


@dataclass(frozen=True, eq=False)
class PartitionResult:
    path: Path
    book: PartitionBook
    quality: Quality
    method: str
    num_parts: int
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase
    peaks: dict[str, float] = field(default_factory=dict)  # peak RSS (MiB) per phase
    peak_mb: float = 0.0  # of the process, up to the end of the write


def check_arguments(
    graph: Graph, parts: int, method: str, halo_hops: int, tolerance: float = 0.0
) -> None:
    if method not in METHODS:
        raise ArgumentError(f"method: {method!r} is not one of {', '.join(METHODS)}")
    if not isinstance(parts, int | np.integer) or isinstance(parts, bool) or parts < 1:
        raise ArgumentError(f"parts: expected a positive integer, got {parts!r}")
    if parts > graph.num_nodes:
        raise ArgumentError(
            f"parts: {parts} is larger than the node count ({graph.num_nodes}) of {graph.name!r}"
        )
    if not isinstance(halo_hops, int | np.integer) or halo_hops < 0:
        raise ArgumentError(f"halo_hops: expected an integer >= 0, got {halo_hops!r}")
    if not isinstance(tolerance, int | float) or not math.isfinite(tolerance) or tolerance < 0:
        raise ArgumentError(f"tolerance: expected a finite number >= 0, got {tolerance!r}")


def assign(
    graph: Graph,
    parts: int,
    method: str = "metis",
    *,
    balance_train: bool = False,
    balance_edges: bool = False,
    tolerance: float = balance.DEFAULT_TOLERANCE,
    seed: int = 0,
    threads: int | None = None,
    phase: Callable[[str], None] | None = None,
) -> np.ndarray:
    """Partition id (int64) of every node (``threads``: KaMinPar's, default every core;
    ``phase("assign")`` is called once the symmetric graph is built)."""
    check_arguments(graph, parts, method, 0, tolerance)
    train = train_mask_of(graph) if balance_train else None
    if balance_train and train is None:
        raise ArgumentError(
            f"balance_train: graph {graph.name!r} has no training nodes "
            "(no node type has a non-empty 'train_mask')"
        )
    in_degree = in_degrees(graph) if balance_edges else None
    if method == "random":
        return balance.random_assign(
            graph.num_nodes, parts, train_mask=train, in_degree=in_degree, seed=seed
        )
    xadj, adjncy = symmetric_csr(graph.src, graph.dst, graph.num_nodes)
    crit = balance.criteria(
        graph.num_nodes,
        in_degree if in_degree is not None else np.zeros(0),
        train,
        balance_train,
        balance_edges,
    )
    weights = balance.combined_weights(crit) if crit.shape[1] > 1 else None
    if phase is not None:
        phase("assign")
    if method == "kaminpar":
        part = kaminpar_assign(xadj, adjncy, parts, vweights=weights, seed=seed, threads=threads)
    else:
        part = metis_assign(xadj, adjncy, parts, vweights=weights, seed=seed)
    if parts > 1:  # also repairs parts METIS left (nearly) empty
        part = balance.rebalance(part, crit, xadj, adjncy, parts, tolerance=tolerance, seed=seed)
    return part


def in_degrees(graph: Graph) -> np.ndarray:
    degree = np.zeros(graph.num_nodes, dtype=np.int64)
    for _, d in pieces(graph.dst):
        degree += np.bincount(d, minlength=graph.num_nodes)
    return degree


def let_go(graph: Graph) -> None:
    """Unmap the pages of a memory-mapped graph that reading it touched (its checks
    read every id and feature): later phases read it again slice by slice."""
    for arr in (graph.src, graph.dst):
        release(arr)
    for feats in (*graph.ndata.values(), *graph.edata.values()):
        for arr in feats.values():
            release(arr)


def partition_graph(
    graph: Graph,
    out: str | Path,
    parts: int,
    method: str = "metis",
    balance_train: bool = False,
    balance_edges: bool = False,
    halo_hops: int = 1,
    seed: int = 0,
    tolerance: float = balance.DEFAULT_TOLERANCE,
    id_maps: Mapping[str, np.ndarray] | None = None,
    threads: int | None = None,
    phases: Phases | None = None,
) -> PartitionResult:
    """Partition ``graph`` into ``parts`` and write the partition directory ``out``.

    ``id_maps`` (``{ntype: raw ids}``, as an importer returns them) are copied to
    ``out/mapping/ids/`` so new ids can be traced back to the raw input ids.
    ``phases`` (a caller's, which may have timed reading the graph) gets the seconds
    and peak memory of ``graph`` (the symmetric adjacency), ``assign``, ``relabel``
    and ``write``.
    """
    check_arguments(graph, parts, method, halo_hops, tolerance)
    for ntype, ids in (id_maps or {}).items():
        if ntype not in graph.node_types or len(ids) != graph.num_nodes_of(ntype):
            raise ArgumentError(f"id_maps[{ntype!r}]: expected one id per {ntype!r} node")
    start = time.perf_counter()
    clock = phases if phases is not None else Phases()
    let_go(graph)
    try:
        with atomic_dir(out, DatasetError) as tmp:
            clock.start("graph" if method != "random" else "assign")
            part = assign(
                graph,
                parts,
                method,
                balance_train=balance_train,
                balance_edges=balance_edges,
                tolerance=tolerance,
                seed=seed,
                threads=threads,
                phase=clock.start,
            )
            clock.start("relabel")
            quality = measure(graph, part, parts)
            rl = relabel(graph, part, parts)
            del part
            clock.start("write")
            opts = WriteOptions(
                method, int(halo_hops), balance_train, balance_edges, tolerance, seed
            )
            write_partition(graph, rl, tmp, opts, quality, id_maps)
            book = rl.book
            del rl
        clock.start("")
    except OSError as exc:
        raise write_failed(Path(out), exc) from None
    return PartitionResult(
        path=Path(out),
        book=book,
        quality=quality,
        method=method,
        num_parts=parts,
        seconds=time.perf_counter() - start,
        phases=clock.seconds(),
        peaks=clock.peaks(),
        peak_mb=clock.peak_mb,
    )
