"""A trainer's data served by the distributed store: :class:`DistData`.

The trainer connects a :class:`~graphrun.store.client.KVClient` to the main server
of every partition (co-located partitions are read through shared memory). Then:

* seeds — trainer ``rank`` trains on partition ``partition`` (co-located: the
  partition of its machine); the nodes that partition owns whose ``<split>_mask``
  is set, shared among the trainers of that partition (every ``k``-th);
* sampling — :class:`~graphrun.sampling.sampler.NeighborSampler` over
  :class:`~graphrun.sampling.distributed.DistOneHopSampler` (each hop sampled on the
  partitions that own the frontier, the local one in this process);
* features and labels — pulled from the store tensors ``node/<ntype>/<name>`` (per-type
  ids), timed and counted per owning partition for the profile records;
* embeddings — :class:`~graphrun.store.embedding.DistEmbedding` with the store's
  ``SparseAdam`` (state on the servers, shared by all trainers).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError
from graphrun.partition.book import PartitionBook
from graphrun.store.client import KVClient
from graphrun.store.dist_tensor import as_torch
from graphrun.train.data import Batch, Embedding


@dataclass(frozen=True)
class BookTypeMap:
    """Global id -> (type id, per-type id) through the partition book."""

    book: PartitionBook
    node_types: tuple[str, ...] = field(init=False)
    edge_types: tuple[tuple[str, str, str], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_types", tuple(self.book.node_types))
        object.__setattr__(self, "edge_types", tuple(tuple(e) for e in self.book.edge_types))

    def nodes_per_type(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        t, i = self.book.to_per_type(ids.numpy())
        return torch.from_numpy(np.asarray(t, dtype=np.int64)), torch.from_numpy(i)

    def edges_per_type(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        t, i = self.book.eid_to_per_type(ids.numpy())
        return torch.from_numpy(np.asarray(t, dtype=np.int64)), torch.from_numpy(i)


class _Features:
    """FeatureSource over store tensors, timing pulls and counting bytes per partition."""

    def __init__(self, client: KVClient, book: PartitionBook) -> None:
        self.client, self.book = client, book
        self.fetch_s = 0.0
        self.bytes: dict[int, int] = {}
        self._names = {ti.name for ti in client.list_tensors()}

    def node_feature(self, ntype: str, name: str, ids: Tensor) -> Tensor | None:
        key = f"node/{ntype}/{name}"
        if key not in self._names:
            return None
        t0 = time.perf_counter()
        arr = self.client.pull(key, ids.numpy())
        self.fetch_s += time.perf_counter() - t0
        if len(ids):
            parts = np.bincount(self.book.nid2part(ids.numpy(), ntype), minlength=1)
            row = arr.nbytes // max(len(arr), 1)
            for p, n in enumerate(parts.tolist()):
                if n:
                    self.bytes[p] = self.bytes.get(p, 0) + n * row
        return as_torch(arr)

    def take(self) -> tuple[float, dict[int, int]]:
        out = (self.fetch_s, self.bytes)
        self.fetch_s, self.bytes = 0.0, {}
        return out


class StoreEmbedding:
    """A DistEmbedding and the store's SparseAdam, behind the task's Embedding protocol."""

    def __init__(self, client: KVClient, name: str, num: int, dim: int, lr: float) -> None:
        from graphrun.store.embedding import DistEmbedding, SparseAdam

        self.emb = DistEmbedding(client, num, dim, name, init="uniform",
                                 init_args={"low": -0.1, "high": 0.1})  # fmt: skip
        self.opt = SparseAdam([self.emb], lr=lr)

    def __call__(self, ids: Tensor) -> Tensor:
        return self.emb(ids)

    def step(self) -> None:
        self.opt.step()

    def zero_grad(self) -> None:
        self.opt.zero_grad()

    def state(self) -> dict[str, Any]:
        n = self.emb.num_embeddings
        return {"weight": self.emb.weight[np.arange(n, dtype=np.int64)]}

    def load_state(self, state: dict[str, Any]) -> None:
        w = state["weight"]
        self.emb.weight[np.arange(w.shape[0], dtype=np.int64)] = w


class DistData:
    """GraphData over a running store (see the module docstring)."""

    def __init__(
        self, client: KVClient, rank: int, world_size: int, partition: int,
        trainers_of_partition: list[int], seed: int = 0,
    ) -> None:  # fmt: skip
        from graphrun.sampling.distributed import DistOneHopSampler

        self.client = client
        self.book: PartitionBook = client.book
        self.rank, self.world_size, self.partition = rank, world_size, partition
        self.node_types = tuple(self.book.node_types)
        self.edge_types: tuple[tuple[str, str, str], ...] = tuple(
            (e[0], e[1], e[2]) for e in self.book.edge_types
        )
        self.seed = seed
        self._share = sorted(trainers_of_partition)
        if rank not in self._share:
            raise ArgumentError(f"rank {rank} is not a trainer of partition {partition}")
        self._types: Any = BookTypeMap(self.book)  # a sampling.pyg.TypeMap
        self._one_hop = DistOneHopSampler(client, self.book)
        self._features = _Features(client, self.book)
        self._meta = {ti.name: ti for ti in client.list_tensors()}

    def _ntype(self, ntype: str | None) -> str:
        return ntype if ntype is not None else self.node_types[0]

    def num_nodes(self, ntype: str | None = None) -> int:
        return self.book.num_nodes if ntype is None else self.book.num_nodes_of(ntype)

    def feature_dim(self, ntype: str, name: str) -> int | None:
        ti = self._meta.get(f"node/{ntype}/{name}")
        return None if ti is None else int(np.prod(ti.row_shape)) if ti.row_shape else 1

    def num_classes(self, ntype: str, label: str) -> int:
        key = f"node/{ntype}/{label}"
        if key not in self._meta:
            raise ArgumentError(f"label: the store has no tensor {key!r}")
        n = self.book.num_nodes_of(ntype)
        top = 0
        for a in range(0, n, 1 << 20):  # labels are small; read them once in chunks
            ids = np.arange(a, min(n, a + (1 << 20)), dtype=np.int64)
            top = max(top, int(self.client.pull(key, ids).max()))
        return top + 1

    def seeds(self, split: str, ntype: str | None = None) -> Tensor:
        t = self._ntype(ntype)
        key = f"node/{t}/{split}_mask"
        if key not in self._meta:
            raise ArgumentError(f"split: the store has no tensor {key!r}")
        lo, hi = (int(v) for v in self.book.node_ranges(t)[self.partition : self.partition + 2])
        ids = np.arange(lo, hi, dtype=np.int64)
        mask = self.client.pull(key, ids).astype(bool)
        mine = torch.from_numpy(ids[mask])
        k = self._share.index(self.rank)
        return mine[k :: len(self._share)]

    def loader(
        self, seeds: Tensor, ntype: str | None, fanouts: Any, batch_size: int, shuffle: bool,
        epoch: int, x: str = "feat", y: str = "label",
    ) -> Iterator[Batch]:  # fmt: skip
        from graphrun.sampling.sampler import NeighborSampler, collate

        gen_seed = self.seed * 1_000_003 + epoch * 101 + self.rank
        sampler = NeighborSampler(
            self._one_hop, self._types, self.book.num_nodes, fanouts, generator=gen_seed
        )
        order = seeds
        if shuffle:
            g = torch.Generator().manual_seed(gen_seed)
            order = seeds[torch.randperm(seeds.numel(), generator=g)]
        t = self._ntype(ntype)
        hetero = len(self.node_types) > 1 or len(self.edge_types) > 1
        output: Literal["hetero", "data"] = "hetero" if hetero else "data"
        for i in range(0, order.numel(), batch_size):
            chunk = order[i : i + batch_size]
            homo = torch.from_numpy(self.book.to_homo(t, chunk.numpy())) if hetero else chunk
            t0 = time.perf_counter()
            sub = sampler.sample(homo)
            t1 = time.perf_counter()
            data = collate(sub, self._types, self._features, output=output, x=x, y=y)
            t2 = time.perf_counter()
            _, fbytes = self._features.take()
            yield Batch(data, int(chunk.numel()), t1 - t0, t2 - t1, {}, fbytes)

    def edges(self, count: int, epoch: int) -> tuple[Tensor, Tensor]:
        """``count`` random in-edges of this trainer's partition (it owns its nodes' in-edges)."""
        g = torch.Generator().manual_seed(self.seed * 7919 + epoch * 31 + self.rank)
        lo, hi = self.book.owned_nodes(self.partition)
        dst = torch.unique(torch.randint(lo, hi, (2 * count,), generator=g))
        dst = dst[torch.randperm(dst.numel(), generator=g)]
        one = torch.ones(len(self.edge_types), dtype=torch.long)
        out = self._one_hop.sample_one_hop(dst, one, generator=g)
        src, dst = out.src, dst[out.seed_index]
        if src.numel() == 0:
            raise ArgumentError(f"partition {self.partition} has no edges to predict")
        reps = -(-count // src.numel())  # a tiny partition: reuse its edges
        return src.repeat(reps)[:count], dst.repeat(reps)[:count]

    def embedding(self, name: str, num: int, dim: int, lr: float) -> Embedding:
        return StoreEmbedding(self.client, name, num, dim, lr)
