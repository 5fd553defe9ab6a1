"""Checking a live write's piece on the partition that receives it (see
:mod:`graphrun.store.live`): every field against the graph's types, features and
the ids this partition owns, before anything is kept; one
:class:`~graphrun.errors.ArgumentError` naming the field otherwise.

A replica takes a piece its primary forwarded (``trusted``) without the checks that look
its ids up in the delta (the ends of new edges, deleted edges, updated rows, whether its
new ids are taken already): the primary made them against the same graph (the replica
holds the primary's writes in its order) before it forwarded the piece, and the forward
comes with the store's own key. So an unpromoted replica never reads its delta's index,
which it then need not build (:class:`~graphrun.store.live.LiveDelta`'s ``deferred``).
The shape, type and range checks stay: they guard the replica's own arrays."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.names import TensorKey
from graphrun.store.live import (
    GROWTH_BLOCK,
    MAX_GROWTH_BLOCKS,
    MAX_PIECE_KEYS,
    MAX_PIECE_ROWS,
    Batch,
    LiveDelta,
    Piece,
    Rows,
)
from graphrun.store.live_index import IdRuns, id_runs, run_ids
from graphrun.store.state import GRAPH_JOB

if TYPE_CHECKING:
    from graphrun.partition.book import PartitionBook
    from graphrun.store.state import ServerState


@dataclass(frozen=True)
class FeatureSpec:
    """One graph feature a piece may carry: ``node/<t>/<n>`` or ``edge/<key>/<n>``."""

    kind: str  # "node" or "edge"
    type_index: int  # the ntype or etype index
    dtype: np.dtype
    row_shape: tuple[int, ...]
    lo: int  # the per-type base rows this partition owns: [lo, hi)
    hi: int


@dataclass(frozen=True)
class Schema:
    """What a partition checks a piece against (built from the server's state)."""

    part: int
    num_nodes: int  # N: growth node ids start here
    num_edges: int  # E: growth edge ids start here
    node_types: tuple[str, ...]
    edge_types: tuple[tuple[str, str, str], ...]
    owned_nodes: tuple[int, int]  # homogeneous base ids owned here
    owned_edges: tuple[int, int]
    features: Mapping[str, FeatureSpec]
    base_node_type: Callable[[np.ndarray], np.ndarray]  # base ids -> int32 ntype index

    @cached_property
    def etype_ends(self) -> np.ndarray:
        """int32 [R, 2]: the src and dst ntype index of each edge type."""
        ix = {t: i for i, t in enumerate(self.node_types)}
        return np.asarray([[ix[s], ix[d]] for s, _, d in self.edge_types], dtype=np.int32)

    def node_type_of(self, ids: np.ndarray, delta: LiveDelta, extra: Batch | None) -> np.ndarray:
        """ntype of each node id (base, committed growth, or new in ``extra``); -1 unknown."""
        if _within(ids, 0, self.num_nodes):  # base ids alone (new edges between base nodes)
            return self.base_node_type(ids).astype(np.int32, copy=False)
        out = np.full(len(ids), -1, dtype=np.int32)
        base = (ids >= 0) & (ids < self.num_nodes)
        if base.any():
            out[base] = self.base_node_type(ids[base])
        grow = ids >= self.num_nodes
        if grow.any():
            out[grow] = delta.node_types_of(ids[grow], extra)
        return out


def _ids(
    rows: Rows | None, what: str, dtype: str = "int64", ndim: int = 1, height: int = 3
) -> np.ndarray:
    if rows is None:
        shape = (height, 0) if ndim == 2 else (0,)
        return np.empty(shape, dtype=dtype)
    a = rows.array(what)
    if a.dtype != np.dtype(dtype) or a.ndim != ndim or (ndim == 2 and a.shape[0] != height):
        want = f"{dtype} [{height}, m]" if ndim == 2 else f"1-d {dtype}"
        raise ArgumentError(f"{what}: expected {want}, got {a.dtype} {a.shape}")
    if a.shape[-1] > MAX_PIECE_ROWS:
        raise ArgumentError(f"{what}: {a.shape[-1]} rows, at most {MAX_PIECE_ROWS} per piece")
    return a


def _within(ids: np.ndarray, lo: int, hi: int) -> bool:
    """Whether every id is in ``[lo, hi)`` (two reductions, no mask)."""
    return len(ids) == 0 or (int(ids.min()) >= lo and int(ids.max()) < hi)


def _in(ids: np.ndarray, lo: int, hi: int, what: str) -> None:
    if _within(ids, lo, hi):
        return
    bad = (ids < lo) | (ids >= hi)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ArgumentError(f"{what}[{i}] = {int(ids[i])} is out of range [{lo}, {hi})")


def _new_ids(ids: np.ndarray, lo: int, hi: int, what: str) -> bool:
    """New ids: each in ``[lo, hi)``, none twice. Ids handed out in runs increase: one
    comparison pass, then their ends are the range (no min, max or sort). Whether they
    increase."""
    if len(ids) > 1 and not bool((ids[1:] > ids[:-1]).all()):
        _in(ids, lo, hi, what)
        _unique(ids, what)
        return False
    if len(ids) and (int(ids[0]) < lo or int(ids[-1]) >= hi):
        _in(ids, lo, hi, what)
    return True


def _unique(ids: np.ndarray, what: str) -> None:
    sorted_ = len(ids) < 2 or bool((ids[1:] > ids[:-1]).all())  # ids handed out in runs
    if not sorted_ and len(np.unique(ids)) != len(ids):
        raise ArgumentError(f"{what}: ids repeat")


def _features(
    given: Mapping[str, Rows],
    schema: Schema,
    kind: str,
    items: np.ndarray,
    types: np.ndarray,
    what: str,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The feature rows of new nodes/edges: every feature of every type present, rows in
    the order of that type's new items; ArgumentError naming the first wrong key."""
    if len(given) > MAX_PIECE_KEYS:
        raise ArgumentError(f"{what}: {len(given)} features, at most {MAX_PIECE_KEYS}")
    if not given and (len(items) == 0 or all(f.kind != kind for f in schema.features.values())):
        return {}  # nothing given, nothing needed (no new items, or no feature of them)
    present = set(np.flatnonzero(np.bincount(types)).tolist())  # types checked in range
    out = {}
    for key, need in schema.features.items():
        if need.kind == kind and need.type_index in present and key not in given:
            raise ArgumentError(f"{what}: feature {key!r} is missing (every feature is given)")
    for key, rows in given.items():
        spec = schema.features.get(key)
        if spec is None or spec.kind != kind or spec.type_index not in present:
            raise ArgumentError(f"{what}: {key!r} is not a {kind} feature of a type written")
        a = rows.array(f"{what}[{key!r}]")
        ids = items[types == spec.type_index]
        want = (len(ids), *spec.row_shape)
        if a.dtype != spec.dtype or a.shape != want:
            raise ArgumentError(
                f"{what}[{key!r}]: got {a.dtype} {a.shape}, expected {spec.dtype} {want}"
            )
        out[key] = (ids, a)
    return out


def check_piece(piece: Piece, schema: Schema, delta: LiveDelta, trusted: bool = False) -> Batch:
    """The piece as a :class:`Batch`, checked wholly against ``schema`` and what
    ``delta`` holds; one ArgumentError naming the field otherwise (nothing kept).
    ``trusted`` (a piece the primary checked and forwarded): no id is looked up in the
    delta's index (see the module docstring)."""
    if piece.version <= 0:
        raise ArgumentError(f"piece: version {piece.version} is not > 0")
    n, e = schema.num_nodes, schema.num_edges
    nodes = _ids(piece.new_nodes, "new_nodes")
    ntypes = _ids(piece.node_types, "node_types", "int32")
    orig = _ids(piece.node_orig, "node_orig")
    if len(ntypes) != len(nodes) or len(orig) != len(nodes):
        raise ArgumentError(f"node_types, node_orig: need {len(nodes)} each (one per new node)")
    nodes_up = _new_ids(nodes, n, n + MAX_GROWTH_BLOCKS * GROWTH_BLOCK, "new_nodes")
    _in(ntypes, 0, len(schema.node_types), "node_types")
    node_runs = _runs(nodes, nodes_up)  # asked here, taken by the delta's hold
    if not trusted and delta.taken_nodes.any_of(nodes, node_runs):
        raise ArgumentError("new_nodes: an id is taken already")
    new_rows = _features(piece.node_features, schema, "node", nodes, ntypes, "node_features")
    edges, edge_runs = _new_edges(piece, e, e + MAX_GROWTH_BLOCKS * GROWTH_BLOCK)
    etypes = _edge_types(piece.edge_types, edges.shape[1], schema)
    if not trusted and delta.taken_edges.any_of(edges[2], edge_runs):
        raise ArgumentError("new_edges: an edge id is taken already")
    _in(edges[0], 0, n + MAX_GROWTH_BLOCKS * GROWTH_BLOCK, "new_edges src")
    batch = Batch(piece.version, nodes, ntypes, orig, edges, etypes, np.empty(0, np.int64),
                  new_rows, {}, (node_runs, edge_runs))  # fmt: skip
    if not trusted:
        _check_ends(edges, etypes, schema, delta, batch)
    edge_rows = _features(piece.edge_features, schema, "edge", edges[2], etypes, "edge_features")
    batch.new_rows.update(edge_rows)
    batch.deleted = _check_deleted(piece.deleted_edges, schema, None if trusted else delta)
    batch.updates = _check_updates(piece.updates, schema, None if trusted else delta)
    return batch


def _new_edges(piece: Piece, lo: int, hi: int) -> tuple[np.ndarray, IdRuns]:
    """The new edges as ``[3, m]`` src, dst, eid, and their ids' runs. A writer sends
    ``[2, m]`` (int64 or int32) and the ids as the ``(start, count)`` runs the
    sequencer handed out (``edge_ids``: two thirds of the bytes less on the wire and in
    the log); an older
    writer, or a log record from before, sends them as a third row. Ids in ``[lo, hi)``,
    increasing (none twice)."""
    if piece.edge_ids is None:
        edges = _ids(piece.new_edges, "new_edges", ndim=2)
        return edges, _runs(edges[2], _new_ids(edges[2], lo, hi, "new_edges eid"))
    ends = _ends(piece.new_edges)
    m = ends.shape[1]
    starts, counts = _id_runs(piece.edge_ids, m, lo, hi)
    edges = np.empty((3, m), np.int64)
    edges[:2] = ends
    run_ids(np.stack([starts, counts], axis=1), out=edges[2])
    return edges, (starts, starts + counts)


def _ends(rows: Rows | None) -> np.ndarray:
    """``[2, m]`` src, dst beside ``edge_ids``: int64, or int32 where every node id of
    the graph fits (the writer's choice: :func:`~graphrun.store.live_wire.end_dtype`;
    half the bytes again)."""
    if rows is not None and rows.dtype == "int32":
        return _ids(rows, "new_edges", "int32", ndim=2, height=2)
    return _ids(rows, "new_edges", ndim=2, height=2)


def _id_runs(
    runs: list[tuple[int, int]], m: int, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray]:
    """``edge_ids``' starts and counts: ``m`` ids in all, each in ``[lo, hi)``, the runs
    in increasing order and apart (no id twice)."""
    if len(runs) > m:
        raise ArgumentError(f"edge_ids: {len(runs)} runs for {m} new edges")
    try:
        r = np.asarray(runs, np.int64).reshape(-1, 2)
    except (OverflowError, ValueError):
        raise ArgumentError("edge_ids: runs must be (start, count) pairs of int64") from None
    starts, counts = r[:, 0], r[:, 1]
    if len(r) and (int(counts.min()) < 1 or int(counts.max()) > m):
        raise ArgumentError(f"edge_ids: a run's count is not in [1, {m}]")
    if int(counts.sum()) != m:
        raise ArgumentError(f"edge_ids: {int(counts.sum())} ids for {m} new edges")
    if len(r) and (int(starts.min()) < lo or int(starts.max()) >= hi
                   or int((starts + counts).max()) > hi):  # fmt: skip
        raise ArgumentError(f"edge_ids: a run is out of range [{lo}, {hi})")
    if bool((starts[1:] < starts[:-1] + counts[:-1]).any()):
        raise ArgumentError("edge_ids: runs overlap or are out of order")
    return starts, counts


_TYPE_0 = np.zeros(MAX_PIECE_ROWS, np.int32)  # calloc'd: pages only read, never touched
_TYPE_0.setflags(write=False)


def _edge_types(rows: Rows | None, m: int, schema: Schema) -> np.ndarray:
    """The new edges' types; left out (None) where the graph has one edge type: each is
    type 0 (the writer sends none: a fifth of a piece's bytes), a view of one read-only
    array of zeros (no array of its own a piece, the delta's memory that faults in)."""
    if rows is None and len(schema.edge_types) == 1:
        return _TYPE_0[:m]
    etypes = _ids(rows, "edge_types", "int32")
    if len(etypes) != m:
        raise ArgumentError(f"edge_types: need {m} (one per new edge)")
    _in(etypes, 0, len(schema.edge_types), "edge_types")
    return etypes


def _runs(ids: np.ndarray, increasing: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`id_runs` of ``ids`` (``increasing``: :func:`_new_ids` found so, as for a
    piece's ids from the sequencer's runs) in half its passes: none for none (most
    batches add edges alone), one for one run (their ends as far apart as their count),
    else the steps other than 1, which start runs (no sort, no check of the order)."""
    if not len(ids):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    if not increasing:
        return id_runs(ids)
    first, last = int(ids[0]), int(ids[-1])
    if last - first == len(ids) - 1:
        return np.asarray([first], np.int64), np.asarray([last + 1], np.int64)
    cut = np.flatnonzero(ids[1:] - ids[:-1] != 1)  # the last id of each run but the last
    starts, ends = np.empty(len(cut) + 1, np.int64), np.empty(len(cut) + 1, np.int64)
    starts[0], starts[1:] = first, ids[cut + 1]
    ends[:-1], ends[-1] = ids[cut] + 1, last + 1
    return starts, ends


def _check_ends(
    edges: np.ndarray, etypes: np.ndarray, schema: Schema, delta: LiveDelta, batch: Batch
) -> None:
    """Each new edge's destination is a node owned here (base, committed, or new in this
    piece) and both ends have the edge type's node types (where this partition knows
    them: a source on another partition is checked by the writer)."""
    lo, hi = schema.owned_nodes
    one_type = len(schema.node_types) == 1  # every known end has the type edges need
    if one_type and _within(edges[1], lo, hi):  # base nodes owned here: nothing to look up
        return
    dst_t = schema.node_type_of(edges[1], delta, batch)
    owned = ((edges[1] >= lo) & (edges[1] < hi)) | ((edges[1] >= schema.num_nodes) & (dst_t >= 0))
    if not owned.all():
        i = int(np.flatnonzero(~owned)[0])
        raise ArgumentError(f"new_edges dst[{i}] = {int(edges[1][i])} is not a node owned here")
    if one_type:
        return
    ends = schema.etype_ends[etypes] if len(etypes) else np.empty((0, 2), np.int32)
    src_t = schema.node_type_of(edges[0], delta, batch)
    for col, got, what in ((0, src_t, "src"), (1, dst_t, "dst")):
        bad = (got >= 0) & (got != ends[:, col])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ArgumentError(
                f"new_edges {what}[{i}] = {int(edges[col][i])} has node type "
                f"{schema.node_types[got[i]]!r}, edge type {schema.edge_types[etypes[i]]} "
                f"needs {schema.node_types[ends[i, col]]!r}"
            )


def _check_deleted(rows: Rows | None, schema: Schema, delta: LiveDelta | None) -> np.ndarray:
    """The deleted edge ids; owned here (base, or new in ``delta``) unless trusted (None)."""
    if rows is None:
        return np.empty(0, np.int64)
    eids = _ids(rows, "deleted_edges")
    _unique(eids, "deleted_edges")
    if delta is None:
        return eids
    lo, hi = schema.owned_edges
    ok = ((eids >= lo) & (eids < hi)) | delta.has_edges(eids)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise ArgumentError(f"deleted_edges[{i}] = {int(eids[i])} is not an edge owned here")
    return eids


def _check_updates(
    given: Mapping[str, tuple[Rows, Rows]], schema: Schema, delta: LiveDelta | None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The updated rows per feature; each a row of it owned here (base, or new in
    ``delta``) unless trusted (None)."""
    if len(given) > MAX_PIECE_KEYS:
        raise ArgumentError(f"updates: {len(given)} features, at most {MAX_PIECE_KEYS}")
    out = {}
    for key, (id_rows, value_rows) in given.items():
        spec = schema.features.get(key)
        if spec is None:
            raise ArgumentError(f"updates: {key!r} is not a feature of the graph")
        ids = _ids(id_rows, f"updates[{key!r}] ids")
        _unique(ids, f"updates[{key!r}] ids")
        if delta is not None:
            _check_owned_rows(ids, spec, schema, delta, key)
        vals = value_rows.array(f"updates[{key!r}] rows")
        want = (len(ids), *spec.row_shape)
        if vals.dtype != spec.dtype or vals.shape != want:
            raise ArgumentError(
                f"updates[{key!r}] rows: got {vals.dtype} {vals.shape}, "
                f"expected {spec.dtype} {want}"
            )
        out[key] = (ids, vals)
    return out


def _check_owned_rows(
    ids: np.ndarray, spec: FeatureSpec, schema: Schema, delta: LiveDelta, key: str
) -> None:
    """Each of ``ids`` is a row of feature ``key`` owned here: a base row, or a new item
    of its type committed in ``delta``."""
    grow = schema.num_nodes if spec.kind == "node" else schema.num_edges
    if spec.kind == "node":
        t = schema.node_type_of(ids, delta, None)
    else:
        t = delta.edge_types_of(ids, None)
    ok = ((ids >= spec.lo) & (ids < spec.hi)) | ((ids >= grow) & (t == spec.type_index))
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise ArgumentError(
            f"updates[{key!r}] ids[{i}] = {int(ids[i])} is not a row of it owned here"
        )


def schema_of(state: ServerState) -> Schema:
    book, part = state.book, state.part
    features = {}
    for (job, name), t in state.tensors.items():
        key = TensorKey.parse(name)
        if job != GRAPH_JOB or key is None:
            continue
        if key.kind == "node":
            idx, (lo, hi) = book.ntype_id(key.type), book.owned_nodes(part, key.type)
        else:
            idx, (lo, hi) = book.etype_id(key.type), book.owned_edges(part, key.type)
        spec = FeatureSpec(key.kind, idx, np.dtype(t.info.dtype), t.info.row_shape, lo, hi)
        features[name] = spec
    return Schema(
        part=part,
        num_nodes=book.num_nodes,
        num_edges=book.num_edges,
        node_types=book.node_types,
        edge_types=book.edge_types,
        owned_nodes=book.owned_nodes(part),
        owned_edges=book.owned_edges(part),
        features=features,
        base_node_type=_base_node_type(book),
    )


def _base_node_type(book: PartitionBook) -> Callable[[np.ndarray], np.ndarray]:
    if len(book.node_types) == 1:  # one type: no lookup
        return lambda ids: np.zeros(len(ids), np.int32)
    return lambda ids: book.to_per_type(ids)[0]
