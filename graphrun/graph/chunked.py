"""The chunked dataset format (version 1): a dataset cut into N pieces.

The ``distributed`` partition mode runs one process per machine, and no machine may
read the whole graph. A chunked dataset lets rank ``r`` read only its chunks::

    CHUNKED/
      chunks.json                   metadata, see below
      chunk-K/chunk.json            {"format": "graphrun-chunk", "version": 1,
                                     "dataset_id": ..., "chunk": K, "num_chunks": N,
                                     "nodes": [a, b], "edges": [c, d]}
      chunk-K/src.npy  dst.npy      int64 [d-c]: endpoints (global node ids) of the
                                    edges c .. d-1 (edges grouped by type, as in a dataset)
      chunk-K/node/<ntype>/<name>.npy   rows of the nodes of that type among the global
                                    ids a .. b-1, in id order
      chunk-K/edge/<s:r:d>/<name>.npy   rows of the edges of that type among c .. d-1
      chunk-K/ids/<ntype>.npy       optional: the importer's raw id of those nodes

``chunks.json`` (:class:`ChunksFile`) holds every field of a dataset's ``graph.json``
(:class:`~graphrun.graph.format.GraphFields`) with ``"format": "graphrun-chunked-dataset"``, plus
``"num_chunks": N``, ``"node_bounds"`` and ``"edge_bounds"`` (N+1 ints each: chunk K
holds the nodes ``node_bounds[K] ..`` and the edges ``edge_bounds[K] ..``; both split
evenly) and ``"dataset_id"`` (random, written into every ``chunk.json`` so chunks of
two datasets are never mixed). Node and edge chunks are cut independently: the edges
of chunk K need not touch the nodes of chunk K. ``chunk.json`` is :class:`ChunkFile`.

Readers check one chunk at a time (:func:`read_chunks`): its ``chunk.json`` must agree
with ``chunks.json`` (id, index, ranges), arrays must have the dtype, width and row
count the metadata says, endpoints must be in range and of their edge type's node
types. Every problem is one :class:`~graphrun.errors.DatasetError` naming the chunk
file and the field. The directory is written to a temporary sibling and renamed
when complete, like a dataset.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from graphrun.errors import DatasetError
from graphrun.files import atomic_dir, write_failed
from graphrun.graph.format import (
    FeatureInfo,
    GraphFields,
    IdMapInfo,
    Schema,
    _check_id_map,
    _schema,
    describe_graph,
    load_npy,
    read_types,
)
from graphrun.graph.graph import Graph, _check_rows, release
from graphrun.graph.npyfile import concat_npy
from graphrun.names import CanonicalEtype, etype_key, parse_etype_key
from graphrun.wire import Header, read_file, write_json

FORMAT = "graphrun-chunked-dataset"
CHUNK_FORMAT = "graphrun-chunk"
VERSION = 1
META_FILE = "chunks.json"
CHUNK_META = "chunk.json"
CHECK_SLICE = 1 << 20  # endpoints checked at once


class ChunksFile(GraphFields, kw_only=True):
    """``chunks.json``: a dataset's ``graph.json`` fields, then how it is cut."""

    num_chunks: int
    node_bounds: list[int]
    edge_bounds: list[int]
    dataset_id: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_chunks < 1:
            raise ValueError(f"num_chunks: must be at least 1, got {self.num_chunks}")


class ChunkFile(Header, kw_only=True):
    """``chunk-K/chunk.json``: which dataset and which ranges chunk K holds."""

    dataset_id: str
    chunk: int
    num_chunks: int
    nodes: list[int]
    edges: list[int]


def even_bounds(total: int, pieces: int) -> np.ndarray:
    """``pieces + 1`` boundaries splitting ``0 .. total`` evenly (int64)."""
    return (np.arange(pieces + 1, dtype=np.int64) * total) // pieces


def chunk_dir(k: int) -> str:
    return f"chunk-{k}"


# ---- writer ------------------------------------------------------------------------------


