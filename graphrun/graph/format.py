"""The dataset directory format (version 1).

A dataset is a directory::

    DATASET/
      graph.json                      metadata, see below
      src.npy  dst.npy                int64 edge endpoints (global node ids), edges
                                      grouped by edge type in ``edge_types`` order
      node/<ntype>/<name>.npy         node features, rows in per-type id order
      edge/<src:rel:dst>/<name>.npy   edge features, rows in per-type id order
      ids/<ntype>.npy                 optional: original id of every node of that type
                                      (int64 or fixed-width unicode), written by importers

``graph.json``::

    {"format": "graphrun-dataset", "version": 1, "name": "...",
     "num_nodes": N, "num_edges": E,
     "node_types": [{"name": "paper", "count": 10}, ...],   # in global id order
     "edge_types": [{"src": "author", "rel": "writes", "dst": "paper", "count": 7}, ...],
     "node_features": {"paper": {"feat": {"dtype": "float32", "shape": [10, 16]}}},
     "edge_features": {"author:writes:paper": {...}},
     "id_maps": {"paper": {"dtype": "int64"}}}          # optional, see ids/ above

The file's fields are declared once, as :class:`GraphMeta` (a msgspec ``Struct``):
:func:`save_dataset` writes one, :func:`read_meta` reads and checks one (its header by
:func:`graphrun.wire.check_header`). Every ``.npy`` is memory-mapped on load, so a
graph larger than memory can be partitioned. The directory is written to a staging
directory beside it and renamed when complete (:func:`graphrun.files.atomic_dir`): a
crash never leaves a half-written dataset behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec
import numpy as np

from graphrun.errors import DatasetError, UserError
from graphrun.files import atomic_dir, dir_is_free, write_failed
from graphrun.graph.graph import Graph
from graphrun.names import etype_key, parse_etype_key
from graphrun.wire import Header, read_file, write_json

FORMAT = "graphrun-dataset"
VERSION = 1
META_FILE = "graph.json"


def _count(name: str, n: int) -> None:
    if n < 0:
        raise ValueError(f"{name}: must be >= 0, got {n}")


class NodeTypeInfo(msgspec.Struct):
    """A node type and how many nodes it has (``node_types``, in global id order)."""

    name: str
    count: int

    def __post_init__(self) -> None:
        _count("count", self.count)


class EdgeTypeInfo(msgspec.Struct):
    """An edge type ``(src, rel, dst)`` and how many edges it has."""

    src: str
    rel: str
    dst: str
    count: int

    def __post_init__(self) -> None:
        _count("count", self.count)


class FeatureInfo(msgspec.Struct):
    """One feature column: its dtype and its shape (rows first)."""

    dtype: str
    shape: list[int]


class IdMapInfo(msgspec.Struct):
    """The dtype of an importer's raw ids of one node type (``ids/<ntype>.npy``)."""

    dtype: str


Schema = dict[str, dict[str, FeatureInfo]]  # {type: {feature: info}}


class GraphFields(Header, kw_only=True):
    """The fields of ``graph.json`` that describe the graph; shared with the chunked
    format's ``chunks.json`` (:mod:`graphrun.graph.chunked`). Declaration order is the
    order written."""

    name: str | None = None
    num_nodes: int
    num_edges: int
    node_types: list[NodeTypeInfo]
    edge_types: list[EdgeTypeInfo]
    node_features: Schema = msgspec.field(default_factory=dict)
    edge_features: Schema = msgspec.field(default_factory=dict)
    id_maps: dict[str, IdMapInfo] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        _count("num_nodes", self.num_nodes)
        _count("num_edges", self.num_edges)


class GraphMeta(GraphFields, kw_only=True):
    """``graph.json`` of a dataset directory (the layout in the module docstring)."""


def feature_schema(data: dict[str, dict[str, np.ndarray]]) -> Schema:
    """``{type: {name: FeatureInfo}}`` of non-empty feature groups."""
    return {
        key: {name: FeatureInfo(str(a.dtype), list(a.shape)) for name, a in feats.items()}
        for key, feats in data.items()
        if feats
    }


def ensure_free(final: str | Path) -> None:
    """Raise unless ``final`` can be created (absent, or an empty directory): checked
    before minutes of work, and again by :func:`graphrun.files.atomic_dir`."""
    if not dir_is_free(final):
        raise DatasetError(f"{final}: already exists and is not empty")


def describe_graph(graph: Graph, id_maps: Mapping[str, np.ndarray]) -> GraphMeta:
    """``graph.json`` of ``graph``: name, counts, node and edge types with their counts,
    feature schemas, id-map dtypes (the chunked format's metadata starts from it)."""
    return GraphMeta(
        FORMAT,
        VERSION,
        name=graph.name,
        num_nodes=int(graph.num_nodes),
        num_edges=int(graph.num_edges),
        node_types=[NodeTypeInfo(t, graph.num_nodes_of(t)) for t in graph.node_types],
        edge_types=[EdgeTypeInfo(*e, graph.num_edges_of(e)) for e in graph.edge_types],
        node_features=feature_schema(graph.ndata),
        edge_features=feature_schema(graph.edata),
        id_maps={t: IdMapInfo(str(ids.dtype)) for t, ids in id_maps.items()},
    )


