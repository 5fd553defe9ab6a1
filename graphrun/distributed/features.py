"""Node features from the store, as a :class:`~graphrun.sampling.sampler.FeatureSource`."""

from __future__ import annotations

import time

import numpy as np
from torch import Tensor

from graphrun.distributed.cache import FeatureCache
from graphrun.names import TensorKey
from graphrun.store.client import KVClient
from graphrun.store.dist_tensor import as_torch
from graphrun.store.routing import take_into


class StoreFeatures:
    """Pulls ``node/<ntype>/<name>`` rows (per-type ids) from the store; None if absent.

    Co-located partitions are read from shared memory by the client; the rest is
    fetched from the owners, remote requests first (see the store's ``pull``). With a
    :class:`FeatureCache`, cached remote rows are copied from it and only the others
    are pulled; ``cache_bytes`` counts what the cache served.
    """

    def __init__(self, client: KVClient, cache: FeatureCache | None = None) -> None:
        self.client = client
        self.cache = cache
        self._names = {info.name for info in client.list_tensors()}
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
        cached = self.cache.rows(ntype, name) if self.cache is not None else None
        if cached is None:
            rows = self.client.pull(key, idx)
        else:
            slot = cached.slots(idx)
            hit = slot >= 0
            n_hit = int(np.count_nonzero(hit))
            if n_hit == 0:
                rows = self.client.pull(key, idx)
            else:
                rows = np.empty((len(idx), *cached.rows.shape[1:]), cached.rows.dtype)
                at = np.flatnonzero(hit)
                take_into(rows, at, cached.rows, slot[at])
                if n_hit < len(idx):
                    at = np.flatnonzero(~hit)
                    self.client.pull(key, idx[at], out=rows, at=at)  # straight into place
                self.cache_bytes += n_hit * cached.row_bytes
        self.seconds += time.perf_counter() - t0
        return as_torch(rows)
