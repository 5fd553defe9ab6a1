"""Partition quality: edge cut and balance, computed from the assignment alone.

* ``edge_cut``: the fraction of edges whose two endpoints lie in different
  partitions (self loops never count as cut).
* ``node_balance`` / ``edge_balance`` / ``train_balance``: max over partitions
  divided by the mean, of owned nodes, owned edges (an edge is owned by its
  destination's partition) and training nodes (``train_mask`` of any node type).
  1.0 is perfect; ``train_balance`` is ``None`` when the graph has no training nodes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from graphrun.graph import Graph
from graphrun.graph.graph import release
from graphrun.partition.arrays import pieces


@dataclass(frozen=True)
class Quality:
    edge_cut: float
    node_balance: float
    edge_balance: float
    train_balance: float | None
    num_cut_edges: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        train = "n/a" if self.train_balance is None else f"{self.train_balance:.3f}"
        return (
            f"edge cut {self.edge_cut:.4f} ({self.num_cut_edges} edges), balance max/mean: "
            f"nodes {self.node_balance:.3f}, edges {self.edge_balance:.3f}, train {train}"
        )


def max_over_mean(counts: np.ndarray) -> float:
    mean = float(np.mean(counts)) if len(counts) else 0.0
    return float(np.max(counts) / mean) if mean > 0 else 1.0


def row_flags(m: np.ndarray) -> np.ndarray:
    """One boolean per row of a mask: its first value is non-zero (a mask may have any
    trailing shape, and no rows: a chunk without nodes of the mask's type)."""
    m = np.asarray(m)
    if m.size == 0:
        return np.zeros(len(m), dtype=bool)
    return m.reshape(len(m), -1)[:, 0] != 0


def train_mask_of(graph: Graph) -> np.ndarray | None:
    """One boolean per node: a training node of any type (None when there are none)."""
    nto = graph.node_type_offsets
    assert nto is not None
    found = False
    mask = np.zeros(graph.num_nodes, dtype=bool)
    for t, ntype in enumerate(graph.node_types):
        m = graph.ndata.get(ntype, {}).get("train_mask")
        if m is not None:
            mask[nto[t] : nto[t + 1]] = row_flags(m)
            found = True
    return mask if found and mask.any() else None


def cut_edges(part: np.ndarray, src: np.ndarray, dst: np.ndarray) -> int:
    """Edges whose endpoints are in different parts, counted in slices (little memory;
    a memory-mapped graph lets go of each slice)."""
    total = 0
    for i, s in pieces(src):
        total += int(np.count_nonzero(part[s] != part[dst[i : i + len(s)]]))
        release(dst)
    return total


def measure(graph: Graph, part: np.ndarray, num_parts: int) -> Quality:
    cut = cut_edges(part, graph.src, graph.dst)
    nodes = np.bincount(part, minlength=num_parts)
    edges = np.zeros(num_parts, dtype=np.int64)
    for _, d in pieces(graph.dst):
        edges += np.bincount(part[d], minlength=num_parts)
    train = train_mask_of(graph)
    return Quality(
        edge_cut=cut / graph.num_edges if graph.num_edges else 0.0,
        node_balance=max_over_mean(nodes),
        edge_balance=max_over_mean(edges),
        train_balance=None
        if train is None
        else max_over_mean(np.bincount(part[train], minlength=num_parts)),
        num_cut_edges=cut,
    )
