"""Held-out edges for link prediction, and keeping them out of message passing.

An edge's split (train, validation or test) is a hash of its two end points, taken
unordered, and a seed — a fixed property of the graph, not a stored mask:

* both directions of an undirected edge (and parallel copies) fall in the same split;
* every process (trainer, sampler worker) decides it alike, without a lookup, and the
  split does not change with the partitioning or the number of trainers.

:meth:`EdgeSplit.exclude` removes from a sampled mini-batch every edge that is held out
(validation and test edges never carry messages, in training or in evaluation: the
transductive setting of PyG's ``RandomLinkSplit`` with the training graph for message
passing) and every edge joining the end points of one of the batch's positive targets,
in either direction (DGL's ``exclude="reverse_id"``): a model must not see the edge it
is asked to predict.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError
from graphrun.sampling.mfg import SampledSubgraph

U = TypeVar("U", np.ndarray, np.uint64)  # hashed elementwise, or one seed

TRAIN, VAL, TEST = 0, 1, 2
SPLITS = {"train": TRAIN, "val": VAL, "test": TEST}

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: U) -> U:
    """splitmix64's finaliser: a bijection of uint64 with good avalanche."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def pair_key(src: Tensor, dst: Tensor, num_nodes: int) -> Tensor:
    """One int64 per unordered pair ``{src, dst}``: ``min * num_nodes + max``."""
    lo, hi = torch.minimum(src, dst), torch.maximum(src, dst)
    return lo * int(num_nodes) + hi


@dataclass(frozen=True)
class EdgeSplit:
    """Fractions of the edges held out for validation and test, and the hash's seed."""

    val: float = 0.05
    test: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        for name, frac in (("val", self.val), ("test", self.test)):
            if not (0.0 <= frac < 1.0):
                raise ArgumentError(f"{name}: expected a fraction in [0, 1), got {frac!r}")
        if self.val + self.test >= 1.0:
            raise ArgumentError(f"val + test: {self.val} + {self.test} leaves no training edges")

    def of(self, src: Tensor, dst: Tensor) -> Tensor:
        """The split (``TRAIN``, ``VAL`` or ``TEST``, int8) of each edge ``src -> dst``."""
        s = src.numpy().astype(np.uint64, copy=False)
        d = dst.numpy().astype(np.uint64, copy=False)
        lo, hi = np.minimum(s, d), np.maximum(s, d)
        with np.errstate(over="ignore"):
            seed = _mix(np.uint64(self.seed & (2**64 - 1)) + _GOLDEN)
            h = _mix(_mix(lo ^ seed) + hi * _GOLDEN)
        u = torch.from_numpy((h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53)))
        out = torch.zeros(src.numel(), dtype=torch.int8)
        out[u < self.val] = VAL
        out[(u >= self.val) & (u < self.val + self.test)] = TEST
        return out

    def exclude(
        self, sub: SampledSubgraph, pos_src: Tensor, pos_dst: Tensor, num_nodes: int
    ) -> SampledSubgraph:
        """``sub`` without its held-out edges and without any edge joining a positive
        target pair ``(pos_src[i], pos_dst[i])`` (global ids), in either direction."""
        src, dst = sub.node[sub.row], sub.node[sub.col]
        keep = self.of(src, dst) == TRAIN
        targets = pair_key(pos_src, pos_dst, num_nodes)
        keep &= ~torch.isin(pair_key(src, dst, num_nodes), targets)
        return keep_edges(sub, keep)


def keep_edges(sub: SampledSubgraph, keep: Tensor) -> SampledSubgraph:
    """``sub`` with only the edges where ``keep`` holds; the nodes (and so the layout of
    the message-flow graphs) are unchanged, each layer keeps its remaining edges."""
    layer = torch.repeat_interleave(
        torch.arange(sub.num_layers), torch.tensor(sub.num_sampled_edges, dtype=torch.long)
    )
    counts = torch.bincount(layer[keep], minlength=sub.num_layers)
    return replace(
        sub,
        row=sub.row[keep],
        col=sub.col[keep],
        edge=sub.edge[keep],
        edge_type=None if sub.edge_type is None else sub.edge_type[keep],
        num_sampled_edges=[int(c) for c in counts],
    )


def split_edges(
    eids: Tensor, src: Tensor, dst: Tensor, split: EdgeSplit, which: str, num_nodes: int
) -> Tensor:
    """The ids among ``eids`` (end points ``src``/``dst``) in split ``which``. Held-out
    splits keep one edge per unordered pair: the two directions of an undirected edge
    are one positive, not two."""
    mask = split.of(src, dst) == SPLITS[which]
    ids = eids[mask]
    if which == "train" or ids.numel() == 0:
        return ids
    keys = pair_key(src[mask], dst[mask], num_nodes)
    _, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), ids.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(ids.numel()), reduce="amin")
    return ids[first.sort().values]
