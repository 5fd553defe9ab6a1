"""Following a live graph from a job: which version a trainer reads, and when it moves.

``DistGraph(ctx, follow=MODE)`` (docs/live.md):

* ``pinned`` — the head when the graph was opened, for the whole job;
* ``epoch`` — the head at each epoch's start (a loader asks it in ``__iter__``); new nodes
  whose seed mask is true (``live_seeds="train_mask"`` on the loader) join its seeds then;
* ``head`` — the head before every batch (and the seeds as ``epoch``).

A new node's id is its homogeneous id (``>= num_nodes`` of the base), also its id in its
type's space; following is for a homogeneous graph for now (:class:`LiveTypeMap`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError
from graphrun.partition.book import PartitionBook
from graphrun.sampling.partitioned import BookTypeMap
from graphrun.store.client import KVClient
from graphrun.store.live import GROWTH_BLOCK, MAX_GROWTH_BLOCKS

FOLLOW_MODES = ("head", "epoch", "pinned")


def check_follow(mode: str | None, book: PartitionBook) -> str | None:
    if mode is None:
        return None
    if mode not in FOLLOW_MODES:
        raise ArgumentError(f"follow: {mode!r} is not one of {list(FOLLOW_MODES)}")
    if book.is_hetero:
        raise ArgumentError("follow: following a live heterograph is not supported yet")
    return mode


def id_bound(client: KVClient) -> int:
    """Above every node id a followed graph may hold (the base and every growth block)."""
    view = client.live
    n = client.book.num_nodes
    return n if view is None else n + MAX_GROWTH_BLOCKS * GROWTH_BLOCK


@dataclass(frozen=True)
class LiveTypeMap(BookTypeMap):
    """The book's type map, with a homogeneous graph's new nodes and edges (ids at or
    above the base's counts) as ids of its one node and edge type."""

    def nodes_per_type(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        return self._split(ids, self.book.num_nodes, super().nodes_per_type)

    def edges_per_type(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        return self._split(ids, self.book.num_edges, super().edges_per_type)

    @staticmethod
    def _split(
        ids: Tensor, base: int, of_base: Callable[[Tensor], tuple[Tensor, Tensor]]
    ) -> tuple[Tensor, Tensor]:
        grow = ids >= base
        if not bool(grow.any()):
            return of_base(ids)
        t = torch.zeros(ids.numel(), dtype=torch.long)
        per = ids.clone()
        old = ~grow
        if bool(old.any()):
            t[old], per[old] = of_base(ids[old])
        return t, per


def new_seeds(
    client: KVClient, mask: str, seen: np.ndarray, rank: int = 0, world_size: int = 1
) -> tuple[Tensor, np.ndarray]:
    """This trainer's share of the new nodes at the client's version whose feature
    ``mask`` is true and that are not in ``seen`` (graph ids), and ``seen`` with them:
    every trainer gets as many (:func:`share`), so that their epochs stay as long."""
    ids, _ = client.live_nodes()
    ntype = client.book.node_types[0]
    if len(ids) == 0:
        return torch.empty(0, dtype=torch.long), seen
    on = np.asarray(client.pull(f"node/{ntype}/{mask}", ids)).reshape(len(ids), -1).any(axis=1)
    fresh = ids[on & ~np.isin(ids, seen)]
    return torch.from_numpy(share(fresh, rank, world_size)), np.union1d(seen, fresh)


def share(fresh: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Trainer ``rank``'s part of ``fresh``: every ``world_size``-th id from its rank, and
    as many for every trainer (``ceil(n / world_size)``: the shorter parts wrap around)."""
    n = len(fresh)
    if n == 0:
        return fresh
    per = -(-n // world_size)
    return fresh[(rank + world_size * np.arange(per)) % n]
