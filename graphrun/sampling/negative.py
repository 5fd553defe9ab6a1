"""Negative sampling for link prediction.

A :class:`NegativeSampler` draws ``k`` corrupted destinations per positive edge
``(src, dst)``: the source is kept, the destination drawn from ``[0, num_nodes)``
(global ids of a homogeneous graph, or per-type ids of the destination type):

* ``uniform`` — every candidate equally likely;
* ``degree`` — probability proportional to ``degree ** power`` (``power=0.75`` as in
  word2vec/PinSAGE; ``1.0`` is proportional to the degree), drawn by inverse CDF
  over a cumulative table built once.

Negatives are not filtered against the positive edges (on sparse graphs a
collision is rare; the loss tolerates it, as PyG's ``LinkNeighborLoader`` does).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError


class NegativeSampler:
    def __init__(
        self,
        num_nodes: int,
        k: int = 1,
        mode: Literal["uniform", "degree"] = "uniform",
        degrees: Tensor | np.ndarray | None = None,
        power: float = 0.75,
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ArgumentError(f"k: expected an int >= 1 negatives per positive, got {k!r}")
        if num_nodes < 1:
            raise ArgumentError(f"num_nodes: expected >= 1 candidates, got {num_nodes}")
        self.num_nodes = int(num_nodes)
        self.k = k
        self.mode = mode
        self._cdf: Tensor | None = None
        if mode == "degree":
            if degrees is None:
                raise ArgumentError("degrees: required for mode='degree'")
            deg = torch.as_tensor(degrees).to(torch.float64)
            if deg.shape != (self.num_nodes,):
                raise ArgumentError(
                    f"degrees: expected shape ({self.num_nodes},), got {tuple(deg.shape)}"
                )
            if bool((deg < 0).any()):
                raise ArgumentError("degrees: must be non-negative")
            w = deg.pow(power)
            if float(w.sum()) <= 0:
                raise ArgumentError("degrees: all zero, nothing to sample")
            self._cdf = torch.cumsum(w, 0) / w.sum()
        elif mode != "uniform":
            raise ArgumentError(f"mode: expected 'uniform' or 'degree', got {mode!r}")

    def draw(self, n: int, generator: torch.Generator) -> Tensor:
        """``n`` candidate ids."""
        if self._cdf is None:
            return torch.randint(0, self.num_nodes, (n,), generator=generator)
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        return torch.searchsorted(self._cdf, u, right=True).clamp_max_(self.num_nodes - 1)

    def sample(self, src: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``(neg_src, neg_dst)``: every source repeated ``k`` times, destinations drawn."""
        neg_src = src.repeat_interleave(self.k)
        return neg_src, self.draw(neg_src.numel(), generator)
