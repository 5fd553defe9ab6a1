"""Sampling structures of a partitioned graph: a partition's CSC and the book's type map.

A partition (directory format v1, or the store's shared-memory copy of it) holds
the CSC of its local nodes with global source and edge ids; the owned nodes come
first and are the contiguous new ids ``book.owned_nodes(part)``. Its in-edges are
already grouped by edge type inside every row (the writer orders them by edge id,
and edge ids are grouped by type), so building a :class:`CSCGraph` over them copies
nothing: the arrays stay memory-mapped / in shared memory.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError
from graphrun.graph.graph import etype_key
from graphrun.partition.book import PartitionBook
from graphrun.sampling.csc import CSCGraph


def shared_tensor(arr: np.ndarray) -> Tensor:
    """A tensor over ``arr``'s memory, even when it is read-only (we never write to it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable array"
        return torch.from_numpy(np.asarray(arr))


def csc_from_structure(
    structure: Mapping[str, np.ndarray],
    book: PartitionBook,
    part: int,
    weights: np.ndarray | None = None,
) -> CSCGraph:
    """The owned rows of partition ``part`` (``indptr``/``indices``/``eids``[/``etypes``])."""
    for key in ("indptr", "indices", "eids"):
        if key not in structure:
            raise ArgumentError(f"structure: array {key!r} of partition {part} is missing")
    lo, hi = book.owned_nodes(part)
    etypes = structure.get("etypes")
    return CSCGraph(
        shared_tensor(structure["indptr"]),
        shared_tensor(structure["indices"]),
        shared_tensor(structure["eids"]),
        etypes=None if etypes is None else shared_tensor(etypes),
        num_etypes=len(book.edge_types),
        row_start=lo,
        num_rows=hi - lo,
        weights=weights,
    )


def edge_weights_by_position(
    book: PartitionBook,
    part: int,
    eids: np.ndarray,
    features: Mapping[str, np.ndarray],
    name: str,
) -> np.ndarray:
    """Edge feature ``name`` (owned-edge rows per edge type) aligned with a CSC's ``eids``."""
    et, per_type = book.eid_to_per_type(eids)
    out = np.zeros(len(eids), dtype=np.float64)
    for r, etype in enumerate(book.edge_types):
        key = etype_key(etype)
        mask = et == r
        if not mask.any():
            continue
        if key not in features:
            raise ArgumentError(f"weight: edge type {key} has no edge feature {name!r}")
        start = int(book.edge_ranges(etype)[part])
        out[mask] = np.asarray(features[key])[per_type[mask] - start]
    return out


def owned_edge_weights(
    book: PartitionBook,
    part: int,
    structure: Mapping[str, np.ndarray],
    name: str,
    owned_rows: Callable[[str, int, int], np.ndarray],
) -> np.ndarray:
    """Edge feature ``name`` aligned with partition ``part``'s CSC (its owned rows).

    ``owned_rows(etype_key, lo, hi)`` gives the feature's rows ``[lo, hi)`` of one edge
    type: the edges of that type the partition owns (a server reads its own shared
    memory, a client pulls them)."""
    feats = {}
    for et in book.edge_types:
        lo, hi = book.edge_ranges(et)[part : part + 2]
        feats[etype_key(et)] = owned_rows(etype_key(et), int(lo), int(hi))
    lo_n, hi_n = book.owned_nodes(part)
    n_inner = int(structure["indptr"][hi_n - lo_n])
    eids = np.asarray(structure["eids"][:n_inner])
    return edge_weights_by_position(book, part, eids, feats, name)


@dataclass(frozen=True)
class BookTypeMap:
    """:class:`~graphrun.sampling.pyg.TypeMap` over a partition book's new ids."""

    book: PartitionBook

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.book.node_types)

    @property
    def edge_types(self) -> tuple[tuple[str, str, str], ...]:
        return tuple(tuple(e) for e in self.book.edge_types)  # type: ignore[misc]

    def nodes_per_type(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        t, p = self.book.to_per_type(ids.numpy())
        return torch.from_numpy(t).long(), torch.from_numpy(p)

    def edges_per_type(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        t, p = self.book.eid_to_per_type(ids.numpy())
        return torch.from_numpy(t).long(), torch.from_numpy(p)
