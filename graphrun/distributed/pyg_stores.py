"""PyG's ``FeatureStore`` and ``GraphStore`` over graphrun's store (see
:mod:`graphrun.distributed.pyg_remote` for the sampler and the loaders).

* :class:`RemoteFeatureStore` — ``TensorAttr(group_name, attr_name, index)``: group
  name a node type (None on a homogeneous graph) or an edge type (``get_tensor``
  only), attr name a feature (``fields`` renames the store's ``feat``/``label`` to
  ``x``/``y``), index per-type ids. Rows are pulled from their owners (shared memory
  when co-located). ``get_all_tensor_attrs`` lists the node features in ``fields``:
  what PyG's loaders gather for every batch.
* :class:`RemoteGraphStore` — one ``EdgeAttr(edge_type, COO, size)`` per edge type.
  The structure stays on the servers: asking for a whole edge index (``coo``/``csc``,
  which PyG's own ``NeighborSampler`` does) is refused with one line saying what to
  pass instead.

Processes: both share one :class:`RemoteBackend`, which uses the trainer's context in
the trainer and joins the store afresh (role ``sampler:<rank>:<worker>``) in a loader
worker, forked or spawned; a worker's client leaves when it exits.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from multiprocessing import util as mp_util
from typing import Any, NoReturn

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import EdgeAttr, EdgeLayout, FeatureStore, GraphStore, TensorAttr

from graphrun.distributed.context import DistConfig, DistContext
from graphrun.errors import ArgumentError
from graphrun.names import TensorKey
from graphrun.partition.book import PartitionBook
from graphrun.store.dist_tensor import as_torch, to_numpy_ids

DEFAULT_FIELDS: Mapping[str, str] = {"x": "feat", "y": "label"}


class RemoteBackend:
    """The store context of the current process (see the module docstring)."""

    def __init__(self, ctx: DistContext) -> None:
        self.config: DistConfig = ctx.config
        self.book: PartitionBook = ctx.book
        self._ctx: DistContext | None = ctx
        self._pid = os.getpid()
        self._inherited: list[DistContext] = []  # a parent's, never used or closed here
        self._names: set[str] | None = None
        self._listed = 0.0

    def context(self) -> DistContext:
        if self._ctx is not None and self._pid == os.getpid():
            return self._ctx
        if self._ctx is not None:
            self._inherited.append(self._ctx)
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        ctx = DistContext(self.config.for_worker(worker))
        mp_util.Finalize(self, ctx.close, exitpriority=10)
        self._ctx, self._pid, self._names = ctx, os.getpid(), None
        return ctx

    def has(self, key: str) -> bool:
        """Whether the store holds tensor ``key`` (the list is fetched again on a miss,
        at most once a second)."""
        ctx = self.context()
        now = time.monotonic()
        if self._names is None or (key not in self._names and now - self._listed > 1.0):
            self._names = {info.name for info in ctx.client.list_tensors()}
            self._listed = now
        return key in self._names

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "book": self.book}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.config, self.book = state["config"], state["book"]
        self._ctx, self._pid, self._inherited, self._names = None, -1, [], None
        self._listed = 0.0


def _node_type(book: PartitionBook, group: Any) -> str:
    if not isinstance(group, str):  # None or unset: the one node type
        if len(book.node_types) != 1:
            raise ArgumentError(f"group_name: a node type is needed ({list(book.node_types)})")
        return str(book.node_types[0])
    if group not in book.node_types:
        raise ArgumentError(f"group_name: unknown node type {group!r}; known: {book.node_types}")
    return str(group)


class RemoteFeatureStore(FeatureStore):
    """PyG's ``FeatureStore`` over the store's node and edge features (read and assign)."""

    def __init__(self, backend: RemoteBackend, fields: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.backend = backend
        self.fields = dict(DEFAULT_FIELDS if fields is None else fields)

    def __copy__(self) -> RemoteFeatureStore:
        return RemoteFeatureStore(self.backend, dict(self.fields))

    def _key(self, attr: TensorAttr) -> str:
        book = self.backend.book
        name = self.fields.get(attr.attr_name, attr.attr_name)
        group = attr.group_name
        if isinstance(group, tuple):
            etype = book.edge_types[book.etype_id(group)]
            return str(TensorKey.edge(etype, name))
        return str(TensorKey.node(_node_type(book, group), name))

    def _rows(self, attr: TensorAttr, key: str) -> np.ndarray:
        index = attr.index
        client = self.backend.context().client
        if index is None:
            return np.arange(client.meta(key).num_rows)
        if isinstance(index, slice):
            return np.arange(client.meta(key).num_rows)[index]
        ids = to_numpy_ids(index)
        if ids.dtype == np.bool_:
            return np.flatnonzero(ids)
        return ids

    def _get_tensor(self, attr: TensorAttr) -> Tensor | None:
        key = self._key(attr)
        if not self.backend.has(key):
            return None
        return as_torch(self.backend.context().client.pull(key, self._rows(attr, key)))

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[Tensor | None]:
        return [self._get_tensor(attr) for attr in attrs]

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        if attr.index is None:
            raise ArgumentError("index: the store's tensors exist; put rows by their ids")
        key = self._key(attr)
        client = self.backend.context().client
        rows = self._rows(attr, key)
        value = tensor.detach().cpu().numpy() if isinstance(tensor, Tensor) else tensor
        arr = np.ascontiguousarray(np.asarray(value, dtype=client.meta(key).dtype))
        client.push(key, rows, arr, "assign")
        return True

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise ArgumentError(f"{self._key(attr)}: the graph's features cannot be removed")

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        key = self._key(attr)
        if not self.backend.has(key):
            return None
        return tuple(self.backend.context().client.meta(key).shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        book = self.backend.book
        homo = len(book.node_types) == 1
        out = []
        for ntype in book.node_types:
            for attr_name, store_name in self.fields.items():
                if self.backend.has(str(TensorKey.node(ntype, store_name))):
                    out.append(TensorAttr(None if homo else ntype, attr_name, None))
        return out


class RemoteGraphStore(GraphStore):
    """PyG's ``GraphStore`` over the partitioned structure (which stays on the servers)."""

    def __init__(self, backend: RemoteBackend) -> None:
        super().__init__()
        self.backend = backend

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        book = self.backend.book
        return [
            EdgeAttr(
                tuple(e),
                EdgeLayout.COO,
                False,
                (int(book.num_nodes_of(e[0])), int(book.num_nodes_of(e[2]))),
            )
            for e in book.edge_types
        ]

    def _get_edge_index(self, edge_attr: EdgeAttr) -> NoReturn:
        raise ArgumentError(
            f"{edge_attr.edge_type}: graphrun's graph store does not copy a whole edge type "
            "into the trainer; pass neighbor_sampler=RemoteNeighborSampler(...) to PyG's "
            "loaders, and edge_label_index to link loaders"
        )

    def _put_edge_index(self, edge_index: Any, edge_attr: EdgeAttr) -> bool:
        raise ArgumentError("graph store: the partitioned graph is read-only")

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise ArgumentError("graph store: the partitioned graph is read-only")


def remote_backend(
    ctx: DistContext, fields: Mapping[str, str] | None = None
) -> tuple[RemoteFeatureStore, RemoteGraphStore]:
    """``(feature_store, graph_store)`` over ``ctx``'s store, for PyG's loaders."""
    backend = RemoteBackend(ctx)
    return RemoteFeatureStore(backend, fields), RemoteGraphStore(backend)
