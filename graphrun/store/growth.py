"""A tensor's rows of a live graph's new nodes, by growth block, and the initialisers
that fill a tensor's rows (used by :mod:`graphrun.store.live_rows` and the ``init`` op;
here, below :mod:`graphrun.store.state`, which holds the rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.store.live import GROWTH_BLOCK

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
