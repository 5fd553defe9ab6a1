"""A store extension used by the tests: the documented way to add a request kind."""

import numpy as np

from graphrun.store.registry import Registry, Request, Response
from graphrun.store.state import ServerState


def in_degree(state: ServerState, req: Request) -> Response:
    """In-degree of owned nodes, given as homogeneous new ids owned by this partition."""
    ids = req.tensor(0, "node ids").astype(np.int64)
    start, end = state.book.owned_nodes(state.part)
    if ids.size and (ids.min() < start or ids.max() >= end):
        from graphrun.errors import ArgumentError

        raise ArgumentError(f"in_degree: ids must be owned by partition {state.part}")
    indptr = state.structure["indptr"]
    local = ids - start  # owned nodes come first in part-K/nodes.npy
    calls = state.extension_data.setdefault("in_degree", {"calls": 0})
    calls["calls"] += 1
    return Response({"calls": calls["calls"]}, (indptr[local + 1] - indptr[local],))


def register(registry: Registry) -> None:
    registry.add("in_degree", in_degree)
