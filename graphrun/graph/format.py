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

Every ``.npy`` is memory-mapped on load, so a graph larger than memory can be
partitioned. The directory is written to a staging directory beside it and renamed
when complete (:func:`graphrun.files.atomic_dir`): a crash never leaves a half-written
dataset behind.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from graphrun.errors import DatasetError, UserError
from graphrun.files import atomic_dir, dir_is_free, read_json, write_failed
from graphrun.graph.graph import Graph
from graphrun.names import etype_key, parse_etype_key

FORMAT = "graphrun-dataset"
VERSION = 1
META_FILE = "graph.json"


def feature_schema(data: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    """``{type: {name: {"dtype": ..., "shape": [...]}}}`` of non-empty feature groups."""
    return {
        key: {name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in feats.items()}
        for key, feats in data.items()
        if feats
    }


def ensure_free(final: str | Path) -> None:
    """Raise unless ``final`` can be created (absent, or an empty directory): checked
    before minutes of work, and again by :func:`graphrun.files.atomic_dir`."""
    if not dir_is_free(final):
        raise DatasetError(f"{final}: already exists and is not empty")


def describe_graph(graph: Graph, id_maps: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The metadata fields of a dataset (whole or chunked) that describe ``graph``: name,
    counts, node and edge types with their counts, feature schemas, id-map dtypes."""
    return {
        "name": graph.name,
        "num_nodes": int(graph.num_nodes),
        "num_edges": int(graph.num_edges),
        "node_types": [{"name": t, "count": graph.num_nodes_of(t)} for t in graph.node_types],
        "edge_types": [
            {"src": e[0], "rel": e[1], "dst": e[2], "count": graph.num_edges_of(e)}
            for e in graph.edge_types
        ],
        "node_features": feature_schema(graph.ndata),
        "edge_features": feature_schema(graph.edata),
        "id_maps": {t: {"dtype": str(ids.dtype)} for t, ids in id_maps.items()},
    }


def read_types(
    meta: dict[str, Any], mfile: Path
) -> tuple[tuple[str, ...], np.ndarray, tuple[tuple[str, str, str], ...], np.ndarray]:
    """``(node_types, node_type_offsets, edge_types, edge_type_offsets)`` from the
    metadata's ``node_types``/``edge_types`` lists (one DatasetError naming the file)."""
    ntypes = _field(meta, "node_types", list, mfile)
    etypes = _field(meta, "edge_types", list, mfile)
    try:
        node_types = tuple(str(t["name"]) for t in ntypes)
        ncounts = [int(t["count"]) for t in ntypes]
        edge_types = tuple((str(e["src"]), str(e["rel"]), str(e["dst"])) for e in etypes)
        ecounts = [int(e["count"]) for e in etypes]
    except (KeyError, TypeError, ValueError) as exc:
        raise DatasetError(f"{mfile}: malformed 'node_types'/'edge_types' ({exc})") from None
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
            meta = {"format": FORMAT, "version": VERSION, **describe_graph(graph, id_maps)}
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
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
    mfile = root / META_FILE
    maps = read_json(mfile, "dataset metadata", DatasetError).get("id_maps") or {}
    if not isinstance(maps, dict):
        raise DatasetError(f"{mfile}: field 'id_maps' must be an object")
    return {t: load_npy(root / "ids" / f"{t}.npy", mmap=True) for t in maps}


def check_header(
    meta: dict[str, Any], path: Path, fmt: str, version: int, error: type[UserError]
) -> None:
    """Reject a metadata file whose ``format`` or ``version`` field is not ours."""
    if meta.get("format") != fmt:
        raise error(f"{path}: field 'format' is {meta.get('format')!r}, not {fmt!r}")
    if meta.get("version") != version:
        raise error(
            f"{path}: field 'version' is {meta.get('version')!r}; "
            f"this graphrun reads version {version}"
        )


def _field(meta: dict[str, Any], key: str, typ: type | tuple[type, ...], file: Path) -> Any:
    if key not in meta:
        raise DatasetError(f"{file}: field {key!r} is missing")
    val = meta[key]
    if not isinstance(val, typ) or isinstance(val, bool):
        raise DatasetError(f"{file}: field {key!r} has the wrong type ({type(val).__name__})")
    return val


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


def _schema(meta: dict[str, Any], key: str, file: Path) -> dict[str, dict[str, Any]]:
    """``meta[key]``, checked to be ``{type: {feature: ...}}`` with safe names."""
    val = meta.get(key) or {}
    if not isinstance(val, dict) or not all(isinstance(f, dict) for f in val.values()):
        raise DatasetError(f"{file}: field {key!r} must map type names to feature objects")
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
    meta = read_json(mfile, "dataset metadata", DatasetError)
    check_header(meta, mfile, FORMAT, VERSION, DatasetError)
    num_nodes = _field(meta, "num_nodes", int, mfile)
    node_types, node_offsets, edge_types, edge_offsets = read_types(meta, mfile)
    src = load_npy(root / "src.npy", mmap)
    dst = load_npy(root / "dst.npy", mmap)
    ndata: dict[str, dict[str, np.ndarray]] = {}
    for ntype, feats in _schema(meta, "node_features", mfile).items():
        ndata[ntype] = {n: load_npy(root / "node" / ntype / f"{n}.npy", mmap) for n in feats}
    edata: dict[str, dict[str, np.ndarray]] = {}
    for ekey, feats in _schema(meta, "edge_features", mfile).items():
        parse_etype_key(ekey)
        edata[ekey] = {n: load_npy(root / "edge" / ekey / f"{n}.npy", mmap) for n in feats}
    try:
        graph = Graph(
            num_nodes=num_nodes,
            src=src,
            dst=dst,
            node_types=node_types,
            edge_types=edge_types,
            node_type_offsets=node_offsets,
            edge_type_offsets=edge_offsets,
            ndata=ndata,
            edata=edata,
            name=str(meta.get("name", root.name)),
        )
    except DatasetError as exc:
        raise DatasetError(f"{root}: {exc}") from None
    return graph


__all__ = ["etype_key", "is_dataset_dir", "load_dataset", "load_id_maps", "save_dataset"]
