"""Fanouts: the number of neighbours to sample per layer (and per edge type).

Accepted spellings, normalised by :func:`normalize_fanouts` into one int64 tensor
per layer holding one fanout per edge type (in the graph's edge-type order):

* ``[25, 10]`` — every edge type gets the same fanout on a layer;
* ``[{"author:writes:paper": 5, ("paper", "cites", "paper"): 3}, {...}]`` — per
  layer, per edge type (types left out get 0);
* ``{"author:writes:paper": [5, 2], ...}`` — PyG's ``num_neighbors`` dict.

Edge types may be named by their canonical triple, ``"src:rel:dst"`` or a
relation name that is unique among the graph's edge types. Fanouts are
non-negative ints, or -1 for every neighbour (PyG's spelling; normalised to
:data:`ALL`); 0 samples nothing on that layer/type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from graphrun.errors import ArgumentError
from graphrun.names import CanonicalEtype, resolve_etype

#: Every neighbour: a fanout no degree reaches (what -1 normalises to).
ALL = 2**31 - 1

FanoutSpec = Sequence[int | Mapping[Any, int]] | Mapping[Any, Sequence[int]]


def _check_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentError(f"{where}: expected an int, got {value!r}")
    if value == -1:
        return ALL
    if value < 0:
        raise ArgumentError(f"{where}: must be >= 0 or -1 (every neighbour), got {value}")
    return value


def normalize_fanouts(
    fanouts: FanoutSpec,
    edge_types: Sequence[CanonicalEtype],
    num_layers: int | None = None,
    arg: str = "fanouts",
) -> list[Tensor]:
    """One int64 tensor ``[num_edge_types]`` per layer; raises ArgumentError on bad input."""
    num_r = len(edge_types)
    if isinstance(fanouts, Mapping):
        if not fanouts:
            raise ArgumentError(f"{arg}: empty")
        lengths = {len(v) for v in fanouts.values()}
        if len(lengths) != 1:
            raise ArgumentError(f"{arg}: every edge type needs the same number of layers")
        layers = [{k: v[i] for k, v in fanouts.items()} for i in range(lengths.pop())]
        return normalize_fanouts(layers, edge_types, num_layers, arg)
    if isinstance(fanouts, str | bytes) or not isinstance(fanouts, Sequence):
        raise ArgumentError(f"{arg}: expected a list of ints or dicts, got {fanouts!r}")
    if len(fanouts) == 0:
        raise ArgumentError(f"{arg}: empty (need one fanout per layer)")
    if num_layers is not None and len(fanouts) != num_layers:
        raise ArgumentError(
            f"{arg}: {len(fanouts)} layers given but the model has {num_layers} layers"
        )
    out = []
    for layer, f in enumerate(fanouts):
        vec = torch.zeros(num_r, dtype=torch.long)
        if isinstance(f, Mapping):
            for et, k in f.items():
                idx = resolve_etype(et, edge_types, arg)
                vec[idx] = _check_int(k, f"{arg}[{layer}][{et!r}]")
        else:
            vec[:] = _check_int(f, f"{arg}[{layer}]")
        out.append(vec)
    return out
