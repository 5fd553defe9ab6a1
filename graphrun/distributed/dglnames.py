"""DistDGL's names where they mean the same thing, so a DistDGL script ports by its imports.

    ctx = initialize(servers, rank=r, world_size=w)        # dgl.distributed.initialize
    g = DistGraph("reddit")                                 # the graph of the current context
    pb = g.get_partition_book()
    train = node_split(g.ndata["train_mask"], pb, force_even=True)
    h = DistTensor((g.num_nodes(), 16), torch.float32, "h", persistent=False)
    loader = DistNodeDataLoader(g, train, NeighborSampler([25, 10]), batch_size=1024)

What differs from DistDGL is in ``docs/porting.md``: batches are PyG ``Data`` (no DGL
blocks), ``init_func`` runs once in rank 0 (pushed in row chunks), not on the servers.

The one piece of ambient state: :func:`~graphrun.distributed.context.initialize` makes
its context the current one (until it is closed), and the DistDGL-style calls that take
no context find it there (:func:`~graphrun.distributed.context.current_context`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from graphrun.distributed.context import current_context
from graphrun.distributed.split import Mode
from graphrun.distributed.split import edge_split as _edge_split
from graphrun.distributed.split import node_split as _node_split
from graphrun.errors import ArgumentError
from graphrun.names import PolicyName
from graphrun.partition.book import PartitionBook
from graphrun.store import dist_tensor, embedding
from graphrun.store.client import KVClient

INIT_CHUNK = 1 << 16  # rows per push when rank 0 runs an init_func


@dataclass(frozen=True)
class NeighborSampler:
    """``dgl.dataloading.NeighborSampler(fanouts)``: fanouts in DistDGL's order (one per
    model layer, the input layer first, the layer next to the seeds last; -1 for all
    neighbours). A loader given one yields DistDGL's ``(input_nodes, seeds, blocks)``:
    ``blocks`` is a list holding the one PyG batch (``edge_index`` over ``n_id``, seeds
    first), for PyG layers."""

    fanouts: Sequence[Any]
    replace: bool = False

    @property
    def hops(self) -> list[Any]:
        """The fanouts in graphrun's order (the hop next to the seeds first)."""
        return list(reversed(list(self.fanouts)))


def _ids(nodes: object) -> object:
    """A DistTensor mask becomes its non-zero ids, computed where its rows live."""
    if isinstance(nodes, dist_tensor.DistTensor):
        return nodes.reduce("nonzero")
    return nodes


