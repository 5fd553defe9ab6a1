"""Mini-batch samplers: seeds → sampled subgraph → PyG mini-batch.

Composition, not flags: :class:`NeighborSampler` takes any one-hop sampler (a
local :class:`~graphrun.sampling.csc.CSCGraph` or the distributed sampler), the
fanouts and a :class:`~graphrun.sampling.pyg.TypeMap`; :func:`collate` turns its
output into ``Data``/``HeteroData`` with features from any :class:`FeatureSource`
(a local :class:`GraphFeatures` or DistTensors in :mod:`graphrun.distributed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from graphrun.errors import ArgumentError
from graphrun.graph.graph import Graph
from graphrun.sampling.csc import check_seeds
from graphrun.sampling.fanout import FanoutSpec, normalize_fanouts
from graphrun.sampling.mfg import (
    OneHopSampler,
    Relabeler,
    RelabelOrder,
    SampledSubgraph,
    Seed,
    make_generator,
    sample_multi_hop,
)
from graphrun.sampling.partitioned import shared_tensor
from graphrun.sampling.pyg import TypeMap, split_by_type, to_data, to_hetero_data

Output = Literal["data", "hetero", "typed"]


class NeighborSampler:
    """Multi-layer neighbour sampling over a one-hop sampler (see module docstring).

    ``num_layers``, when given, must equal the number of fanout layers (a model
    with that many message-passing layers). ``generator`` is an int seed, a torch
    or numpy generator, or None (fresh entropy); it is the only source of randomness.
    ``order``: each hop's new nodes by global id or as the hop first reads them
    (:class:`~graphrun.sampling.mfg.Relabeler`).
    """

    def __init__(
        self,
        graph: OneHopSampler,
        types: TypeMap,
        num_nodes: int,
        fanouts: FanoutSpec,
        *,
        num_layers: int | None = None,
        replace: bool = False,
        weighted: bool = False,
        generator: Seed = None,
        order: RelabelOrder = "id",
    ) -> None:
        self.graph = graph
        self.types = types
        self.num_nodes = int(num_nodes)
        self.fanouts = normalize_fanouts(fanouts, types.edge_types, num_layers)
        self.replace = replace
        self.weighted = weighted
        self.generator = make_generator(generator)
        self._relabeler = Relabeler(self.num_nodes, order)

    def sample(
        self, seeds: Tensor | np.ndarray | Sequence[int], generator: Seed = None
    ) -> SampledSubgraph:
        """Sample from unique global seed ids; ArgumentError on ids out of range.

        ``generator`` (optional) overrides the sampler's own for this call, e.g. one
        seed per mini-batch so that a batch does not depend on who samples it.
        """
        s = shared_tensor(check_seeds(seeds, 0, self.num_nodes))
        return sample_multi_hop(
            self.graph,
            s,
            self.fanouts,
            relabeler=self._relabeler,
            generator=self.generator if generator is None else make_generator(generator),
            replace=self.replace,
            weighted=self.weighted,
        )


class FeatureSource(Protocol):
    def node_feature(self, ntype: str, name: str, ids: Tensor) -> Tensor | None:
        """Rows ``ids`` (per-type ids) of node feature ``name`` of ``ntype``; None if absent."""
        ...


class GraphFeatures:
    """Node features of an in-memory :class:`Graph`.

    ``bf16``: the float32 feature of that name is served in bf16, gathered from a bf16
    copy of its table made at the first read (half the bytes of every batch's gather, and
    no fp32 batch to cast; the rows equal ``x.to(torch.bfloat16)``). The copy costs two
    bytes a value of memory, once per process (benchmarks/README.md, "bf16 fetch")."""

    def __init__(self, graph: Graph, bf16: str | None = None) -> None:
        self._data = {
            t: {k: shared_tensor(v) for k, v in feats.items()} for t, feats in graph.ndata.items()
        }
        self.bf16 = bf16
        self._bf16: dict[str, Tensor] = {}

    def node_feature(self, ntype: str, name: str, ids: Tensor) -> Tensor | None:
        arr = self._data.get(ntype, {}).get(name)
        if arr is None:
            return None
        if name == self.bf16 and arr.dtype == torch.float32:
            half = self._bf16.get(ntype)
            if half is None:
                half = self._bf16[ntype] = arr.to(torch.bfloat16)
            return half.index_select(0, ids)
        return arr.index_select(0, ids)


def collate(
    sub: SampledSubgraph,
    types: TypeMap,
    features: FeatureSource | None,
    *,
    output: Output = "data",
    x: str = "feat",
    y: str = "label",
) -> Data | HeteroData:
    """A PyG mini-batch of ``sub`` with node features ``x`` and labels ``y`` gathered.

    ``output``: ``"data"`` (homogeneous graphs), ``"hetero"`` (``HeteroData``) or
    ``"typed"`` (homogeneous ``Data`` with type ids; features only when every node
    type has ``x`` of the same width).
    """
    if output == "data":
        if len(types.node_types) != 1:
            raise ArgumentError("output: 'data' needs a homogeneous graph; use 'hetero' or 'typed'")
        nt = types.node_types[0]
        fx = features.node_feature(nt, x, sub.node) if features else None
        fy = features.node_feature(nt, y, sub.node) if features else None
        return to_data(sub, fx, fy)
    split = split_by_type(sub, types)
    per_type: dict[str, dict[str, Tensor]] = {"x": {}, "y": {}}
    for t, name in enumerate(types.node_types):
        ids = split.node_per_type[split.node_type == t]
        for key, fname in (("x", x), ("y", y)):
            got = features.node_feature(name, fname, ids) if features else None
            if got is not None:
                per_type[key][name] = got
    if output == "hetero":
        return to_hetero_data(sub, types, per_type["x"], per_type["y"], split=split)
    if output != "typed":
        raise ArgumentError(f"output: expected 'data', 'hetero' or 'typed', got {output!r}")
    data = to_data(
        sub,
        node_type=split.node_type,
        edge_type=split.edge_type,
        n_id_per_type=split.node_per_type,
        e_id_per_type=split.edge_per_type,
    )
    for key, by_type in per_type.items():
        if by_type and len(by_type) == len(types.node_types):
            first = next(iter(by_type.values()))
            rows = first.new_empty((sub.node.numel(), *first.shape[1:]))
            for t, name in enumerate(types.node_types):
                rows[split.node_type == t] = by_type[name]
            data[key] = rows
    return data
