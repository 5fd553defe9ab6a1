"""``DistGraph``: the partitioned graph served by the store, seen from one trainer.

    g = DistGraph(ctx)
    g.num_nodes(), g.num_nodes("paper"), g.num_edges("author:writes:paper")
    g.ndata["feat"][ids]                  # homogeneous: name -> DistTensor
    g.nodes["paper"].data["feat"][ids]    # any graph: per node type
    g.edata / g.edges[etype].data         # the same for edges
    g.in_degrees(ids), g.out_degrees(ids), g.find_edges(eids)
    g.sample_neighbors(seeds, 10)        # one hop, on the servers owning the seeds
    g.partition_book, g.local_partition

Ids: with ``ntype``/``etype`` given, ids are per-type new ids (the store's id space of
that type, as ``DistTensor`` rows); without, they are homogeneous new ids (the
sampler's id space). Partition ``p`` owns contiguous ranges of both, see
:class:`~graphrun.partition.book.PartitionBook`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from graphrun.distributed.context import DistContext, current_context
from graphrun.distributed.dglnames import DistTensor
from graphrun.distributed.live import check_follow, type_map
from graphrun.errors import ArgumentError
from graphrun.names import CanonicalEtype, TensorKey, etype_key
from graphrun.partition.book import PartitionBook
from graphrun.sampling.csc import SampledEdges
from graphrun.sampling.distributed import DistOneHopSampler
from graphrun.sampling.fanout import normalize_fanouts
from graphrun.sampling.mfg import Seed, draw_seed, make_generator


@dataclass(frozen=True)
class TypeView:
    """``g.nodes[ntype]`` / ``g.edges[etype]``: the data of one type."""

    data: Mapping[str, DistTensor]


class PartitionBookView:
    """A :class:`PartitionBook` as DistDGL's ``GraphPartitionBook`` reads (everything
    else is the book's own)."""

    def __init__(self, book: PartitionBook, partid: int) -> None:
        self.book = book
        self.partid = partid

    def num_partitions(self) -> int:
        return int(self.book.num_parts)

    def partid2nids(self, partid: int, ntype: str | None = None) -> Tensor:
        return torch.from_numpy(self.book.partid2nids(partid, ntype))

    def partid2eids(self, partid: int, etype: CanonicalEtype | str | None = None) -> Tensor:
        return torch.from_numpy(self.book.partid2eids(partid, etype))

    def __getattr__(self, name: str) -> object:
        return getattr(self.book, name)