def save_chunked(
    graph: Graph,
    path: str | Path,
    num_chunks: int,
    id_maps: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write ``graph`` as a chunked dataset of ``num_chunks`` pieces (atomically)."""
    final = Path(path)
    if not isinstance(num_chunks, int) or not 1 <= num_chunks <= max(graph.num_nodes, 1):
        raise DatasetError(
            f"--chunks: expected an integer in [1, {graph.num_nodes}] (the node count), "
            f"got {num_chunks!r}"
        )
    id_maps = dict(id_maps or {})
    for ntype, ids in id_maps.items():
        _check_id_map(graph, ntype, ids)
    nb = even_bounds(graph.num_nodes, num_chunks)
    eb = even_bounds(graph.num_edges, num_chunks)
    dataset_id = secrets.token_hex(8)
    try:
        with atomic_dir(final, DatasetError) as tmp:
            for k in range(num_chunks):
                _write_chunk(tmp / chunk_dir(k), graph, id_maps, k, num_chunks, nb, eb, dataset_id)
            fields = msgspec.structs.asdict(describe_graph(graph, id_maps))
            meta = ChunksFile(
                **{**fields, "format": FORMAT},
                num_chunks=num_chunks,
                node_bounds=nb.tolist(),
                edge_bounds=eb.tolist(),
                dataset_id=dataset_id,
            )
            write_json(tmp / META_FILE, meta)
    except OSError as exc:
        raise write_failed(final, exc) from None
    return final


def _type_slice(offsets: np.ndarray, t: int, a: int, b: int) -> tuple[int, int]:
    """The global ids of type ``t`` inside ``[a, b)`` as per-type ids ``[lo, hi)``."""
    lo, hi = max(a, int(offsets[t])), min(b, int(offsets[t + 1]))
    return lo - int(offsets[t]), max(lo, hi) - int(offsets[t])


def _write_chunk(
    d: Path,
    graph: Graph,
    id_maps: Mapping[str, np.ndarray],
    k: int,
    num_chunks: int,
    nb: np.ndarray,
    eb: np.ndarray,
    dataset_id: str,
) -> None:
    d.mkdir()
    a, b, c, e = int(nb[k]), int(nb[k + 1]), int(eb[k]), int(eb[k + 1])
    np.save(d / "src.npy", np.ascontiguousarray(graph.src[c:e]))
    np.save(d / "dst.npy", np.ascontiguousarray(graph.dst[c:e]))
    nto, eto = graph.node_type_offsets, graph.edge_type_offsets
    assert nto is not None and eto is not None
    for t, ntype in enumerate(graph.node_types):
        lo, hi = _type_slice(nto, t, a, b)
        for name, arr in graph.ndata.get(ntype, {}).items():
            (d / "node" / ntype).mkdir(parents=True, exist_ok=True)
            np.save(d / "node" / ntype / f"{name}.npy", np.ascontiguousarray(arr[lo:hi]))
        if ntype in id_maps:
            (d / "ids").mkdir(exist_ok=True)
            ids = np.ascontiguousarray(id_maps[ntype][lo:hi])
            np.save(d / "ids" / f"{ntype}.npy", ids, allow_pickle=False)
    for r, et in enumerate(graph.edge_types):
        lo, hi = _type_slice(eto, r, c, e)
        for name, arr in graph.edata.get(etype_key(et), {}).items():
            (d / "edge" / etype_key(et)).mkdir(parents=True, exist_ok=True)
            np.save(d / "edge" / etype_key(et) / f"{name}.npy", np.ascontiguousarray(arr[lo:hi]))
    meta = ChunkFile(
        CHUNK_FORMAT, VERSION, dataset_id=dataset_id, chunk=k, num_chunks=num_chunks,
        nodes=[a, b], edges=[c, e],
    )  # fmt: skip
    write_json(d / CHUNK_META, meta, indent=None)


# ---- readers -----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ChunkedMeta:
    """``chunks.json`` of a chunked dataset, checked."""

    path: Path
    name: str
    num_nodes: int
    num_edges: int
    node_types: tuple[str, ...]
    edge_types: tuple[CanonicalEtype, ...]
    node_type_offsets: np.ndarray
    edge_type_offsets: np.ndarray
    node_features: Schema
    edge_features: Schema
    id_maps: dict[str, IdMapInfo]
    num_chunks: int
    node_bounds: np.ndarray
    edge_bounds: np.ndarray
    dataset_id: str

    @property
    def is_hetero(self) -> bool:
        return len(self.node_types) > 1 or len(self.edge_types) > 1


def is_chunked_dir(path: str | Path) -> bool:
    return (Path(path) / META_FILE).is_file()


def _bounds(val: list[int], key: str, n: int, total: int, mfile: Path) -> np.ndarray:
    arr = np.asarray(val, dtype=np.int64)
    if arr.shape != (n + 1,) or arr[0] != 0 or arr[-1] != total or (np.diff(arr) < 0).any():
        raise DatasetError(
            f"{mfile}: field {key!r} must hold {n + 1} non-decreasing integers from 0 to {total}"
        )
    return arr


def load_chunked_meta(path: str | Path) -> ChunkedMeta:
    """Read and check ``chunks.json`` (no chunk is opened)."""
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"{root}: no such chunked dataset directory")
    mfile = root / META_FILE
    if not mfile.is_file() and (root / "graph.json").is_file():
        raise DatasetError(
            f"{root}: a whole dataset, not a chunked one (write one with "
            "`graphrun generate ... --chunks N` or `graphrun import ... --chunks N`)"
        )
    meta = read_file(ChunksFile, mfile, "chunked dataset metadata", FORMAT, VERSION, DatasetError)
    num_nodes, num_edges, num_chunks = meta.num_nodes, meta.num_edges, meta.num_chunks
    node_types, node_offsets, edge_types, edge_offsets = read_types(meta)
    if node_offsets[-1] != num_nodes or edge_offsets[-1] != num_edges:
        raise DatasetError(f"{mfile}: the type counts do not add up to num_nodes/num_edges")
    for et in edge_types:
        for t in (et[0], et[2]):
            if t not in node_types:
                raise DatasetError(f"{mfile}: edge type {etype_key(et)} names unknown {t!r}")
    edge_features = _schema(meta.edge_features, "edge_features", mfile)
    for key in edge_features:
        if parse_etype_key(key) not in edge_types:
            raise DatasetError(f"{mfile}: field 'edge_features' names unknown edge type {key!r}")
    node_features = _schema(meta.node_features, "node_features", mfile)
    for key in node_features:
        if key not in node_types:
            raise DatasetError(f"{mfile}: field 'node_features' names unknown node type {key!r}")
    id_maps = meta.id_maps
    if not set(id_maps) <= set(node_types):
        raise DatasetError(f"{mfile}: field 'id_maps' names unknown node types")
    return ChunkedMeta(
        path=root,
        name=root.name if meta.name is None else meta.name,
        num_nodes=num_nodes,
        num_edges=num_edges,
        node_types=node_types,
        edge_types=edge_types,
        node_type_offsets=node_offsets,
        edge_type_offsets=edge_offsets,
        node_features=node_features,
        edge_features=edge_features,
        id_maps=id_maps,
        num_chunks=num_chunks,
        node_bounds=_bounds(meta.node_bounds, "node_bounds", num_chunks, num_nodes, mfile),
        edge_bounds=_bounds(meta.edge_bounds, "edge_bounds", num_chunks, num_edges, mfile),
        dataset_id=meta.dataset_id,
    )


@dataclass(frozen=True, eq=False)
class Chunk:
    """Consecutive chunks read together: global nodes ``nodes[0] .. nodes[1]-1`` with
    their features (``ndata[ntype][name]``: the rows of that type in the range), and the
    edges ``edges[0] .. edges[1]-1`` (``src``/``dst`` global ids, ``edata`` likewise)."""

    nodes: tuple[int, int]
    edges: tuple[int, int]
    src: np.ndarray
    dst: np.ndarray
    ndata: dict[str, dict[str, np.ndarray]]
    edata: dict[str, dict[str, np.ndarray]]
    ids: dict[str, np.ndarray]


def _check_chunk_meta(meta: ChunkedMeta, k: int, d: Path) -> None:
    cfile = d / CHUNK_META
    cm = read_file(
        ChunkFile, cfile, f"chunk {k} of {meta.path}", CHUNK_FORMAT, VERSION, DatasetError
    )
    want = {
        "dataset_id": meta.dataset_id,
        "chunk": k,
        "num_chunks": meta.num_chunks,
        "nodes": [int(meta.node_bounds[k]), int(meta.node_bounds[k + 1])],
        "edges": [int(meta.edge_bounds[k]), int(meta.edge_bounds[k + 1])],
    }
    for key, val in want.items():
        if getattr(cm, key) != val:
            raise DatasetError(
                f"{cfile}: field {key!r} is {getattr(cm, key)!r}, but {meta.path / META_FILE} "
                f"says {val!r} (chunks of different datasets or versions mixed?)"
            )


def check_chunks(meta: ChunkedMeta) -> None:
    """Every chunk's own metadata present and agreeing with ``chunks.json`` (small JSON
    files only: what a launcher checks before any rank starts)."""
    for k in range(meta.num_chunks):
        d = meta.path / chunk_dir(k)
        if not d.is_dir():
            raise DatasetError(f"{d}: missing (chunk {k} of {meta.num_chunks})")
        _check_chunk_meta(meta, k, d)


def _load_rows(f: Path, spec: FeatureInfo, rows: int, mfile: Path, mmap: bool) -> np.ndarray:
    arr = load_npy(f, mmap)
    try:
        dtype, shape = np.dtype(spec.dtype), tuple(spec.shape)
    except TypeError as exc:
        raise DatasetError(f"{mfile}: malformed feature entry for {f.name} ({exc})") from None
    if arr.dtype != dtype or arr.shape != (rows, *shape[1:]):
        raise DatasetError(
            f"{f}: dtype {arr.dtype} shape {arr.shape}, expected {dtype} {(rows, *shape[1:])} "
            f"(from {mfile})"
        )
    try:
        _check_rows(str(f), arr, rows)
    except DatasetError as exc:
        raise DatasetError(str(exc)) from None
    return arr


def _read_one(meta: ChunkedMeta, k: int, mmap: bool) -> Chunk:
    d = meta.path / chunk_dir(k)
    if not d.is_dir():
        raise DatasetError(f"{d}: missing (chunk {k} of {meta.num_chunks})")
    _check_chunk_meta(meta, k, d)
    mfile = meta.path / META_FILE
    a, b = int(meta.node_bounds[k]), int(meta.node_bounds[k + 1])
    c, e = int(meta.edge_bounds[k]), int(meta.edge_bounds[k + 1])
    ends = {}
    for end in ("src", "dst"):
        arr = load_npy(d / f"{end}.npy", mmap)
        if arr.dtype != np.int64 or arr.shape != (e - c,):
            raise DatasetError(
                f"{d / (end + '.npy')}: dtype {arr.dtype} shape {arr.shape}, "
                f"expected int64 ({e - c},)"
            )
        ends[end] = arr
    _check_endpoints(meta, d, c, ends["src"], ends["dst"])
    ndata: dict[str, dict[str, np.ndarray]] = {}
    ids: dict[str, np.ndarray] = {}
    for t, ntype in enumerate(meta.node_types):
        lo, hi = _type_slice(meta.node_type_offsets, t, a, b)
        feats = meta.node_features.get(ntype, {})
        ndata[ntype] = {
            n: _load_rows(d / "node" / ntype / f"{n}.npy", s, hi - lo, mfile, mmap)
            for n, s in feats.items()
        }
        if ntype in meta.id_maps:
            arr = load_npy(d / "ids" / f"{ntype}.npy", mmap)
            if arr.shape != (hi - lo,):
                raise DatasetError(f"{d / 'ids' / ntype}.npy: expected {hi - lo} ids")
            ids[ntype] = arr
    edata: dict[str, dict[str, np.ndarray]] = {}
    for r, et in enumerate(meta.edge_types):
        key = etype_key(et)
        lo, hi = _type_slice(meta.edge_type_offsets, r, c, e)
        feats = meta.edge_features.get(key, {})
        edata[key] = {
            n: _load_rows(d / "edge" / key / f"{n}.npy", s, hi - lo, mfile, mmap)
            for n, s in feats.items()
        }
    return Chunk((a, b), (c, e), ends["src"], ends["dst"], ndata, edata, ids)


def _check_endpoints(meta: ChunkedMeta, d: Path, c: int, src: np.ndarray, dst: np.ndarray) -> None:
    """Every endpoint in range and of its edge type's source / destination node type."""
    eto, nto = meta.edge_type_offsets, meta.node_type_offsets
    for r, et in enumerate(meta.edge_types):
        lo, hi = _type_slice(eto, r, c, c + len(src))
        lo, hi = lo + int(eto[r]) - c, hi + int(eto[r]) - c  # positions in the chunk
        for end, arr, t in (("src", src, et[0]), ("dst", dst, et[2])):
            ti = meta.node_types.index(t)
            for at in range(lo, hi, CHECK_SLICE):  # a mapped file: one slice's pages held
                seg = arr[at : min(hi, at + CHECK_SLICE)]
                bad = (seg < nto[ti]) | (seg >= nto[ti + 1])
                if bad.any():
                    i = int(np.flatnonzero(bad)[0])
                    raise DatasetError(
                        f"{d / (end + '.npy')}: row {at + i} = {int(seg[i])} is not a {t!r} "
                        f"node (edge type {etype_key(et)} needs ids in [{nto[ti]}, {nto[ti + 1]}))"
                    )
                release(arr)


