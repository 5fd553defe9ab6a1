"""A job's node tensors on a live graph: rows for the new nodes (``DistEmbedding``).

A job's tensor with a node policy (a ``DistEmbedding`` and its optimizer's states) is
made with a row per base node of the partition. When the graph grows (issue 42,
docs/live.md), a job that follows it meets new nodes — graph ids ``>= num_nodes``, owned
by growth blocks, at local rows ``part_rows + (id - num_nodes)``
(:func:`~graphrun.store.live.growth_row`) — and looks up and trains their rows. Those
rows are held beside the shared-memory segment, a growth block at a time
(:class:`GrowthRows`, on the :class:`~graphrun.store.state.StoredTensor`), made on first
use by a request at a version where the node exists (a client that does not follow the
graph, or a request at a version below the node's, is refused as before) and filled by
the tensor's initialiser with a generator of the block's own (``[seed, 1 + block]``),
so a new node's first value does not depend on which server, replica or request made
it. They are read and written by the main server only (a following client's requests
go there: :mod:`graphrun.store.live_client`); the segment keeps the base rows, so
co-located clients still read those from shared memory. Bound: the rows of the new
nodes visible on this partition, whose count the delta's bound bounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.store import live_ops
from graphrun.store.live import GROWTH_BLOCK
from graphrun.store.policy import lookup_policy
from graphrun.store.reducers import Reducer

if TYPE_CHECKING:
    from graphrun.store.registry import Request
    from graphrun.store.state import ServerState, StoredTensor

INITIALIZERS = ("zeros", "uniform", "normal")


def fill(arr: np.ndarray, how: str, args: Mapping[str, Any], key: Sequence[int]) -> None:
    """``arr`` drawn by initialiser ``how`` from a generator of ``[seed, *key]``."""
    if how == "zeros" or arr.size == 0:
        return
    seed = args.get("seed", 0)
    if not isinstance(seed, int):
        raise ArgumentError("init: init_args.seed must be an integer")
    rng = np.random.default_rng([seed, *key])
    if how == "uniform":
        lo, hi = float(args.get("low", -1.0)), float(args.get("high", 1.0))
        arr[...] = rng.uniform(lo, hi, arr.shape)
    elif how == "normal":
        arr[...] = rng.normal(float(args.get("mean", 0.0)), float(args.get("std", 1.0)), arr.shape)
    else:
        raise ArgumentError(f"init: initializer {how!r} is unknown; known: {list(INITIALIZERS)}")


class GrowthRows:
    """One tensor's rows of new nodes on one partition, by growth block (in block order,
    so that two tensors holding the same blocks hold each row at the same place)."""

    def __init__(self, row_shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.rows: np.ndarray = np.empty((0, *row_shape), dtype)
        self.blocks = np.empty(0, np.int64)  # sorted

    def index(self, offsets: np.ndarray) -> np.ndarray:
        """Where growth offsets (``id - num_nodes``) of held blocks stand in ``rows``."""
        at = np.searchsorted(self.blocks, offsets // GROWTH_BLOCK)
        return at * GROWTH_BLOCK + offsets % GROWTH_BLOCK

    def ensure(self, blocks: np.ndarray, how: str, args: Mapping[str, Any]) -> None:
        """Hold ``blocks`` too, each new one filled by initialiser ``how``."""
        for b in np.setdiff1d(blocks, self.blocks).tolist():
            new = np.zeros((GROWTH_BLOCK, *self.rows.shape[1:]), self.rows.dtype)
            fill(new, how, args, [1 + b])
            at = int(np.searchsorted(self.blocks, b)) * GROWTH_BLOCK
            self.rows = np.concatenate([self.rows[:at], new, self.rows[at:]])
            self.blocks = np.insert(self.blocks, at // GROWTH_BLOCK, b)


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
    if lookup_policy(state.policies, stored.info.policy).name.kind != "node":
        return False
    delta, v = live_ops.view(state, req)
    offsets = rows - stored.info.part_rows
    if delta is None or not delta.nodes_at(state.book.num_nodes + offsets, v).all():
        return False
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
