"""A job's node tensors on a live graph: rows for the new nodes (``DistEmbedding``).

A job's tensor with a node policy (a ``DistEmbedding`` and its optimizer's states) is
made with a row per base node of the partition. When the graph grows (issue 42,
docs/live.md), a job that follows it meets new nodes — graph ids ``>= num_nodes``, owned
by growth blocks, at local rows ``part_rows + (id - num_nodes)``
(:func:`~graphrun.store.live.growth_row`) — and looks up and trains their rows. Those
rows are held beside the shared-memory segment, a growth block at a time
(:class:`~graphrun.store.growth.GrowthRows`, on the
:class:`~graphrun.store.state.StoredTensor`), made on first
use by a request at a version where the node exists (a client that does not follow the
graph, or a request at a version below the node's, is refused as before) and filled by
the tensor's initialiser with a generator of the block's own (``[seed, 1 + block]``),
so a new node's first value does not depend on which server, replica or request made
it. They are read and written by the main server only (a following client's requests
go there: :mod:`graphrun.store.live_client`); the segment keeps the base rows, so
co-located clients still read those from shared memory. Bound: the rows of the new
nodes visible on this partition, whose count the delta's bound bounds. A heterograph's
table of one node type (policy ``node:<type>``) holds rows of that type's new nodes only:
an id of another type is refused by name (it made a row of the wrong node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.store import live_ops
from graphrun.store.growth import GrowthRows
from graphrun.store.live import GROWTH_BLOCK
from graphrun.store.policy import lookup_policy
from graphrun.store.reducers import Reducer

if TYPE_CHECKING:
    from graphrun.store.registry import Request
    from graphrun.store.state import ServerState, StoredTensor


def _blocks(stored: StoredTensor, blocks: np.ndarray) -> GrowthRows:
    if stored.grown is None:
        stored.grown = GrowthRows(stored.info.row_shape, stored.array.dtype)
    stored.grown.ensure(blocks, *stored.init)
    return stored.grown


def grow(state: ServerState, req: Request, stored: StoredTensor, rows: np.ndarray) -> bool:
    """Whether local ``rows`` (all ``>= part_rows``) are rows of new nodes visible at the
    request's version, in a job's node tensor; their blocks are made if they were not."""
    if stored.info.job == "" or not len(rows):
        return False
    name = lookup_policy(state.policies, stored.info.policy).name
    if name.kind != "node":
        return False
    delta, v = live_ops.view(state, req)
    offsets = rows - stored.info.part_rows
    ids = state.book.num_nodes + offsets
    if delta is None or not delta.nodes_at(ids, v).all():
        return False
    types = state.book.node_types
    if len(types) > 1 and name.type in types:  # a heterograph's table of one node type
        got = delta.node_types_of(ids)
        bad = np.flatnonzero(got != types.index(name.type))
        if len(bad):
            i = int(bad[0])
            raise ArgumentError(f"{req.op} {stored.info.name!r}: id {int(ids[i])} is not a node "
                                f"of type {name.type!r} (a new {types[got[i]]!r})")  # fmt: skip
    _blocks(stored, np.unique(offsets // GROWTH_BLOCK))
    return True


def take(stored: StoredTensor, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (checked), new nodes' from their blocks."""
    g, n = stored.grown, stored.info.part_rows
    if g is None or not len(rows) or int(rows.max()) < n:
        return stored.take(rows)
    new = rows >= n
    out = np.empty((len(rows), *stored.info.row_shape), stored.array.dtype)
    out[~new] = stored.take(rows[~new])
    out[new] = g.rows[g.index(rows[new] - n)]
    return out


def reduce(
    reducer: Reducer, stored: StoredTensor, rows: np.ndarray, values: np.ndarray,
    states: Sequence[StoredTensor], params: Mapping[str, Any],
) -> None:  # fmt: skip
    """``reducer`` over base rows in the segment and new nodes' rows in their blocks
    (``rows`` checked by :func:`grow`); the states are given the tensor's blocks first
    (and it theirs), so that a row stands at one place in all of them."""
    n = stored.info.part_rows
    new = rows >= n
    if not new.any():
        reducer(stored.array, rows, values, [s.array for s in states], params)
        return
    old = ~new
    if old.any():
        reducer(stored.array, rows[old], values[old], [s.array for s in states], params)
    held = [t.grown.blocks for t in (stored, *states) if t.grown is not None]
    blocks = np.unique(np.concatenate(held)) if held else np.empty(0, np.int64)
    g, grown = _blocks(stored, blocks), [_blocks(s, blocks).rows for s in states]
    reducer(g.rows, g.index(rows[new] - n), values[new], grown, params)
