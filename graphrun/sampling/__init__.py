"""graphrun.sampling: local kernels, multi-layer sampling, PyG mini-batches, negatives.

Public interface::

    CSCGraph(indptr, indices, eids, etypes=..., num_etypes=..., row_start=..., weights=...)
    CSCGraph.from_graph(graph, weight=None).sample_one_hop(seeds, fanout, seed=...)
    NeighborSampler(one_hop, types, num_nodes, fanouts, replace=..., generator=...).sample(seeds)
    collate(subgraph, types, features, output="data" | "hetero" | "typed")
    NegativeSampler(num_nodes, k, mode="uniform" | "degree", degrees=...)

One hop (``kernels``, ``csc``, the store extension ``server``) is numpy only; the
layers above it (multi-hop sampling, PyG batches, negatives) use torch and PyG.
"""

from typing import TYPE_CHECKING

from graphrun.lazy import lazy_names
from graphrun.sampling.csc import CSCGraph, SampledEdges
from graphrun.sampling.kernels import Picks, make_rng, sample_segments

if TYPE_CHECKING:
    from graphrun.sampling.fanout import normalize_fanouts
    from graphrun.sampling.mfg import (
        Relabeler,
        SampledSubgraph,
        make_generator,
        sample_multi_hop,
    )
    from graphrun.sampling.negative import NegativeSampler
    from graphrun.sampling.pyg import (
        OffsetTypeMap,
        TypeMap,
        to_data,
        to_hetero_data,
        to_typed_data,
    )
    from graphrun.sampling.sampler import FeatureSource, GraphFeatures, NeighborSampler, collate

# The names that need torch or torch_geometric load on first use: a store server
# imports this package for its kernels and needs neither (importing torch is a second
# of CPU; torch_geometric, which imports torch._dynamo, added 2.8 s to its start-up).
_LAZY = {
    **dict.fromkeys(
        ("OffsetTypeMap", "TypeMap", "to_data", "to_hetero_data", "to_typed_data"), "pyg"
    ),
    **dict.fromkeys(("FeatureSource", "GraphFeatures", "NeighborSampler", "collate"), "sampler"),
    **dict.fromkeys(("Relabeler", "SampledSubgraph", "make_generator", "sample_multi_hop"), "mfg"),
    "normalize_fanouts": "fanout",
    "NegativeSampler": "negative",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "CSCGraph",
    "FeatureSource",
    "GraphFeatures",
    "NegativeSampler",
    "NeighborSampler",
    "OffsetTypeMap",
    "Picks",
    "Relabeler",
    "SampledEdges",
    "SampledSubgraph",
    "TypeMap",
    "collate",
    "make_generator",
    "make_rng",
    "normalize_fanouts",
    "sample_multi_hop",
    "sample_segments",
    "to_data",
    "to_hetero_data",
    "to_typed_data",
]
