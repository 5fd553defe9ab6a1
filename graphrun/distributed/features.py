"""Node features from the store, as a :class:`~graphrun.sampling.sampler.FeatureSource`."""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import Tensor

from graphrun.distributed.cache import CachedRows, FeatureCache
from graphrun.names import TensorKey
from graphrun.store.client import KVClient
from graphrun.store.dist_tensor import as_torch
from graphrun.store.routing import take_into


class Bf16Rows:
    """One float32 feature's rows that this process reads without a request, in bf16:
    a co-located partition's block (ids ``start ..``, from its shared memory) and the
    feature cache's rows, converted once into one table (two bytes a value: half what
    the rows take in fp32). :meth:`slots` maps ids to its rows, -1 where the rows must be
    pulled."""

    def __init__(self, part: int, start: int, block: np.ndarray, cached: CachedRows | None) -> None:
        self.part, self.start, self.n_block = part, start, len(block)
        self.cached = cached
        n_cached = len(cached.ids) if cached is not None else 0
        shape = (self.n_block + n_cached, *block.shape[1:])
        self.table = torch.empty(shape, dtype=torch.bfloat16)
        self.table[: self.n_block].copy_(as_torch(block))  # fp32 -> bf16, round to nearest even
        if cached is not None:
            self.table[self.n_block :].copy_(as_torch(cached.rows))
        self.row_bytes = int(self.table[:1].nbytes)

    def slots(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row of :attr:`table` (int64), -1 where it has none."""
        local = (ids >= self.start) & (ids < self.start + self.n_block)
        if self.cached is None:
            return np.where(local, ids - self.start, -1)
        slot = self.cached.slots(ids).astype(np.int64)
        slot[slot >= 0] += self.n_block
        slot[local] = ids[local] - self.start
        return slot


class StoreFeatures:
    """Pulls ``node/<ntype>/<name>`` rows (per-type ids) from the store; None if absent.

    Co-located partitions are read from shared memory by the client; the rest is
    fetched from the owners, remote requests first (see the store's ``pull``). With a
    :class:`FeatureCache`, cached remote rows are copied from it and only the others
    are pulled; ``cache_bytes`` counts what the cache served.

    ``bf16``: the float32 feature of that name comes in bf16 (the values of
    ``x.to(torch.bfloat16)``), for a model whose first layer reads bf16 rows. The rows
    this process reads without a request are gathered from a :class:`Bf16Rows` table, one
    gather of half the bytes straight into the batch (no fp32 batch, no cast); the others
    are pulled and converted. A followed live graph's rows change under the reader, so
    there (and for a disk tensor, or with no co-located partition) every row is pulled,
    then converted.
    """

    def __init__(
        self, client: KVClient, cache: FeatureCache | None = None, bf16: str | None = None
    ) -> None:
        self.client = client
        self.cache = cache
        self.bf16 = bf16
        self._names = {info.name for info in client.list_tensors()}
        self._bf16: dict[str, Bf16Rows | None] = {}
        self.seconds = 0.0  # spent pulling, in total
        self.cache_bytes = 0  # served from the cache, in total

    def warm(self, *names: str) -> None:
        """Pull the cached rows of features ``names`` now, before the first batch (so no
        batch's cost carries the cache's own fill)."""
        if self.cache is None:
            return
        for ntype in self.cache.plan.ids:
            for name in names:
                if str(TensorKey.node(ntype, name)) in self._names:
                    self.cache.rows(ntype, name)

    def node_feature(self, ntype: str, name: str, ids: Tensor) -> Tensor | None:
        key = str(TensorKey.node(ntype, name))
        if key not in self._names:
            return None
        t0 = time.perf_counter()
        idx = ids.numpy().astype(np.int64, copy=False)
        half = self._half(ntype, name, key, idx) if name == self.bf16 else None
        if half is not None:
            out = self._gather_bf16(key, half, idx)
        else:
            out = as_torch(self._rows(ntype, name, key, idx))
            if name == self.bf16 and out.dtype == torch.float32:
                out = out.to(torch.bfloat16)
        self.seconds += time.perf_counter() - t0
        return out

    def _rows(self, ntype: str, name: str, key: str, idx: np.ndarray) -> np.ndarray:
        cached = self.cache.rows(ntype, name) if self.cache is not None else None
        if cached is None:
            return self.client.pull(key, idx)
        slot = cached.slots(idx)
        hit = slot >= 0
        n_hit = int(np.count_nonzero(hit))
        if n_hit == 0:
            return self.client.pull(key, idx)
        rows = np.empty((len(idx), *cached.rows.shape[1:]), cached.rows.dtype)
        at = np.flatnonzero(hit)
        take_into(rows, at, cached.rows, slot[at])
        if n_hit < len(idx):
            at = np.flatnonzero(~hit)
            self.client.pull(key, idx[at], out=rows, at=at)  # straight into place
        self.cache_bytes += n_hit * cached.row_bytes
        return rows

    def _half(self, ntype: str, name: str, key: str, idx: np.ndarray) -> Bf16Rows | None:
        """The :class:`Bf16Rows` of ``key`` (made at its first read, the co-located
        partition that owns most of ``idx``), or None: pull and convert."""
        if self.client.live is not None:  # rows change under a follower: never copied
            return None
        if key not in self._bf16:
            got = self.client.local_block(key, near=idx)
            half = None
            if got is not None and got[1].dtype == np.float32:
                start, block = got
                part = int(self.client.policy(key).to_part(np.array([start], np.int64))[0])
                cached = self.cache.rows(ntype, name) if self.cache is not None else None
                half = Bf16Rows(part, start, block, cached)
            self._bf16[key] = half
        return self._bf16[key]

    def _gather_bf16(self, key: str, half: Bf16Rows, idx: np.ndarray) -> Tensor:
        """Rows ``idx`` in bf16: one gather from ``half``'s table, the rest pulled."""
        slot = half.slots(idx)
        miss = np.flatnonzero(slot < 0)
        out = half.table.index_select(0, torch.from_numpy(np.maximum(slot, 0)))
        if len(miss):
            out[torch.from_numpy(miss)] = as_torch(self.client.pull(key, idx[miss])).to(out.dtype)
        n_local = int(np.count_nonzero((slot >= 0) & (slot < half.n_block)))
        self.client.traffic[half.part, "pull:shm"] += n_local * half.row_bytes
        self.cache_bytes += (len(idx) - len(miss) - n_local) * half.row_bytes
        return out
