"""Partition policies: which partition owns a row of a tensor, and which local row it is.

Each node type and each edge type is one id space (per-type new ids, see
:mod:`graphrun.partition.book`); partition ``p`` owns the contiguous rows
``[ranges[p], ranges[p+1])`` of every tensor with that policy. Policy names are
``"node:<ntype>"`` and ``"edge:<src:rel:dst>"``; the graph's features are the tensors
named by a :class:`TensorKey`, ``node/<ntype>/<name>`` and ``edge/<src:rel:dst>/<name>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.graph.graph import etype_key
from graphrun.partition.book import PartitionBook, check_ids


@dataclass(frozen=True, eq=False)
class PartitionPolicy:
    """Row ownership for one id space. ``ranges`` is int64 [P+1]."""

    name: str
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
        return check_ids(np.asarray(ids).reshape(-1), arg, self.num_rows, self.name)

    def to_part(self, ids: np.ndarray) -> np.ndarray:
        """Owner partition of each (already checked) id."""
        if self.num_parts == 1:
            return np.zeros(len(ids), np.int64)
        return np.searchsorted(self.ranges, ids, side="right").astype(np.int64) - 1

    def to_local(self, ids: np.ndarray, part: int) -> np.ndarray:
        """Local rows of ids all owned by ``part``."""
        start = int(self.ranges[part])
        return ids - start if start else ids


@dataclass(frozen=True)
class TensorKey:
    """The store name of one graph feature: ``node/<ntype>/<name>`` or
    ``edge/<src:rel:dst>/<name>`` (str() formats it, :meth:`parse` reads it)."""

    kind: Literal["node", "edge"]
    type: str  # a node type, or an edge type's "src:rel:dst" key
    name: str

    @classmethod
    def node(cls, ntype: str, name: str) -> TensorKey:
        return cls("node", ntype, name)

    @classmethod
    def edge(cls, etype: str | Sequence[str], name: str) -> TensorKey:
        return cls("edge", etype if isinstance(etype, str) else etype_key(etype), name)

    @classmethod
    def parse(cls, text: str) -> TensorKey | None:
        """The key of a graph feature's tensor name; None for any other tensor."""
        kind, _, rest = text.partition("/")
        type_, _, name = rest.rpartition("/")
        if kind not in ("node", "edge") or not type_ or not name:
            return None
        return cls(kind, type_, name)  # type: ignore[arg-type]

    @property
    def policy(self) -> str:
        return f"{self.kind}:{self.type}"

    def __str__(self) -> str:
        return f"{self.kind}/{self.type}/{self.name}"


def node_policy_name(ntype: str) -> str:
    return f"node:{ntype}"


def edge_policy_name(etype: str | tuple[str, str, str]) -> str:
    return "edge:" + (etype if isinstance(etype, str) else etype_key(etype))


def policies_from_book(book: PartitionBook) -> dict[str, PartitionPolicy]:
    """One policy per node type and edge type of ``book``."""
    out = {}
    for t in book.node_types:
        name = node_policy_name(t)
        out[name] = PartitionPolicy(name, np.asarray(book.node_ranges(t), np.int64))
    for e in book.edge_types:
        name = edge_policy_name(e)
        out[name] = PartitionPolicy(name, np.asarray(book.edge_ranges(e), np.int64))
    return out


def lookup_policy(policies: dict[str, PartitionPolicy], name: str) -> PartitionPolicy:
    try:
        return policies[name]
    except KeyError:
        raise ArgumentError(f"policy: unknown {name!r}; known: {sorted(policies)}") from None
