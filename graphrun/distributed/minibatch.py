"""The sampling half of a mini-batch, shared by graphrun's loaders and PyG's.

A :class:`MiniBatchSampler` turns a batch of seeds — nodes, or positive edges given
by their ends — into a :class:`~graphrun.sampling.mfg.SampledSubgraph` through the
distributed sampler (on the stores' servers, or from shared memory when co-located).
:class:`~graphrun.distributed.batches.BatchBuilder` adds the features and collates;
:class:`~graphrun.distributed.pyg_remote.RemoteNeighborSampler` hands the same
subgraph to PyG's loaders, which fetch the features from the
:class:`~graphrun.distributed.pyg_stores.RemoteFeatureStore`.

Randomness: a batch is sampled with :func:`content_seed` of the epoch's seed and the
batch's own seeds, so the same batch comes out whichever loader, process or position
in the epoch builds it (what makes PyG's loaders and graphrun's agree batch for batch).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from graphrun.distributed.context import DistContext
from graphrun.distributed.live import NewNodes, id_bound, to_homo, type_map
from graphrun.sampling.edgesplit import EdgeSplit
from graphrun.sampling.fanout import FanoutSpec
from graphrun.sampling.mfg import SampledSubgraph, make_generator
from graphrun.sampling.negative import NegativeSampler
from graphrun.sampling.sampler import NeighborSampler

NegMode = Literal["uniform", "degree"]


def batch_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed generator seed for batch ``index`` (>= -1) of ``epoch``."""
    entropy = [seed & (2**63 - 1), epoch & (2**63 - 1), index + 1]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 2)


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed every batch of ``epoch`` mixes with its content (:func:`content_seed`)."""
    return batch_seed(seed, epoch, 0)


def shuffled(ids: Tensor, seed: int, epoch: int, last: Tensor | None = None) -> Tensor:
    """``ids`` in the order graphrun's loaders deal them in ``epoch`` with ``shuffle=True``
    (give it to a PyG loader with ``shuffle=False`` to get graphrun's batches).

    ``last``: a mask over 1-d ``ids`` of those dealt after all the others, each part in
    the shuffle's order: a trainer's seeds that its home partition does not own
    (:func:`~graphrun.distributed.split.foreign`), so that only the epoch's last batch
    asks another machine for a first hop. An empty mask changes nothing."""
    gen = torch.Generator().manual_seed(batch_seed(seed, epoch, -1))
    perm = torch.randperm(ids.shape[-1], generator=gen)
    if ids.dim() != 1:
        return ids[:, perm]
    if last is not None:
        away = last[perm]
        perm = torch.cat([perm[~away], perm[away]])
    return ids[perm]


def content_seed(base: int, *ids: Tensor) -> int:
    """A generator seed from ``base`` and the batch's seed ids (homogeneous ids)."""
    h = hashlib.blake2b(digest_size=8)
    for t in ids:
        h.update(np.ascontiguousarray(t.numpy(), dtype=np.int64).tobytes())
        h.update(b"|")
    digest = int.from_bytes(h.digest(), "little")
    entropy = [base & (2**63 - 1), digest]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 2)


@dataclass(frozen=True)
class LinkSample:
    """A link batch's subgraph and its labelled pairs: ``label_index`` holds local ids
    (into ``sub.node``) of the positives, then ``neg_k`` negatives per positive."""

    sub: SampledSubgraph
    label_index: Tensor
    num_pos: int
    num_neg: int