def read_chunks(
    meta: ChunkedMeta, chunks: Sequence[int], mmap: bool = True, into: Path | None = None
) -> Chunk:
    """Read consecutive chunks (e.g. a rank's share) as one :class:`Chunk`, each checked;
    with ``into`` (a scratch directory, mapped inputs) several chunks are joined in files
    there, memory-mapped, instead of in memory."""
    ks = list(chunks)
    if not ks or ks != list(range(ks[0], ks[0] + len(ks))) or ks[-1] >= meta.num_chunks:
        raise DatasetError(f"{meta.path}: chunks {ks} are not consecutive chunks of this dataset")
    parts = [_read_one(meta, k, mmap) for k in ks]
    if len(parts) == 1:
        return parts[0]
    joined = iter(range(1 << 30))

    def cat(arrs: list[np.ndarray]) -> np.ndarray:
        if not arrs:
            return np.zeros(0, np.int64)
        if into is None:
            return np.concatenate(arrs)
        out = into / f"{next(joined)}.npy"
        try:
            return concat_npy(out, arrs)
        except OSError as exc:  # a full scratch disk: ENOSPC when its blocks are allocated
            raise write_failed(out, exc) from None

    def merge(kind: str) -> dict[str, dict[str, np.ndarray]]:
        groups: list[dict[str, dict[str, np.ndarray]]] = [getattr(p, kind) for p in parts]
        return {t: {n: cat([g[t][n] for g in groups]) for n in groups[0][t]} for t in groups[0]}

    return Chunk(
        nodes=(parts[0].nodes[0], parts[-1].nodes[1]),
        edges=(parts[0].edges[0], parts[-1].edges[1]),
        src=cat([p.src for p in parts]),
        dst=cat([p.dst for p in parts]),
        ndata=merge("ndata"),
        edata=merge("edata"),
        ids={t: cat([p.ids[t] for p in parts]) for t in parts[0].ids},
    )


