"""The store extension that samples on the server owning the seeds.

Start store servers with the extension ``"graphrun.sampling.server:register"``;
it adds the op :data:`OP`:

    body    {"fanout": [int per edge type], "replace": bool, "weighted": bool, "seed": int,
             "weight": edge feature name (with weighted), "eids": bool (default true)}
    tensors (seeds int64 [n],)    global node ids owned by this partition
    reply   {"count": m}; tensors (src int64 [m], seed_index int64 [m], eid int64 [m]
            [, etype int32 [m]]); with "eids": false the eid tensor may be empty [0]
            (not gathered nor sent)

and the structure queries :mod:`graphrun.distributed` uses (tensors ``(ids int64 [n],)``):
``graph_in_degrees`` → ``(deg,)`` of owned nodes; ``graph_out_degrees`` → ``(count,)``
of this partition's edges leaving each id (the client sums over partitions);
``graph_find_edges`` → ``(src, dst)`` of owned edge ids; ``graph_edge_types`` →
``(etype,)``: each owned edge's type index (a live graph's new edges' included: a
following client's only source of it by id alone, distributed/live.py).

On a live graph every read is at the request's version (:mod:`graphrun.sampling.live`),
weighted ones too: each in-edge of a seed at the version with its weight at it (a new
edge's row, a base edge's from the base tensor or its update; docs/live.md).

``seed`` seeds the numpy kernels (:func:`graphrun.sampling.kernels.make_rng`), so a
trainer sampling a co-located partition in-process gets the same edges. The
partition's CSC is read from the server's shared memory (no copy) and kept in
``state.extension_data["graphrun.sampling"]``. Bad requests raise ArgumentError,
which the store sends back to the client as that error type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from graphrun.errors import ArgumentError, StoreError
from graphrun.names import TensorKey
from graphrun.sampling import changes, live
from graphrun.sampling.csc import CSCGraph, SampledEdges, csc_from_structure, owned_edge_weights
from graphrun.store import live_ops

if TYPE_CHECKING:
    from graphrun.store.registry import Registry, Request, Response
    from graphrun.store.state import ServerState

OP = "sample_neighbors"
OP_IN_DEGREES = "graph_in_degrees"
OP_OUT_DEGREES = "graph_out_degrees"
OP_FIND_EDGES = "graph_find_edges"
OP_EDGE_TYPES = "graph_edge_types"

KEY = "graphrun.sampling"
#: The most edges one request with replacement may ask for (seeds x sum of fanouts): 8M
#: edges are a 200 MB reply. Without replacement a seed gives at most its degree.
MAX_SAMPLED_EDGES = 1 << 23


def _csc(state: ServerState, weight: str | None = None) -> CSCGraph:
    """The partition's CSC (with edge feature ``weight`` aligned to it), built once."""
    cache = state.extension_data.setdefault(KEY, {})
    if cache.get("of") is not state.structure.get("indptr"):  # swapped by a compaction
        cache.clear()
        cache["of"] = state.structure.get("indptr")
    key = ("csc", weight)
    if key not in cache:
        w = None
        if weight is not None:
            from graphrun.store.state import GRAPH_JOB

            def owned_rows(key: str, lo: int, hi: int) -> np.ndarray:
                return state.find(GRAPH_JOB, str(TensorKey.edge(key, weight))).array

            w = owned_edge_weights(state.book, state.part, state.structure, weight, owned_rows)
        cache[key] = csc_from_structure(state.structure, state.book, state.part, weights=w)
    csc: CSCGraph = cache[key]
    return csc


def _live_weights(state: ServerState, weight: str) -> live.EdgeWeights:
    """Edge feature ``weight`` of the partition at a version: base rows from its tensor
    (shared memory, or through the disk cache), the rest from the delta."""
    from graphrun.store.state import GRAPH_JOB

    def base(key: str, rows: np.ndarray) -> np.ndarray:
        try:
            stored = state.find(GRAPH_JOB, str(TensorKey.edge(key, weight)))
        except StoreError:
            raise ArgumentError(f"weight: edge type {key} has no edge feature {weight!r}") from None
        return np.asarray(stored.take(rows))

    return live.EdgeWeights(weight, state.book, state.part, base)


class SampleBody(msgspec.Struct, frozen=True, kw_only=True):
    """The body of ``sample_neighbors``: one hop's fanout per edge type (or one), whether
    with replacement, weighted by which edge tensor, and the seed of the draw."""

    fanout: list[int]
    seed: int
    replace: bool = False
    weighted: bool = False
    weight: str | None = None
    eids: bool = True  # false: the picked edges' ids are not wanted (not gathered nor sent)

    def __post_init__(self) -> None:
        if any(k < 0 for k in self.fanout):
            raise ValueError("fanout: must hold non-negative ints")
        if self.weighted and self.weight is None:
            raise ValueError("weight: missing (weighted sampling names its edge weight)")