class MiniBatchSampler:
    """Multi-hop sampling of one batch on the store (see the module docstring)."""

    def __init__(
        self,
        ctx: DistContext,
        fanouts: FanoutSpec,
        *,
        replace: bool = False,
        num_layers: int | None = None,
        edge_ids: bool = True,
    ) -> None:
        self.ctx = ctx
        self.book = ctx.book
        self.types = type_map(ctx.client, self.book, ctx.sampler)  # a followed live graph: live.py
        self.sampler = NeighborSampler(
            ctx.sampler if edge_ids else ctx.sampler.without_edge_ids(),
            self.types,
            id_bound(ctx.client),
            fanouts,
            num_layers=num_layers,
            replace=replace,
            generator=0,
        )
        self.bound = id_bound(ctx.client)  # above every node id (new nodes' included)
        self._new = NewNodes(ctx.client)  # a followed live graph's negatives' candidates
        self._negatives: dict[tuple[str, int, str], tuple[NegativeSampler, tuple[int, int]]] = {}
        self._degrees: dict[str, Tensor] = {}

    def to_homo(self, ntype: str | None, ids: Tensor) -> Tensor:
        if ntype is None:
            return ids
        # a followed live graph: a new node's per-type id is its id, refused if not of ntype
        return torch.from_numpy(self.types.to_homo(ntype, ids.numpy()))

    def nodes(self, homo: Tensor, base: int) -> SampledSubgraph:
        """The subgraph around homogeneous seed ids ``homo``."""
        return self.sampler.sample(homo, generator=content_seed(base, homo))

    def negatives(self, dst_type: str, k: int, mode: NegMode) -> tuple[NegativeSampler, np.ndarray]:
        """The sampler of ``k`` negatives of ``dst_type`` and the new nodes it draws from
        beside the base nodes (a followed live graph's at the client's version: a draw
        ``i >= num_nodes_of(dst_type)`` is the new node ``new[i - num_nodes_of]``). Made
        again when they change; ``degree``'s weights: the base nodes' in-degrees at its
        first batch, the new nodes' at the version (they grow fastest)."""
        n = self.book.num_nodes_of(dst_type)
        new = self._new.of_type(self.book.ntype_id(dst_type))
        key, v = (dst_type, k, mode), self.ctx.client.version
        tag = (len(new), v if mode == "degree" and len(new) and v is not None else -1)
        held = self._negatives.get(key)
        if held is None or held[1] != tag:
            deg = None
            if mode == "degree":
                if dst_type not in self._degrees:
                    base = self.to_homo(dst_type, torch.arange(n))
                    self._degrees[dst_type] = self.ctx.sampler.in_degrees(base)
                deg = self._degrees[dst_type]
                if len(new):
                    deg = torch.cat([deg, self.ctx.sampler.in_degrees(torch.from_numpy(new))])
            held = (NegativeSampler(n + len(new), k, mode, deg), tag)
            self._negatives[key] = held
        return held[0], new

    def links(
        self,
        src: Tensor,
        dst: Tensor,
        base: int,
        etype: tuple[str, str, str],
        *,
        neg_k: int,
        neg_mode: NegMode = "uniform",
        edge_split: EdgeSplit | None = None,
    ) -> LinkSample:
        """Positive pairs ``src -> dst`` (homogeneous ids) of ``etype`` plus ``neg_k``
        negatives each (``neg_k=0``: none; of the base nodes of ``etype``'s destination
        type and, following a live graph, its new nodes at the client's version); with
        ``edge_split`` the sampled edges exclude held-out ones and those joining a
        positive pair."""
        gen = make_generator(content_seed(base, src, dst))
        if neg_k > 0:
            sampler, new = self.negatives(etype[2], neg_k, neg_mode)
            neg_src, drawn = sampler.sample(src, gen)
            neg_dst = self._candidates(etype[2], drawn.numpy(), new)
        else:
            neg_src = neg_dst = src[:0]
        ends = torch.cat([src, neg_src, dst, neg_dst])
        nodes, inverse = torch.unique(ends, return_inverse=True)
        sub = self.sampler.sample(nodes, generator=gen)
        if edge_split is not None:  # pairs keyed below the bound: new nodes' ids are past n
            sub = edge_split.exclude(sub, src, dst, self.bound)
        m = src.numel() + neg_src.numel()
        label_index = torch.stack([inverse[:m], inverse[m:]])
        return LinkSample(sub, label_index, int(src.numel()), int(neg_src.numel()))

    def _candidates(self, ntype: str, drawn: np.ndarray, new: np.ndarray) -> Tensor:
        """Homogeneous ids of drawn candidates: a base node's by the book, a new node's
        its id (of ``ntype`` already: no look-up of its type)."""
        n = self.book.num_nodes_of(ntype)
        grown = drawn >= n
        if not grown.any():
            return torch.from_numpy(to_homo(self.book, ntype, drawn))
        out = np.empty(len(drawn), np.int64)
        out[~grown] = to_homo(self.book, ntype, drawn[~grown])
        out[grown] = new[drawn[grown] - n]
        return torch.from_numpy(out)
