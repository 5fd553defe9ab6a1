"""What changed in a live partition between two versions, and who is downstream of it.

Store ops for an incremental refresh of stored embeddings (:mod:`graphrun.serving.refresh`)
and a link loader's new positives, added by ``graphrun.sampling.server:register``; numpy
only (the store imports no torch):

==================  ======================================================================
op                  body -> reply
==================  ======================================================================
graph_changes       since, v, features (node tensor names; empty: every node feature),
                    edges -> tensors (nodes int64: new nodes and nodes whose named
                    features were updated in ``(since, v]``; dst int64: destinations of
                    the edges added or deleted in ``(since, v]``), graph ids owned here,
                    unique; with ``edges``, then (src, dst, sign) int64 of each edge into
                    a node owned here that is at ``v`` and was not at ``since`` (+1) or
                    was and is not (-1) (:func:`changed_edges`)
graph_out_neighbors tensors (ids int64,), v, edges -> tensors (dst int64,): the nodes of
                    this partition with an in-edge at ``v`` from one of ``ids``, unique;
                    with ``edges``: (src, dst) of each such edge (a multi-edge as often
                    as it is there) instead
graph_new_edges     since, etype, v -> tensors (eids int64,): the new edges held here of
                    type index ``etype`` (-1: any) at ``v`` (not deleted by then) added
                    after ``since`` (-1: every one; every one too when ``since`` was
                    folded into the base by a compaction), sorted: the positives that a
                    link loader following the graph takes (:func:`new_edges`)
==================  ======================================================================

A node's layer-``l`` state depends on its in-neighbours' layer ``l-1`` states and its
in-edges: new nodes and updated features change layer 0, an added or deleted in-edge
changes its destination at layer 1, and a change at layer ``l-1`` reaches the
out-neighbours at layer ``l``. ``graph_out_neighbors`` looks its ids up in the partition's
out-edge index (:meth:`CSCGraph.out_edges`, built once) and in the delta's runs sorted by
source: its cost is the out-degrees of the ids asked, not the partition's edges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from graphrun.errors import ArgumentError, StoreError
from graphrun.names import TensorKey
from graphrun.partition.arrays import unique_sorted
from graphrun.sampling.csc import CSCGraph
from graphrun.store import live_ops
from graphrun.store.live import LiveDelta, spans

if TYPE_CHECKING:
    from graphrun.store.registry import Registry, Request, Response
    from graphrun.store.state import ServerState

OP_CHANGES = "graph_changes"
OP_OUT_NEIGHBORS = "graph_out_neighbors"
OP_NEW_EDGES = "graph_new_edges"
MAX_IDS = 1 << 24  # ids of one graph_out_neighbors request
MAX_OUT_EDGES = 1 << 24  # edges of one graph_out_neighbors reply with ``edges`` (256 MB)
MAX_NEW_EDGES = 1 << 24  # edge ids of one graph_new_edges reply (128 MB)
EMPTY = np.empty(0, np.int64)


class ChangesBody(msgspec.Struct, frozen=True):
    since: int
    features: list[str] = msgspec.field(default_factory=list)
    edges: bool = False  # the changed edges themselves too


class NewEdgesBody(msgspec.Struct, frozen=True):
    since: int = -1
    etype: int = -1


class OutBody(msgspec.Struct, frozen=True):
    edges: bool = False  # the edges themselves (src, dst), not their unique destinations


def _node_key(name: str) -> bool:
    key = TensorKey.parse(name)
    return key is not None and key.kind == "node"


def changes(
    csc: CSCGraph, delta: LiveDelta, since: int, version: int, features: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """``(nodes, dst)`` of ``graph_changes`` (see the module docstring)."""
    return _changes(delta, since, version, features, changed_edges(csc, delta, since, version))


def _changes(
    delta: LiveDelta, since: int, version: int, features: list[str], edges: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    nodes, dst = [EMPTY], [edges[1]]
    for v in sorted(delta.committed):
        if not since < v <= version:
            continue
        b = delta.committed[v]
        nodes.append(b.nodes)
        for key, (ids, _) in b.updates.items():
            if (key in features) if features else _node_key(key):
                nodes.append(ids)
        dst.append(b.edges[1])  # an edge deleted again since: its target too
    return unique_sorted(np.concatenate(nodes)), unique_sorted(np.concatenate(dst))


def changed_edges(csc: CSCGraph, delta: LiveDelta, since: int, version: int) -> np.ndarray:
    """int64 ``[3, m]`` (src, dst, sign): the edges into this partition's nodes at
    ``version`` that were not at ``since`` (sign +1) and those at ``since`` that are not
    at ``version`` (-1); an edge added and deleted in between is neither, each copy of a
    multi-edge is one. What an incremental sum over in-edges adds and takes away."""
    runs = delta.runs
    e = np.hstack([np.empty((5, 0), np.int64), *(r.edges for r in runs)])
    gone = np.concatenate(
        [EMPTY, *(r.deleted[0][(r.deleted[1] > since) & (r.deleted[1] <= version)] for r in runs)]
    )
    added = e[:2, (e[4] > since) & (e[4] <= version) & ~delta.deleted(e[2], version)]
    had = e[:, e[4] <= since]
    new = had[:2, np.isin(had[2], gone)]  # new edges, deleted since
    base = gone[~np.isin(gone, e[2])]  # base edges, deleted since
    # the CSC sorts its edge ids on the first find_edges (1M edges: a tenth of a second)
    src, dst = csc.find_edges(base) if len(base) else (EMPTY, EMPTY)
    sign = np.concatenate([np.ones(added.shape[1], np.int64),
                           -np.ones(new.shape[1] + len(src), np.int64)])  # fmt: skip
    return np.vstack([np.hstack([added, new, np.vstack([src, dst])]), sign])


def out_edges(csc: CSCGraph, delta: LiveDelta | None, version: int, ids: np.ndarray) -> np.ndarray:
    """int64 ``[2, m]`` (src, dst): this partition's edges from one of ``ids`` at
    ``version``, the base ones by the CSC's out-edge index, the new ones by the delta's
    runs sorted by source; each id costs its out-degree."""
    src, dst, eid = csc.out_edges(ids)
    if delta is None:
        return np.vstack([src, dst])
    keep = ~delta.deleted(eid, version)
    found = [np.vstack([src[keep], dst[keep]])]
    for r in delta.runs:
        by_src = r.edges_by_src()
        lo, hi = np.searchsorted(by_src[0], ids), np.searchsorted(by_src[0], ids, "right")
        e = r.edges[:, by_src[2][spans(lo, hi)]]
        found.append(e[:2, (e[4] <= version) & ~delta.deleted(e[2], version)])
    return np.hstack(found)


def new_edges(delta: LiveDelta, since: int, version: int, etype: int) -> np.ndarray:
    """Sorted ids of ``graph_new_edges`` (see the module docstring): the runs' edges
    added in ``(since, version]`` and, asked since before the compacted version, the
    ones folded into the base CSC (``base_eids``; the folded growth's are at version 0)."""
    since = since if since >= delta.floor else -1
    ids, types = [EMPTY], [EMPTY]
    for r in delta.runs:
        if r.last <= since or r.first > version:  # none of its edges: not read
            continue
        keep = (r.edges[4] > since) & (r.edges[4] <= version)
        ids.append(r.edges[2, keep])
        types.append(r.edges[3, keep])
    if since < 0:
        ids.append(delta.base_eids[0])
        types.append(delta.base_eids[1])
    eids, et = np.concatenate(ids), np.concatenate(types)
    if etype >= 0:
        eids = eids[et == etype]
    return unique_sorted(eids[~delta.deleted(eids, version)])


CscOf = Callable[["ServerState"], CSCGraph]  # the partition's CSC (the sampling server's)


def graph_changes(state: ServerState, req: Request, csc_of: CscOf) -> Response:
    from graphrun.store.registry import Response

    body = req.args(ChangesBody)
    delta, v = live_ops.view(state, req)
    if not 0 <= body.since <= v:
        raise ArgumentError(f"{req.op}: field 'since' must be a version in [0, v={v}]")
    if len(body.features) > 256:
        raise ArgumentError(f"{req.op}: field 'features' names more than 256 tensors")
    if delta is None:
        return Response({}, (EMPTY, EMPTY) + ((EMPTY, EMPTY, EMPTY) if body.edges else ()))
    if body.since < delta.floor:  # folded into the base: no longer told apart
        raise StoreError(f"{req.op}: since {body.since} is below partition {state.part}'s "
                         f"compacted version {delta.floor}; refresh every node")  # fmt: skip
    edges = changed_edges(csc_of(state), delta, body.since, v)
    got = _changes(delta, body.since, v, body.features, edges)
    return Response({}, (*got, *edges) if body.edges else got)


def graph_out_neighbors(state: ServerState, req: Request, csc_of: CscOf) -> Response:
    from graphrun.store.registry import Response

    ids = req.tensor(0, "ids")
    if ids.ndim != 1 or ids.dtype != np.int64 or len(ids) > MAX_IDS:
        raise ArgumentError(f"{req.op}: ids must be 1-d int64, at most {MAX_IDS}, "
                            f"got {ids.dtype} {ids.shape}")  # fmt: skip
    body = req.args(OutBody)
    delta, v = live_ops.view(state, req)
    e = out_edges(csc_of(state), delta, v, np.asarray(ids))
    if not body.edges:
        return Response({}, (unique_sorted(e[1]),))
    if e.shape[1] > MAX_OUT_EDGES:
        raise ArgumentError(f"{req.op}: the {len(ids)} ids have {e.shape[1]} out-edges here, "
                            f"more than {MAX_OUT_EDGES} a reply: ask for fewer ids")  # fmt: skip
    return Response({}, (e[0], e[1]))


def graph_new_edges(state: ServerState, req: Request) -> Response:
    from graphrun.store.registry import Response

    body = req.args(NewEdgesBody)
    delta, v = live_ops.view(state, req)
    if body.since < -1 or body.etype < -1:
        raise ArgumentError(f"{req.op}: fields 'since' and 'etype' must be >= -1")
    if delta is None:
        return Response({}, (EMPTY,))
    eids = new_edges(delta, body.since, v, body.etype)
    if len(eids) > MAX_NEW_EDGES:
        raise ArgumentError(f"{req.op}: {len(eids)} new edges here since {body.since}, more "
                            f"than {MAX_NEW_EDGES} a reply: ask since a later version")  # fmt: skip
    return Response({}, (eids,))


def register(registry: Registry, csc_of: CscOf) -> None:
    """Add the three ops, reading the partition's CSC through ``csc_of`` (the sampling
    server's, built once)."""
    registry.add(OP_CHANGES, lambda state, req: graph_changes(state, req, csc_of))
    registry.add(OP_OUT_NEIGHBORS, lambda state, req: graph_out_neighbors(state, req, csc_of))
    registry.add(OP_NEW_EDGES, graph_new_edges)
