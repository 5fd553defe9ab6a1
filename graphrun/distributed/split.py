"""Splitting training ids over trainers: local ids first, the same count on every trainer.

Every trainer computes the whole assignment from the same inputs (no
communication), so the result is consistent and deterministic:

1. ids are sorted and grouped by owner partition (partition book);
2. trainer ``r``'s home partition is ``trainer_parts[r]`` (default
   ``r * num_parts // world_size``: the launcher places trainers that way);
3. each partition's ids are dealt to the trainers at home there, up to a common
   quota each; what is left (and partitions with no trainer) forms a pool;
4. trainers below the quota take from the pool, in rank order;
5. ``mode="pad"`` (default): quota = ``ceil(n / world_size)`` and a trainer still
   short (only possible when ``n`` does not divide evenly) repeats its own first ids;
   ``mode="trim"``: quota = ``n // world_size`` and the < ``world_size`` ids left over
   are dropped; ``mode="cover"``: quota = ``ceil(n / world_size)``, no padding, so
   every id goes to exactly one trainer (layer-wise inference: no collective runs
   between its batches, so counts may differ by one).

With ``pad`` and ``trim`` every trainer gets exactly ``quota`` ids, hence the same
number of mini-batches for any batch size: DDP never waits on a trainer that ran out
of batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError
from graphrun.names import home_partition
from graphrun.partition.book import PartitionBook

__all__ = [
    "edge_split",
    "foreign",
    "home_partition",
    "node_split",
    "split_even",
    "trainer_partitions",
]

Mode = Literal["pad", "trim", "cover"]


def trainer_partitions(world_size: int, num_parts: int) -> list[int]:
    """Default home partition of every trainer rank."""
    return [home_partition(r, world_size, num_parts) for r in range(world_size)]


def _as_ids(ids_or_mask: Any, arg: str) -> np.ndarray:
    arr = ids_or_mask.numpy() if isinstance(ids_or_mask, Tensor) else np.asarray(ids_or_mask)
    if arr.ndim != 1:
        raise ArgumentError(f"{arg}: expected a 1-d mask or id array, got shape {arr.shape}")
    if arr.dtype == bool:
        return np.flatnonzero(arr).astype(np.int64)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ArgumentError(f"{arg}: expected a boolean mask or integer ids, got {arr.dtype}")
    return np.unique(arr.astype(np.int64))


def split_even(
    ids: np.ndarray,
    owner: np.ndarray,
    num_parts: int,
    world_size: int,
    trainer_parts: Sequence[int],
    mode: Mode = "pad",
) -> list[np.ndarray]:
    """The ids of every trainer (pure; see the module docstring)."""
    if mode not in ("pad", "trim", "cover"):
        raise ArgumentError(f"mode: expected 'pad', 'trim' or 'cover', got {mode!r}")
    if len(trainer_parts) != world_size:
        raise ArgumentError(
            f"trainer_parts: {len(trainer_parts)} entries for {world_size} trainers"
        )
    n = len(ids)
    quota = n // world_size if mode == "trim" else -(-n // world_size)
    assigned: list[list[np.ndarray]] = [[] for _ in range(world_size)]
    pool: list[np.ndarray] = []
    for p in range(num_parts):
        mine = ids[owner == p]
        home = [r for r in range(world_size) if trainer_parts[r] == p]
        if not home:
            pool.append(mine)
            continue
        take = min(len(mine), quota * len(home))
        for r, chunk in zip(home, np.array_split(mine[:take], len(home)), strict=True):
            assigned[r].append(chunk)
        pool.append(mine[take:])
    rest = np.concatenate(pool) if pool else np.empty(0, np.int64)
    out = []
    for r in range(world_size):
        got = np.concatenate(assigned[r]) if assigned[r] else np.empty(0, np.int64)
        need = quota - len(got)
        if need > 0:
            got, rest = np.concatenate([got, rest[:need]]), rest[need:]
        need = quota - len(got)
        if need > 0 and mode == "pad":  # repeat this trainer's own ids (or any ids if it has none)
            src = got if len(got) else ids
            got = np.concatenate([got, np.resize(src, need)])
        out.append(got.astype(np.int64))
    return out


def _split(
    ids_or_mask: Any,
    arg: str,
    to_part: Callable[[np.ndarray], np.ndarray],
    book: PartitionBook,
    rank: int,
    world_size: int,
    trainer_parts: Sequence[int] | None,
    mode: Mode,
) -> Tensor:
    if not 0 <= rank < world_size:
        raise ArgumentError(f"rank: {rank} is not in [0, {world_size})")
    ids = _as_ids(ids_or_mask, arg)
    owner = to_part(ids)
    parts = trainer_parts or trainer_partitions(world_size, book.num_parts)
    split = split_even(ids, owner, book.num_parts, world_size, parts, mode)
    return torch.from_numpy(split[rank])


def node_split(
    nodes: Any,
    book: PartitionBook,
    rank: int,
    world_size: int,
    *,
    ntype: str | None = None,
    trainer_parts: Sequence[int] | None = None,
    mode: Mode = "pad",
) -> Tensor:
    """This trainer's share of ``nodes`` (a boolean mask or ids; per-type ids with ``ntype``)."""
    return _split(
        nodes,
        "nodes",
        lambda ids: book.nid2part(ids, ntype),
        book,
        rank,
        world_size,
        trainer_parts,
        mode,
    )


def edge_split(
    edges: Any,
    book: PartitionBook,
    rank: int,
    world_size: int,
    *,
    etype: tuple[str, str, str] | str | None = None,
    trainer_parts: Sequence[int] | None = None,
    mode: Mode = "pad",
) -> Tensor:
    """This trainer's share of ``edges`` (a boolean mask or edge ids; per-type with ``etype``)."""
    return _split(
        edges,
        "edges",
        lambda ids: book.eid2part(ids, etype),
        book,
        rank,
        world_size,
        trainer_parts,
        mode,
    )


def foreign(ids: Tensor, book: PartitionBook, home: int, ntype: str | None = None) -> Tensor:
    """Which of ``ids`` partition ``home`` does not own, as a mask: the seeds of a trainer
    at home there whose first hop another machine samples. ``node_split`` deals a
    trainer some when its partition holds fewer training nodes than the equal share
    (pl200k: 40 of trainer 0's 10,000); a loader deals them last
    (:func:`~graphrun.distributed.minibatch.shuffled`)."""
    if not 0 <= home < book.num_parts:
        raise ArgumentError(f"home: partition {home} is not in [0, {book.num_parts})")
    return torch.from_numpy(book.nid2part(ids.numpy(), ntype) != home)