def rank_chunks(num_chunks: int, rank: int, world: int) -> range:
    """The consecutive chunks rank ``rank`` of ``world`` reads (every chunk exactly once)."""
    b = even_bounds(num_chunks, world)
    return range(int(b[rank]), int(b[rank + 1]))


def load_chunked_whole(
    path: str | Path, scratch: Path | None = None
) -> tuple[Graph, dict[str, np.ndarray]]:
    """Every chunk read into one :class:`Graph` (and the raw id maps): for one machine.
    With ``scratch`` (a directory that outlives the graph's use) the chunks are joined in
    memory-mapped files there, as an unchunked dataset is read: the graph's arrays then
    cost the page cache, not the process's memory."""
    meta = load_chunked_meta(path)
    mmap = scratch is not None
    whole = read_chunks(meta, range(meta.num_chunks), mmap=mmap, into=scratch)
    graph = Graph(
        num_nodes=meta.num_nodes,
        src=whole.src,
        dst=whole.dst,
        node_types=meta.node_types,
        edge_types=meta.edge_types,
        node_type_offsets=meta.node_type_offsets,
        edge_type_offsets=meta.edge_type_offsets,
        ndata={t: f for t, f in whole.ndata.items() if f},
        edata={k: f for k, f in whole.edata.items() if f},
        name=meta.name,
    )
    return graph, whole.ids