def sample_neighbors(state: ServerState, req: Request) -> Response:
    from graphrun.store.registry import Response

    seeds = req.tensor(0, "seeds")
    if seeds.ndim != 1 or seeds.dtype != np.int64:
        raise ArgumentError(f"{OP}: seeds must be 1-d int64, got {seeds.dtype} {seeds.shape}")
    args = req.args(SampleBody)
    fanout, replace = args.fanout, args.replace
    if replace and seeds.size * sum(fanout) > MAX_SAMPLED_EDGES:
        raise ArgumentError(
            f"{OP}: {seeds.size} seeds x fanout {sum(fanout)} with replacement asks for "
            f"{seeds.size * sum(fanout)} edges; at most {MAX_SAMPLED_EDGES} per request"
        )
    weight = args.weight if args.weighted else None
    delta, v = live_ops.view(state, req)
    if delta is not None:  # a live graph: the seeds' in-edges at the request's version
        w = None if weight is None else _live_weights(state, weight)
        out = live.sample_one_hop(_csc(state), delta, v, np.asarray(seeds), fanout,
                                  replace=replace, seed=args.seed, weights=w)  # fmt: skip
    else:
        out = _csc(state, weight).sample_one_hop(seeds, fanout, replace=replace,
                                                 weighted=args.weighted, seed=args.seed,
                                                 edge_ids=args.eids)  # fmt: skip
    body, tensors = encode_reply(out, args.eids)
    return Response(body, tensors)


def encode_reply(
    out: SampledEdges, edge_ids: bool = True
) -> tuple[dict[str, Any], tuple[np.ndarray, ...]]:
    arrays = [out.src, out.seed_index, out.eid if edge_ids else out.eid[:0]]
    if out.etype is not None:
        arrays.append(out.etype)
    return {"count": len(out)}, tuple(arrays)


def _ids(req: Request) -> np.ndarray:
    ids = req.tensor(0, "ids")
    if ids.ndim != 1 or ids.dtype != np.int64:
        raise ArgumentError(f"{req.op}: ids must be 1-d int64, got {ids.dtype} {ids.shape}")
    return np.asarray(ids)


def in_degrees(state: ServerState, req: Request) -> Response:
    from graphrun.store.registry import Response

    ids = _ids(req)
    delta, v = live_ops.view(state, req)
    if delta is not None:
        return Response({}, (live.in_degrees(_csc(state), delta, v, ids),))
    return Response({}, (_csc(state).in_degrees(ids),))


def out_degrees(state: ServerState, req: Request) -> Response:
    """How many of this partition's edges leave each id (the client sums partitions)."""
    from graphrun.store.registry import Response

    ids = _ids(req)
    n = state.book.num_nodes
    delta, v = live_ops.view(state, req)
    if len(ids) and int(ids.min()) < 0:
        raise ArgumentError(f"{req.op}: ids must be >= 0")
    if delta is not None:
        return Response({}, (live.out_degree_counts(_csc(state), delta, v, ids, n),))
    counts = _csc(state).out_degree_counts(n)
    grow = ids >= n
    if not grow.any():
        return Response({}, (counts[ids],))
    # a following client's new ids ("v" sent) while nothing here is visible at v: no edge
    # of this partition leaves them yet
    if "v" not in req.body or state.extension_data.get(live_ops.KEY) is None:
        raise ArgumentError(f"{req.op}: ids out of range [0, {n})")
    return Response({}, (np.where(grow, 0, counts[np.where(grow, 0, ids)]),))


def find_edges(state: ServerState, req: Request) -> Response:
    from graphrun.store.registry import Response

    ids = _ids(req)
    missing = req.body.get("missing", False)  # -1 ends for ids no edge at the version
    if not isinstance(missing, bool):
        raise ArgumentError(f"{req.op}: field 'missing' must be true or false")
    delta, v = live_ops.view(state, req)
    if delta is not None:  # a live graph: the edges at the request's version
        return Response({}, live.find_edges(_csc(state), delta, v, ids, missing))
    src, dst = _csc(state).find_edges(ids)
    return Response({}, (src, dst))


def edge_types(state: ServerState, req: Request) -> Response:
    from graphrun.store.registry import Response

    ids = _ids(req)
    delta, v = live_ops.view(state, req)
    if delta is not None:
        return Response({}, (live.edge_types(_csc(state), delta, v, ids),))
    return Response({}, (_csc(state).edge_types(ids),))


def register(registry: Registry) -> None:
    """Store extension entry point: ``graphrun.sampling.server:register``.

    The kernels are numpy (single-threaded) and import no torch: a server starts a
    second of CPU sooner than with torch's kernels, and holds no torch runtime.
    """
    registry.add(OP, sample_neighbors)
    registry.add(OP_IN_DEGREES, in_degrees)
    registry.add(OP_OUT_DEGREES, out_degrees)
    registry.add(OP_FIND_EDGES, find_edges)
    registry.add(OP_EDGE_TYPES, edge_types)
    changes.register(registry, _csc)  # an embedding refresh's questions (sampling/changes.py)
