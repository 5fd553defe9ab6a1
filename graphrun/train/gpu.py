"""A task's path from the loaders to its device: the feed, the GPU feature cache, stats.

On CPU trainers :class:`DevicePath` hands the loaders' batches through untouched. On a
GPU it wraps each loader in a :class:`~graphrun.distributed.devicefeed.Prefetcher`
(pinned staging slots, copies on a side stream, the next batch staged while the step
computes) and keeps a :class:`~graphrun.distributed.gpucache.GpuFeatureCache`:

* the whole feature table when it fits the budget (``runtime.gpuFeatureCacheMb``, else a
  quarter of the GPU's free memory): then the loaders gather no features at all
  (:attr:`loader_feature` names none) and ``x`` is built on the GPU from ``n_id``;
* otherwise the rows the trainer's batches reached most in the epochs so far (counted
  by the feed), refreshed after each epoch; misses are copied.

After each epoch :meth:`end_epoch` reports ``gpu_idle_share`` (the share of the epoch
the trainer waited for its next batch), ``gpu_cache_hit_rate``, ``h2d_mb`` and
``gpu_feed_ms`` (the feed thread's milliseconds a batch: packing and issuing copies).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from graphrun.distributed.devicefeed import DeviceFeed, Prefetcher, Transfer, transfer_for
from graphrun.distributed.gpucache import (
    GpuFeatureCache,
    budget_bytes,
    build_cache,
    fits_whole,
    hot_rows,
)
from graphrun.names import RoleName
from graphrun.train.data import Batch, GraphData
from graphrun.train.device import oom_guard

#: The feature name the loaders get when the GPU holds the whole table: no graph has it,
#: so they gather none.
NO_FEATURE = "__on_gpu__"


class DevicePath:
    def __init__(
        self,
        data: GraphData,
        device: torch.device,
        ntype: str,
        feature: str,
        role: RoleName,
        batch_size: int,
        cache_mb: int | None = None,
        transfer: Transfer | None = None,
        free_bytes: int | None = None,
        depth: int = 2,
    ) -> None:
        self.data, self.device, self.ntype, self.feature = data, device, ntype, feature
        self.role, self.batch_size, self.depth = role, batch_size, depth
        self.active = device.type == "cuda" or transfer is not None
        self.cache: GpuFeatureCache | None = None
        self.counts: torch.Tensor | None = None
        self.budget = 0
        self.row_bytes = 0
        self._open: Prefetcher[Batch] | None = None
        if not self.active:
            self.feed = None
            return
        self.feed = DeviceFeed(transfer or transfer_for(device), slots=depth + 2)
        dim = data.feature_dim(ntype, feature)
        if dim is None or len(getattr(data, "edge_types", [()])) != 1:
            return  # no features, or a heterograph: copies only
        if free_bytes is None:
            free_bytes = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0
        self.budget = budget_bytes(cache_mb, free_bytes)
        probe = torch.as_tensor(data.node_table(ntype, feature)[torch.zeros(1, dtype=torch.long)])
        self.row_bytes = max(1, probe[:1].numel() * probe.element_size())
        n = data.num_nodes(ntype)
        if fits_whole(n, self.row_bytes, self.budget):
            self._fill(torch.arange(n))
        elif self.budget >= self.row_bytes:
            self.counts = torch.zeros(n, dtype=torch.int32)

    @property
    def loader_feature(self) -> str:
        """The feature name the loaders should gather (none when the GPU holds them all)."""
        return NO_FEATURE if self.cache is not None and self.cache.whole else self.feature

    def _fill(self, ids: torch.Tensor) -> None:
        table = self.data.node_table(self.ntype, self.feature)
        self.cache = None  # free the old rows first
        if self.feed is not None:
            self.feed.cache = None
        self.cache = build_cache(table, ids, self.data.num_nodes(self.ntype), self.device)
        assert self.feed is not None
        self.feed.cache = self.cache

    def _counted(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        counts = self.counts
        assert counts is not None
        for b in batches:
            n_id = getattr(b.data, "n_id", None)
            if n_id is not None:
                counts.index_add_(0, n_id, torch.ones_like(n_id, dtype=torch.int32))
            yield b

    def batches(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """``batches`` on the device, staged ahead (as they are on CPU trainers)."""
        if not self.active:
            return batches
        assert self.feed is not None
        if self.counts is not None:
            batches = self._counted(batches)
        self.close()
        self._open = Prefetcher(batches, self.feed, depth=self.depth)
        return self._open

    def close(self) -> None:
        """Stop the open prefetcher (its thread may be staging a batch nobody will use)."""
        if self._open is not None:
            self._open.close()
            self._open = None

    def guard(self) -> contextlib.AbstractContextManager[None]:
        """A CUDA out-of-memory in a step becomes one line naming the role and batch."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return oom_guard(self.role, self.batch_size, "training.batchSize")

    def end_epoch(self, epoch_s: float) -> dict[str, float]:
        """This epoch's feed stats; refreshes a partial cache from the access counts."""
        self.close()
        if not self.active or self.feed is None:
            return {}
        st = self.feed.stats
        out = {
            "gpu_idle_share": round(min(1.0, st.wait_s / epoch_s) if epoch_s > 0 else 0.0, 4),
            "h2d_mb": round(st.h2d_bytes / 1e6, 1),
            "gpu_feed_ms": round(st.stage_s / max(st.batches, 1) * 1e3, 2),
        }
        if st.hit_rate is not None:
            out["gpu_cache_hit_rate"] = round(st.hit_rate, 4)
        st.reset()
        if self.counts is not None and self.budget:
            self._fill(hot_rows(self.counts, self.budget, self.row_bytes))
        return out
