"""Graph data: the in-memory graph, the dataset directory format, importers, generators."""

from graphrun.graph.format import is_dataset_dir, load_dataset, load_id_maps, save_dataset
from graphrun.graph.generate import GenParams, academic, community
from graphrun.graph.graph import DEFAULT_ETYPE, DEFAULT_NTYPE, Graph
from graphrun.graph.importers import Imported, detect_format, import_graph, load_graph
from graphrun.graph.pyg import from_pyg, to_pyg
from graphrun.names import CanonicalEtype, etype_key, parse_etype_key

__all__ = [
    "DEFAULT_ETYPE",
    "DEFAULT_NTYPE",
    "CanonicalEtype",
    "GenParams",
    "Graph",
    "Imported",
    "academic",
    "community",
    "detect_format",
    "etype_key",
    "from_pyg",
    "import_graph",
    "is_dataset_dir",
    "load_dataset",
    "load_graph",
    "load_id_maps",
    "parse_etype_key",
    "save_dataset",
    "to_pyg",
]
