"""Torch views of a partitioned graph: shared arrays as tensors, the book's type map.

(A partition's CSC is :func:`graphrun.sampling.csc.csc_from_structure`: numpy only,
for the store servers.)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from graphrun.names import CanonicalEtype
from graphrun.partition.book import PartitionBook


def shared_tensor(arr: np.ndarray) -> Tensor:
    """A tensor over ``arr``'s memory, even when it is read-only (we never write to it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable array"
        return torch.from_numpy(np.asarray(arr))


@dataclass(frozen=True)
class BookTypeMap:
    """:class:`~graphrun.sampling.pyg.TypeMap` over a partition book's new ids."""

    book: PartitionBook

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.book.node_types)

    @property
    def edge_types(self) -> tuple[tuple[str, str, str], ...]:
        return self.book.edge_types  # tuples: the book made them so

    def nodes_per_type(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        t, p = self.book.to_per_type(ids.numpy())
        return torch.from_numpy(t).long(), torch.from_numpy(p)

    def edges_per_type(self, ids: Tensor, known: Tensor | None = None) -> tuple[Tensor, Tensor]:
        t, p = self.book.eid_to_per_type(ids.numpy())
        return torch.from_numpy(t).long(), torch.from_numpy(p)

    def to_homo(self, ntype: str, ids: np.ndarray) -> np.ndarray:
        """Homogeneous ids of per-type node ids of ``ntype``."""
        return self.book.to_homo(ntype, ids)

    def etype_to_homo(self, etype: CanonicalEtype | str, ids: np.ndarray) -> np.ndarray:
        """Homogeneous ids of per-type edge ids of ``etype``."""
        return self.book.etype_to_homo(etype, ids)
