"""A served graph that reads like a PyG dataset, so PyG scripts port by their imports.

    from graphrun.distributed import StoreDataset as Reddit     # was torch_geometric's
    from graphrun.distributed import NeighborLoader              # PyG's, sampling on the store
    dataset = Reddit(path)          # path/store.json names the store (below), or a context
    data = dataset[0]               # RemoteData: the (feature_store, graph_store) pair
    data.x                          # a DistTensor: rows are pulled as batches need them
    data.y, data.train_mask         # per-node scalars: torch tensors (one value a node)
    NeighborLoader(data, [25, 10], input_nodes=data.train_mask, batch_size=1024)

``RemoteData`` *is* the ``(feature_store, graph_store)`` tuple PyG's loaders take, with
``Data``'s attribute reads on top: a node feature of the graph's one node type by its
PyG name (``x``/``y`` for the store's ``feat``/``label``, else the store's name);
features with one value a node (labels, masks) come whole (the same size as the id
list a mask stands for), wider ones as :class:`~graphrun.store.dist_tensor.DistTensor`
(no feature table is copied into the trainer). ``.to(...)`` is a no-op (features stay
on the store; move each batch), ``copy.copy`` gives a view with its own feature list,
and ``del data.x`` stops that view's loaders from fetching ``x``.

The store file ``<dir>/store.json`` (version 1)::

    {"version": 1, "servers": ["tcp://10.0.0.1:7000", ...], "job": "default",
     "keys": "job.key"}        # optional: a key file (relative to <dir>) for CURVE

lists the main server of every partition; :func:`write_store_file` writes it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Self

import msgspec
import torch

from graphrun.distributed.context import DistContext, initialize
from graphrun.distributed.dglnames import DistTensor
from graphrun.distributed.pyg_stores import RemoteBackend, RemoteFeatureStore, RemoteGraphStore
from graphrun.errors import ArgumentError, DatasetError
from graphrun.names import TensorKey
from graphrun.rpc.auth import load_keys
from graphrun.store.dist_tensor import as_torch
from graphrun.wire import check_header, convert, write_json

STORE_FILE = "store.json"
STORE_FILE_VERSION = 1


class StoreFile(msgspec.Struct, kw_only=True):
    """``store.json`` (the module docstring): a version header only, no ``format`` (the
    file predates it; :func:`graphrun.wire.check_header` is told so)."""

    version: int
    servers: list[str]
    job: str = "default"
    keys: str | msgspec.UnsetType = msgspec.UNSET  # a key file, relative to the directory

    def __post_init__(self) -> None:
        if not self.servers:
            raise ValueError("servers: must name at least one server address")


def write_store_file(
    directory: str | Path, servers: list[str], job: str = "default", keys: str | None = None
) -> Path:
    """Write ``<directory>/store.json`` naming the store's servers (see module docstring)."""
    unset = msgspec.UNSET
    body = StoreFile(
        version=STORE_FILE_VERSION,
        servers=list(servers),
        job=job,
        keys=unset if keys is None else keys,
    )
    path = Path(directory) / STORE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_json(path, body, indent=1)


def read_store_file(directory: str | Path, **options: Any) -> DistContext:
    """Join the store ``<directory>/store.json`` names; ``options`` go to ``initialize``."""
    path = Path(directory) / STORE_FILE
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetError(f"{path}: no store file (write it with write_store_file)") from None
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: not a readable JSON store file ({exc})") from None
    check_header(body, str(path), None, STORE_FILE_VERSION, DatasetError)
    f = convert(StoreFile, body, str(path), DatasetError)
    pair = load_keys(path.parent / f.keys) if f.keys else None
    return initialize(f.servers, job=f.job, keys=pair, **options)


class RemoteData(tuple):
    """``(feature_store, graph_store)`` with ``Data``'s reads (see the module docstring)."""

    def __new__(cls, feature_store: RemoteFeatureStore, graph_store: RemoteGraphStore) -> Self:
        return super().__new__(cls, (feature_store, graph_store))

    @property
    def feature_store(self) -> RemoteFeatureStore:
        fs: RemoteFeatureStore = self[0]
        return fs

    @property
    def backend(self) -> RemoteBackend:
        return self.feature_store.backend

    def _ntype(self) -> str:
        types = self.backend.book.node_types
        if len(types) != 1:
            raise ArgumentError(f"data: a heterograph; read features per type ({list(types)})")
        return str(types[0])

    def __getattr__(self, name: str) -> DistTensor | torch.Tensor | int:
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "num_nodes":
            return int(self.backend.book.num_nodes)
        store_name = self.feature_store.fields.get(name, name)
        key = str(TensorKey.node(self._ntype(), store_name))
        if not self.backend.has(key):
            raise AttributeError(f"the store's graph has no node feature {store_name!r}")
        t = DistTensor(self.backend.context().client, key)
        if t.ndim > 1:
            return t
        value = as_torch(t.pull_numpy(torch.arange(t.shape[0])))
        self.__dict__[name] = value  # one value a node: read once
        return value

    def __delattr__(self, name: str) -> None:
        self.__dict__.pop(name, None)
        self.feature_store.fields.pop(name, None)  # this view's loaders stop fetching it

    def to(self, *args: Any, **kwargs: Any) -> RemoteData:
        """A no-op: the features stay on the store (move each batch instead)."""
        return self

    def __copy__(self) -> RemoteData:
        out = RemoteData(copy.copy(self.feature_store), self[1])
        out.__dict__.update(self.__dict__)
        return out

    def __reduce__(self) -> tuple[type[RemoteData], tuple[RemoteFeatureStore, RemoteGraphStore]]:
        return (RemoteData, (self[0], self[1]))


class StoreDataset:
    """A one-graph dataset served by the store: ``dataset[0]`` is its :class:`RemoteData`.

    ``source``: a joined :class:`DistContext`, or a directory with a ``store.json``."""

    def __init__(self, source: DistContext | str | Path, **options: Any) -> None:
        self.ctx = source if isinstance(source, DistContext) else read_store_file(source, **options)
        self.backend = RemoteBackend(self.ctx)
        self._data = RemoteData(RemoteFeatureStore(self.backend), RemoteGraphStore(self.backend))

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> RemoteData:
        if index not in (0, -1):
            raise IndexError(f"index {index}: a StoreDataset holds one graph")
        return self._data

    def _feature(self, attr: str) -> DistTensor:
        store_name = self._data.feature_store.fields.get(attr, attr)
        ntype = self._data._ntype()
        return DistTensor(self.ctx.client, str(TensorKey.node(ntype, store_name)))

    @property
    def num_features(self) -> int:
        x = self._feature("x")
        return int(x.shape[1]) if x.ndim > 1 else 1

    @property
    def num_classes(self) -> int:
        """1 + the largest label (computed by the servers)."""
        top = self._feature("y").reduce("max")
        return 0 if top is None else int(top) + 1

    def close(self) -> None:
        self.ctx.close()
