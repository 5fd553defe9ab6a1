"""``from graphrun.distributed import dgl``: DistDGL's namespaces over graphrun.

A DistDGL script keeps its ``dgl.distributed.X`` and ``dgl.dataloading.NeighborSampler``
calls: ``dgl.distributed`` is :mod:`graphrun.distributed` (DistDGL's names, see
:mod:`graphrun.distributed.dglnames` and docs/porting.md) and ``dgl.dataloading`` holds
``NeighborSampler``. Nothing else of DGL is here: blocks and ``dgl.nn`` have no
counterpart (models move to PyG layers).
"""

from __future__ import annotations

from types import SimpleNamespace

import graphrun.distributed as distributed
from graphrun.distributed.dglnames import NeighborSampler

dataloading = SimpleNamespace(NeighborSampler=NeighborSampler)

__all__ = ["dataloading", "distributed"]