class DistGraph:
    """The store's graph seen from ``ctx``; DistDGL's ``DistGraph(graph_name)`` (or no
    argument) takes the current context (:func:`~graphrun.distributed.current_context`)."""

    def __init__(
        self, ctx: DistContext | str | None = None, follow: str | None = None, **dgl_options: Any
    ) -> None:
        del dgl_options  # DistDGL's part_config: the store already serves the partitions
        if not isinstance(ctx, DistContext):
            ctx = current_context()
        self.ctx = ctx
        self.book: PartitionBook = ctx.book
        self.follow = check_follow(follow)  # a live graph: distributed/live.py
        if self.follow is not None:
            ctx.client.follow()
        self.types = type_map(ctx.client, self.book, ctx.sampler)  # new ids' types, following
        node_data: dict[str, dict[str, DistTensor]] = {t: {} for t in self.book.node_types}
        edge_data: dict[str, dict[str, DistTensor]] = {
            etype_key(e): {} for e in self.book.edge_types
        }
        for info in ctx.client.list_tensors():
            key = TensorKey.parse(info.name)
            target = None if key is None else node_data if key.kind == "node" else edge_data
            if key is not None and target is not None and key.type in target:
                target[key.type][key.name] = DistTensor(ctx.client, info.name)
        self._node_data = node_data
        self._edge_data = edge_data

    # ---- a live graph -----------------------------------------------------------------

    @property
    def version(self) -> int | None:
        """The live graph's version this trainer reads (None: not following)."""
        return self.ctx.client.version

    def refresh(self, at: str) -> int | None:
        """Move to the head if the follow mode moves at ``at`` ("epoch" or "batch")."""
        if self.follow == "head" or (self.follow == "epoch" and at == "epoch"):
            return self.ctx.client.follow()
        return self.version

    # ---- shape ----------------------------------------------------------------------

    @property
    def partition_book(self) -> PartitionBook:
        return self.book

    def get_partition_book(self) -> PartitionBookView:
        """DistDGL's view of the book: ``partid`` (this trainer's partition),
        ``partid2nids``/``partid2eids`` as tensors, ``num_partitions()``."""
        return PartitionBookView(self.book, self.ctx.partition)

    @property
    def local_partition(self) -> int:
        return self.ctx.partition

    def rank(self) -> int:
        """This trainer's rank (DistDGL's ``g.rank()``)."""
        return self.ctx.rank

    def barrier(self) -> None:
        """Wait for every trainer (``torch.distributed``'s barrier; nothing to wait for
        with one trainer)."""
        import torch.distributed as dist

        if self.ctx.world_size == 1:
            return
        if not (dist.is_available() and dist.is_initialized()):
            raise ArgumentError(
                "barrier: torch.distributed is not initialised (init_process_group first)"
            )
        dist.barrier()

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.book.node_types)

    @property
    def edge_types(self) -> tuple[CanonicalEtype, ...]:
        return self.types.edge_types

    @property
    def is_hetero(self) -> bool:
        return bool(self.book.is_hetero)

    def num_nodes(self, ntype: str | None = None) -> int:
        return int(self.book.num_nodes if ntype is None else self.book.num_nodes_of(ntype))

    def num_edges(self, etype: CanonicalEtype | str | None = None) -> int:
        return int(self.book.num_edges if etype is None else self.book.num_edges_of(etype))

    # ---- data -----------------------------------------------------------------------

    @property
    def nodes(self) -> dict[str, TypeView]:
        return {t: TypeView(d) for t, d in self._node_data.items()}

    @property
    def edges(self) -> dict[str, TypeView]:
        return {k: TypeView(d) for k, d in self._edge_data.items()}

    @property
    def ndata(self) -> Mapping[str, Any]:
        """Homogeneous: name → DistTensor. Heterogeneous: name → {ntype: DistTensor}."""
        return _flatten(self._node_data)

    @property
    def edata(self) -> Mapping[str, Any]:
        return _flatten(self._edge_data)

    def node_feature(self, ntype: str, name: str) -> DistTensor | None:
        if ntype not in self._node_data:
            raise ArgumentError(f"ntype: unknown node type {ntype!r}; known: {self.node_types}")
        return self._node_data[ntype].get(name)

    # ---- structure ------------------------------------------------------------------

    def _homo_nodes(self, ids: Any, ntype: str | None) -> Tensor:
        arr = ids.numpy() if isinstance(ids, Tensor) else np.asarray(ids)
        if ntype is not None:  # a new node's per-type id: its id, if of ntype (live.py)
            arr = self.types.to_homo(ntype, arr)
        return torch.as_tensor(arr).long()

    def in_degrees(self, ids: Any, ntype: str | None = None) -> Tensor:
        return self.ctx.sampler.in_degrees(self._homo_nodes(ids, ntype))

    def out_degrees(self, ids: Any, ntype: str | None = None) -> Tensor:
        return self.ctx.sampler.out_degrees(self._homo_nodes(ids, ntype))

    def find_edges(
        self, eids: Any, etype: CanonicalEtype | str | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(src, dst)``: homogeneous ids, or per-type ids of the end types with ``etype``."""
        arr = eids.numpy() if isinstance(eids, Tensor) else np.asarray(eids)
        if etype is not None:  # a new edge's per-type id: its id, if of etype (live.py)
            arr = self.types.etype_to_homo(etype, arr)
        src, dst = self.ctx.sampler.find_edges(torch.as_tensor(arr).long())
        if etype is None:
            return src, dst
        _, s = self.types.nodes_per_type(src)
        _, d = self.types.nodes_per_type(dst)
        return s, d

    def sample_neighbors(
        self,
        seeds: Any,
        fanout: int | Mapping[Any, int],
        *,
        replace: bool = False,
        weight: str | None = None,
        generator: Seed = None,
    ) -> SampledEdges:
        """One hop of in-neighbours of homogeneous ``seeds``, sampled where they are stored.

        ``fanout``: an int (per edge type) or ``{etype: int}``; ``weight``: sample
        proportionally to that edge feature. Returns global ids as numpy arrays:
        ``src -> seeds[seed_index]`` with edge ids ``eid`` (and ``etype``).
        """
        vec = normalize_fanouts([fanout], self.edge_types, arg="fanout")[0]
        one_hop = self.ctx.sampler
        if weight is not None:
            one_hop = DistOneHopSampler(self.ctx.client, self.book, weight=weight)
        return one_hop.sample_one_hop(
            self._homo_nodes(seeds, None),
            vec,
            replace=replace,
            weighted=weight is not None,
            seed=draw_seed(make_generator(generator)),
        )

    def mask_ids(self, name: str, ntype: str | None = None) -> Tensor:
        """Per-type ids whose node feature ``name`` (a mask) is true, e.g. ``train_mask``."""
        t = ntype or self._single_ntype()
        feat = self.node_feature(t, name)
        if feat is None:
            raise ArgumentError(f"{name}: node type {t!r} has no feature {name!r}")
        return torch.from_numpy(feat.reduce("nonzero"))  # computed where the rows live

    def _single_ntype(self) -> str:
        if len(self.node_types) != 1:
            raise ArgumentError(f"ntype: required on a heterograph ({list(self.node_types)})")
        return self.node_types[0]

    def __repr__(self) -> str:
        return (
            f"DistGraph(num_nodes={self.num_nodes()}, num_edges={self.num_edges()}, "
            f"parts={self.book.num_parts}, node_types={list(self.node_types)})"
        )


def _flatten(data: dict[str, dict[str, DistTensor]]) -> dict[str, Any]:
    if len(data) == 1:
        return dict(next(iter(data.values())))
    out: dict[str, dict[str, DistTensor]] = {}
    for key, feats in data.items():
        for name, t in feats.items():
            out.setdefault(name, {})[key] = t
    return out
