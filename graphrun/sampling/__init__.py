"""graphrun.sampling: local kernels, multi-layer sampling, PyG mini-batches, negatives.

Public interface::

    CSCGraph(indptr, indices, eids, etypes=..., num_etypes=..., row_start=..., weights=...)
    CSCGraph.from_graph(graph, weight=None).sample_one_hop(seeds, fanout, generator=...)
    NeighborSampler(one_hop, types, num_nodes, fanouts, replace=..., generator=...).sample(seeds)
    collate(subgraph, types, features, output="data" | "hetero" | "typed")
    NegativeSampler(num_nodes, k, mode="uniform" | "degree", degrees=...)
"""

from graphrun.sampling.csc import CSCGraph, SampledEdges
from graphrun.sampling.fanout import normalize_fanouts
from graphrun.sampling.kernels import Picks, make_generator, sample_segments
from graphrun.sampling.mfg import Relabeler, SampledSubgraph, sample_multi_hop
from graphrun.sampling.negative import NegativeSampler
from graphrun.sampling.pyg import OffsetTypeMap, TypeMap, to_data, to_hetero_data, to_typed_data
from graphrun.sampling.sampler import FeatureSource, GraphFeatures, NeighborSampler, collate

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
    "normalize_fanouts",
    "sample_multi_hop",
    "sample_segments",
    "to_data",
    "to_hetero_data",
    "to_typed_data",
]