def _who(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    ctx = current_context()
    return (ctx.rank if rank is None else rank), (
        ctx.world_size if world_size is None else world_size
    )


def _book(nodes: Any, book: Any) -> PartitionBook:
    if book is not None:
        return book if isinstance(book, PartitionBook) else book.book  # DistGraph's view
    if isinstance(nodes, dist_tensor.DistTensor):
        return nodes.client.book
    return current_context().book


def _mode(mode: Mode | None, force_even: bool) -> Mode:
    return mode if mode is not None else "pad" if force_even else "cover"


def node_split(
    nodes: Any,
    partition_book: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    ntype: str | None = None,
    force_even: bool = True,
    node_trainer_ids: Any = None,
    trainer_parts: Sequence[int] | None = None,
    mode: Mode | None = None,
) -> Tensor:
    """This trainer's share of ``nodes`` (a boolean mask — a ``DistTensor`` too — or ids;
    per-type ids with ``ntype``): at home first, the same count on every trainer.

    DistDGL's form works: ``rank``/``world_size`` default to the current context's,
    ``force_even=False`` deals every id to exactly one trainer (``mode="cover"``);
    ``node_trainer_ids`` is accepted and not needed (the split is already
    locality-first). See :mod:`graphrun.distributed.split`.
    """
    del node_trainer_ids
    r, w = _who(rank, world_size)
    book = _book(nodes, partition_book)
    return _node_split(
        _ids(nodes), book, r, w, ntype=ntype, trainer_parts=trainer_parts,
        mode=_mode(mode, force_even),
    )  # fmt: skip


def edge_split(
    edges: Any,
    partition_book: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    etype: tuple[str, str, str] | str | None = None,
    force_even: bool = True,
    edge_trainer_ids: Any = None,
    trainer_parts: Sequence[int] | None = None,
    mode: Mode | None = None,
) -> Tensor:
    """This trainer's share of ``edges`` (mask or edge ids), as :func:`node_split`."""
    del edge_trainer_ids
    r, w = _who(rank, world_size)
    book = _book(edges, partition_book)
    return _edge_split(
        _ids(edges), book, r, w, etype=etype, trainer_parts=trainer_parts,
        mode=_mode(mode, force_even),
    )  # fmt: skip


def _default_policy(client: KVClient, rows: int) -> PolicyName | None:
    """DistDGL's choice: the one node type, or the one edge type, with ``rows`` ids."""
    book = client.book
    nodes = [t for t in book.node_types if book.num_nodes_of(t) == rows]
    if len(nodes) == 1:
        return PolicyName.node(nodes[0])
    edges = [e for e in book.edge_types if book.num_edges_of(e) == rows]
    if not nodes and len(edges) == 1:
        return PolicyName.edge(edges[0])
    return None


def _init_rows(t: dist_tensor.DistTensor, init_func: Callable[..., Any], dtype: Any) -> None:
    """Rank 0 fills ``t`` from ``init_func(shape, dtype)`` in row chunks (DistDGL calls it
    on the servers; graphrun sends no code to a server)."""
    if current_context().rank != 0:
        return
    n, rest = t.shape[0], tuple(t.shape[1:])
    for start in range(0, n, INIT_CHUNK):
        stop = min(n, start + INIT_CHUNK)
        t[np.arange(start, stop)] = init_func((stop - start, *rest), dtype)


class DistTensor(dist_tensor.DistTensor):
    """graphrun's ``DistTensor(client, name, ...)``, or DistDGL's
    ``DistTensor(shape, dtype, name, init_func, part_policy, persistent)`` with the client
    of the current context (``part_policy``: a policy name such as ``"node:_N"``; None
    picks the node or edge type with ``shape[0]`` ids). Call ``g.barrier()`` before
    reading rows another trainer's ``init_func`` wrote, as in DistDGL."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args and isinstance(args[0], KVClient):
            super().__init__(*args, **kwargs)
            return
        self._init_dgl(*args, **kwargs)

    def _init_dgl(
        self,
        shape: Sequence[int],
        dtype: Any,
        name: str | None = None,
        init_func: Callable[..., Any] | None = None,
        part_policy: PolicyName | str | None = None,
        persistent: bool = False,
        is_gdata: bool = True,
        attach: bool = True,
    ) -> None:
        del is_gdata, attach
        client = current_context().client
        if name is None:
            raise ArgumentError("name: graphrun's DistTensor needs a name (trainers share it)")
        policy = part_policy or _default_policy(client, int(shape[0]))
        super().__init__(client, name, shape, dtype, policy, persistent=persistent)
        if init_func is not None:
            _init_rows(self, init_func, dtype)


class DistEmbedding(embedding.DistEmbedding):
    """graphrun's ``DistEmbedding(client, num, dim, name, ...)``, or DistDGL's
    ``DistEmbedding(num_embeddings, embedding_dim, name, init_func, part_policy)`` with
    the current context's client."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args and isinstance(args[0], KVClient):
            super().__init__(*args, **kwargs)
            return
        self._init_dgl(*args, **kwargs)

    def _init_dgl(
        self,
        num_embeddings: int,
        embedding_dim: int,
        name: str | None = None,
        init_func: Callable[..., Any] | None = None,
        part_policy: PolicyName | str | None = None,
    ) -> None:
        client = current_context().client
        if name is None:
            raise ArgumentError("name: graphrun's DistEmbedding needs a name (trainers share it)")
        policy = part_policy or _default_policy(client, int(num_embeddings))
        super().__init__(client, num_embeddings, embedding_dim, name, policy=policy)
        if init_func is not None:
            _init_rows(self.weight, init_func, torch.float32)


SparseAdagrad = embedding.SparseAdagrad
SparseAdam = embedding.SparseAdam
