"""Node features from the store, as a :class:`~graphrun.sampling.sampler.FeatureSource`."""

from __future__ import annotations

import time

import numpy as np
from torch import Tensor

from graphrun.store.client import KVClient
from graphrun.store.dist_tensor import as_torch
from graphrun.store.policy import TensorKey


class StoreFeatures:
    """Pulls ``node/<ntype>/<name>`` rows (per-type ids) from the store; None if absent.

    Co-located partitions are read from shared memory by the client; the rest is
    fetched from the owners, remote requests first (see the store's ``pull``).
    """

    def __init__(self, client: KVClient) -> None:
        self.client = client
        self._names = {info.name for info in client.list_tensors()}
        self.seconds = 0.0  # spent pulling, in total

    def node_feature(self, ntype: str, name: str, ids: Tensor) -> Tensor | None:
        key = str(TensorKey.node(ntype, name))
        if key not in self._names:
            return None
        t0 = time.perf_counter()
        rows = self.client.pull(key, ids.numpy().astype(np.int64, copy=False))
        self.seconds += time.perf_counter() - t0
        return as_torch(rows)
