"""graphrun.store: the distributed graph store.

* :mod:`~graphrun.store.server` — a KV server process per partition (main + backups
  on shared memory), :class:`ServerConfig`, :func:`run_server`;
* :mod:`~graphrun.store.client` — :class:`KVClient` / :class:`ClientConfig`;
* :mod:`~graphrun.store.registry` — how to add request kinds (``sample_neighbors``);
* :mod:`~graphrun.store.policy` — partition policies per node/edge type;
* :mod:`~graphrun.store.shm` — shared-memory segments; :mod:`~graphrun.store.reducers`;
* :class:`DistTensor`, :class:`DistEmbedding`, :class:`SparseAdagrad`, :class:`SparseAdam`
  (these import torch).

Every name here loads on first use: a process that needs one module of the package (a
machine worker: :mod:`~graphrun.store.shm` to clean its stores' segments) does not
import the client, the server and zmq with it (0.1 CPU-s a process, and a job starts a
worker per machine and attempt).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphrun.lazy import lazy_names

if TYPE_CHECKING:
    from graphrun.store.client import ClientConfig, KVClient, Pending
    from graphrun.store.dist_tensor import DistTensor
    from graphrun.store.embedding import DistEmbedding, SparseAdagrad, SparseAdam
    from graphrun.store.registry import Registry, Request, Response
    from graphrun.store.server import ServerConfig, run_server
    from graphrun.store.state import GRAPH_JOB, ServerState, TensorInfo

_LAZY = {
    "ClientConfig": "client",
    "KVClient": "client",
    "Pending": "client",
    "Registry": "registry",
    "Request": "registry",
    "Response": "registry",
    "ServerConfig": "server",
    "run_server": "server",
    "GRAPH_JOB": "state",
    "ServerState": "state",
    "TensorInfo": "state",
    "DistTensor": "dist_tensor",
    "DistEmbedding": "embedding",
    "SparseAdagrad": "embedding",
    "SparseAdam": "embedding",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "GRAPH_JOB",
    "ClientConfig",
    "DistEmbedding",
    "DistTensor",
    "KVClient",
    "Pending",
    "Registry",
    "Request",
    "Response",
    "ServerConfig",
    "ServerState",
    "SparseAdagrad",
    "SparseAdam",
    "TensorInfo",
    "run_server",
]
