"""Graph data: the in-memory graph, the dataset directory format, importers, generators."""

from graphrun.graph.format import is_dataset_dir, load_dataset, save_dataset
from graphrun.graph.graph import (
    DEFAULT_ETYPE,
    DEFAULT_NTYPE,
    CanonicalEtype,
    Graph,
    etype_key,
    parse_etype_key,
)

__all__ = [
    "DEFAULT_ETYPE",
    "DEFAULT_NTYPE",
    "CanonicalEtype",
    "Graph",
    "etype_key",
    "is_dataset_dir",
    "load_dataset",
    "parse_etype_key",
    "save_dataset",
]