def read_types(
    meta: GraphFields,
) -> tuple[tuple[str, ...], np.ndarray, tuple[tuple[str, str, str], ...], np.ndarray]:
    """``(node_types, node_type_offsets, edge_types, edge_type_offsets)`` of the
    metadata's ``node_types``/``edge_types`` lists."""
    node_types = tuple(t.name for t in meta.node_types)
    edge_types = tuple((e.src, e.rel, e.dst) for e in meta.edge_types)
    ncounts = [t.count for t in meta.node_types]
    ecounts = [e.count for e in meta.edge_types]
    node_offsets = np.concatenate([[0], np.cumsum(ncounts)]).astype(np.int64)
    edge_offsets = np.concatenate([[0], np.cumsum(ecounts)]).astype(np.int64)
    return node_types, node_offsets, edge_types, edge_offsets


def save_dataset(
    graph: Graph, path: str | Path, id_maps: Mapping[str, np.ndarray] | None = None
) -> Path:
    """Write ``graph`` as a dataset directory at ``path`` (atomically).

    ``id_maps[ntype][i]`` is the original (pre-import) id of the node of type ``ntype``
    with per-type id ``i``; it is stored under ``ids/`` and read by :func:`load_id_maps`.
    """
    final = Path(path)
    id_maps = dict(id_maps or {})
    for ntype, ids in id_maps.items():
        _check_id_map(graph, ntype, ids)
    try:
        with atomic_dir(final, DatasetError) as tmp:
            for ntype, ids in id_maps.items():
                (tmp / "ids").mkdir(exist_ok=True)
                np.save(tmp / "ids" / f"{ntype}.npy", np.ascontiguousarray(ids), allow_pickle=False)
            np.save(tmp / "src.npy", np.ascontiguousarray(graph.src))
            np.save(tmp / "dst.npy", np.ascontiguousarray(graph.dst))
            for kind, data in (("node", graph.ndata), ("edge", graph.edata)):
                for key, feats in data.items():
                    d = tmp / kind / key
                    d.mkdir(parents=True, exist_ok=True)
                    for name, arr in feats.items():
                        np.save(d / f"{name}.npy", np.ascontiguousarray(arr))
            write_json(tmp / META_FILE, describe_graph(graph, id_maps))
    except OSError as exc:
        raise write_failed(final, exc) from None
    return final


def _check_id_map(graph: Graph, ntype: str, ids: np.ndarray) -> None:
    n = graph.num_nodes_of(ntype)
    if not isinstance(ids, np.ndarray) or ids.ndim != 1 or len(ids) != n:
        raise DatasetError(f"id_maps[{ntype!r}]: expected a 1-d array of {n} ids")
    if ids.dtype != np.int64 and ids.dtype.kind != "U":
        raise DatasetError(f"id_maps[{ntype!r}]: expected int64 or str ids, got {ids.dtype}")


def load_id_maps(path: str | Path) -> dict[str, np.ndarray]:
    """The original ids stored by an importer: ``{ntype: ids}`` (empty if none)."""
    root = Path(path)
    maps = read_meta(root).id_maps
    return {t: load_npy(root / "ids" / f"{t}.npy", mmap=True) for t in maps}


def read_meta(path: str | Path) -> GraphMeta:
    """``graph.json`` of the dataset directory ``path``, read and checked."""
    return read_file(
        GraphMeta, Path(path) / META_FILE, "dataset metadata", FORMAT, VERSION, DatasetError
    )


def load_npy(path: Path, mmap: bool = True, error: type[UserError] = DatasetError) -> np.ndarray:
    """Load one ``.npy`` (never pickles); a missing or unreadable file raises ``error``."""
    if not path.is_file():
        raise error(f"{path}: missing")
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise error(f"{path}: not a readable .npy array ({exc})") from None


def _safe_name(name: object) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and name not in (".", "..")


def _schema(val: Schema, key: str, file: Path) -> Schema:
    """``val`` (the field ``key``), checked to hold safe type and feature names."""
    for t, feats in val.items():
        for name in (t, *feats):
            if not _safe_name(name):
                raise DatasetError(f"{file}: field {key!r} holds an invalid name {name!r}")
    return val


def is_dataset_dir(path: str | Path) -> bool:
    return (Path(path) / META_FILE).is_file()


def load_dataset(path: str | Path, mmap: bool = True) -> Graph:
    """Load a dataset directory (memory-mapped unless ``mmap=False``)."""
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"{root}: no such dataset directory")
    mfile = root / META_FILE
    meta = read_meta(root)
    node_types, node_offsets, edge_types, edge_offsets = read_types(meta)
    src = load_npy(root / "src.npy", mmap)
    dst = load_npy(root / "dst.npy", mmap)
    ndata: dict[str, dict[str, np.ndarray]] = {}
    for ntype, feats in _schema(meta.node_features, "node_features", mfile).items():
        ndata[ntype] = {n: load_npy(root / "node" / ntype / f"{n}.npy", mmap) for n in feats}
    edata: dict[str, dict[str, np.ndarray]] = {}
    for ekey, feats in _schema(meta.edge_features, "edge_features", mfile).items():
        parse_etype_key(ekey)
        edata[ekey] = {n: load_npy(root / "edge" / ekey / f"{n}.npy", mmap) for n in feats}
    try:
        graph = Graph(
            num_nodes=meta.num_nodes,
            src=src,
            dst=dst,
            node_types=node_types,
            edge_types=edge_types,
            node_type_offsets=node_offsets,
            edge_type_offsets=edge_offsets,
            ndata=ndata,
            edata=edata,
            name=root.name if meta.name is None else meta.name,
        )
    except DatasetError as exc:
        raise DatasetError(f"{root}: {exc}") from None
    return graph


__all__ = ["etype_key", "is_dataset_dir", "load_dataset", "load_id_maps", "save_dataset"]
