"""A feature cache in the trainer's GPU memory: the hot rows never cross PCIe.

On a power-law graph a small share of the nodes appears in most mini-batches. The
cache keeps the rows of the hottest nodes (by degree, or by how often the trainer's
batches reached them: :func:`hot_rows` takes any score) on the device, with a dense
id -> slot map on the host, so the feed (:mod:`graphrun.distributed.devicefeed`) packs
and copies only the rows it misses and builds ``x`` on the device. Where the whole
table fits the budget, every row is cached (:func:`fits_whole`) and the loaders need not
gather features at all.

The budget is ``runtime.gpuFeatureCacheMb`` when given, else a fraction of the GPU's
free memory at start (:func:`budget_bytes`). Selection, the map and the assembly are
plain torch and run on CPU tensors in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from graphrun.errors import ArgumentError

#: Share of the GPU's free memory the cache takes when no size is given.
DEFAULT_FRACTION = 0.25


def budget_bytes(cache_mb: int | None, free_bytes: int, fraction: float = DEFAULT_FRACTION) -> int:
    """The cache's size: ``cache_mb`` MiB when given (never more than the free memory),
    else ``fraction`` of ``free_bytes``."""
    if not 0.0 <= fraction <= 1.0:
        raise ArgumentError(f"GPU cache fraction: {fraction} is not in [0, 1]")
    if cache_mb is not None:
        if cache_mb < 0:
            raise ArgumentError(f"runtime.gpuFeatureCacheMb: expected >= 0, got {cache_mb}")
        return min(cache_mb << 20, max(free_bytes, 0))
    return int(max(free_bytes, 0) * fraction)


def fits_whole(num_rows: int, row_bytes: int, budget: int) -> bool:
    return num_rows * row_bytes <= budget


def hot_rows(scores: Tensor, budget: int, row_bytes: int) -> Tensor:
    """Ids of the rows to cache, sorted: the highest ``scores`` (degree or access counts;
    ties to the lower id), as many as ``budget`` bytes hold; rows never reached (score
    0) are left out."""
    if row_bytes <= 0:
        raise ArgumentError(f"row_bytes: expected > 0, got {row_bytes}")
    k = min(budget // row_bytes, int((scores > 0).sum()))
    if k <= 0:
        return torch.empty(0, dtype=torch.long)
    # stable sort of -score: equal scores keep id order, so the choice is deterministic
    order = torch.sort(-scores.to(torch.float64), stable=True).indices[:k]
    return torch.sort(order).values


@dataclass(frozen=True)
class SplitPlan:
    """Where a batch's rows come from: positions in the batch served by the cache (and
    their cache slots), and positions to copy from the host."""

    hit_pos: Tensor
    hit_slot: Tensor
    miss_pos: Tensor


class GpuFeatureCache:
    """Rows of one node feature for the sorted ``ids``, resident on ``rows.device``."""

    def __init__(self, ids: Tensor, rows: Tensor, id_space: int) -> None:
        if ids.numel() != rows.size(0):
            raise ArgumentError(f"GPU cache: {ids.numel()} ids for {rows.size(0)} rows")
        self.ids, self.rows = ids, rows
        self.id_space = id_space
        self.slot_of = torch.full((id_space,), -1, dtype=torch.int32)
        self.slot_of[ids] = torch.arange(ids.numel(), dtype=torch.int32)
        self.whole = ids.numel() == id_space

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    def split(self, n_id: Tensor) -> SplitPlan:
        slot = self.slot_of[n_id]
        hit = slot >= 0
        hit_pos = torch.nonzero(hit).squeeze(1)
        miss_pos = torch.nonzero(~hit).squeeze(1)
        return SplitPlan(hit_pos, slot[hit_pos].long(), miss_pos)

    def assemble(
        self,
        n: int,
        hit_pos: Tensor,
        hit_slot: Tensor,
        miss_pos: Tensor | None,
        miss_x: Tensor | None,
    ) -> Tensor:
        """The batch's ``x`` (``n`` rows) on the cache's device: cached rows gathered
        there, the copied misses scattered in."""
        x = torch.empty((n, *self.rows.shape[1:]), dtype=self.rows.dtype, device=self.rows.device)
        if hit_pos.numel():
            x[hit_pos] = self.rows[hit_slot]
        if miss_pos is not None and miss_x is not None and miss_pos.numel():
            x[miss_pos] = miss_x.to(self.rows.dtype)
        return x


class Rows(Protocol):
    """A table read by ids: a tensor, or a store ``DistTensor``."""

    def __getitem__(self, ids: Tensor, /) -> Tensor: ...


def build_cache(
    table: Rows, ids: Tensor, id_space: int, device: torch.device, chunk: int = 1 << 18
) -> GpuFeatureCache:
    """Read the rows ``ids`` of ``table`` (``table[ids]``: a tensor or a store
    ``DistTensor``) in chunks and keep them on ``device``."""
    parts = []
    for lo in range(0, ids.numel(), chunk):
        rows = table[ids[lo : lo + chunk]]
        parts.append(torch.as_tensor(rows).to(device))
    if parts:
        rows_all = torch.cat(parts)
    else:
        probe = torch.as_tensor(table[ids[:0]])
        rows_all = probe.to(device)
    return GpuFeatureCache(ids, rows_all, id_space)
