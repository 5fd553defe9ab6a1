"""Partition policies: which partition owns a row of a tensor, and which local row it is.

Each node type and each edge type is one id space (per-type new ids, see
:mod:`graphrun.partition.book`); partition ``p`` owns the contiguous rows
``[ranges[p], ranges[p+1])`` of every tensor with that policy. A policy is named by a
:class:`~graphrun.names.PolicyName` (``node:<ntype>``, ``edge:<src:rel:dst>``); the
graph's features are the tensors named by a :class:`~graphrun.names.TensorKey`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.names import PolicyName, owners
from graphrun.partition.book import PartitionBook, check_ids


@dataclass(frozen=True, eq=False)
class PartitionPolicy:
    """Row ownership for one id space. ``ranges`` is int64 [P+1]."""

    name: PolicyName
    ranges: np.ndarray

    @property
    def num_parts(self) -> int:
        return len(self.ranges) - 1

    @property
    def num_rows(self) -> int:
        return int(self.ranges[-1])

    def part_rows(self, part: int) -> int:
        return int(self.ranges[part + 1] - self.ranges[part])

    def check_ids(self, ids: Any, arg: str = "ids") -> np.ndarray:
        """``ids`` as a 1-d int64 array, every id in ``[0, num_rows)``."""
        return check_ids(np.asarray(ids).reshape(-1), arg, self.num_rows, str(self.name))

    def to_part(self, ids: np.ndarray) -> np.ndarray:
        """Owner partition of each (already checked) id."""
        if self.num_parts == 1:
            return np.zeros(len(ids), np.int64)
        return owners(self.ranges, ids)

    def to_local(self, ids: np.ndarray, part: int) -> np.ndarray:
        """Local rows of ids all owned by ``part``."""
        start = int(self.ranges[part])
        return ids - start if start else ids


def policies_from_book(book: PartitionBook) -> dict[PolicyName, PartitionPolicy]:
    """One policy per node type and edge type of ``book``."""
    out = {}
    for t in book.node_types:
        name = PolicyName.node(t)
        out[name] = PartitionPolicy(name, np.asarray(book.node_ranges(t), np.int64))
    for e in book.edge_types:
        name = PolicyName.edge(e)
        out[name] = PartitionPolicy(name, np.asarray(book.edge_ranges(e), np.int64))
    return out


def lookup_policy(
    policies: Mapping[PolicyName, PartitionPolicy], name: PolicyName | str
) -> PartitionPolicy:
    """The policy named ``name`` (its string, as the wire and ``init_tensor`` give it, is
    parsed here); an ArgumentError naming it and the known ones otherwise."""
    key = name if isinstance(name, PolicyName) else PolicyName.parse(name)
    try:
        return policies[key]
    except KeyError:
        known = sorted(str(p) for p in policies)
        raise ArgumentError(f"policy: unknown {str(name)!r}; known: {known}") from None
