"""The partition directory format (version 1): writer and readers.

A partition directory ``OUT`` holds::

    OUT/partition.json          the config (below); the partition book's fields included
    OUT/part-K/nodes.npy        int64 [n_local] new homogeneous global id of every local
                                node: the owned (inner) nodes first, in increasing id, then
                                the halo nodes, hop by hop, increasing id inside a hop
    OUT/part-K/indptr.npy       int64 [n_local+1] CSC over the local nodes (their in-edges)
    OUT/part-K/indices.npy      int64 [e_local] source of every in-edge, new global id
    OUT/part-K/eids.npy         int64 [e_local] new global edge id of every in-edge
    OUT/part-K/etypes.npy       int32 [e_local] edge type id (heterogeneous graphs only)
    OUT/part-K/node/<ntype>/<name>.npy   features of the owned nodes of that type:
                                row i = per-type new id node_ranges[ntype][K] + i
    OUT/part-K/edge/<s:r:d>/<name>.npy   the same for owned edges
    OUT/mapping/orig_nids.npy   int64 new homogeneous node id -> original id (see below
                                for the sharded layout of the distributed mode)
    OUT/mapping/new_nids.npy    int64 original node id -> new homogeneous id
    OUT/mapping/orig_eids.npy, new_eids.npy   the same for edges
    OUT/mapping/ids/<ntype>.npy  optional: the importer's raw id (int64 or string) of
                                every node of that type, by original per-type id

The ``distributed`` mode (no machine holds a global array) writes the mapping as
shards instead, one directory per rank, and says so in ``partition.json``
(``"mapping": {"layout": "sharded", "node_bounds": [P+1], "edge_bounds": [P+1]}``)::

    OUT/mapping/part-K/orig_nids.npy   original ids of the new ids node_offsets[K] ..
    OUT/mapping/part-K/orig_eids.npy   the same for edges (edge_offsets)
    OUT/mapping/part-K/new_nids.npy    new ids of the original ids node_bounds[K] ..
    OUT/mapping/part-K/new_eids.npy    new ids of the original edges edge_bounds[K] ..
    OUT/mapping/part-K/ids/<ntype>.npy raw ids of the nodes of that type in node_bounds[K] ..

Concatenated in K order the shards are the four global arrays (and the raw ids);
:func:`load_id_mapping` does that, so its readers see no difference.

Relabelling: partition ``p`` owns the new node ids ``[node_offsets[p],
node_offsets[p+1])``; inside, nodes are grouped by type (``node_types`` order) and
ordered by original id, so type ``t`` owns the per-type range
``[node_ranges[t][p], node_ranges[t][p+1])``. Every edge belongs to the partition of
its destination (a partition has the complete in-edges of its nodes); new edge ids
are contiguous per partition and grouped by edge type (``edge_ranges``), ordered by
original id inside a type. Original ids are never lost: the mapping files convert
both ways, and per-type original ids follow from the dataset's type offsets.

Halo: ``halo_hops`` H = 0 lists the inner nodes only; H = 1 (default) also lists the
1-hop in-neighbours as halo rows without edges; H >= 2 gives halo rows up to hop
H-1 their in-edges too (structure only; features stay with their owner).

``partition.json``::

    {"format": "graphrun-partition", "version": 1, "graph_name": ..., "num_parts": P,
     "method": "metis" | "random" | "kaminpar" | "xtrapulp", "halo_hops": H, "seed": ...,
     "balance": {"train": bool, "edges": bool, "tolerance": float},
     "num_nodes": N, "num_edges": E,
     "node_types": [...], "edge_types": [[src, rel, dst], ...],
     "node_offsets": [P+1 ints], "edge_offsets": [P+1 ints],
     "node_ranges": {ntype: [P+1 ints]}, "edge_ranges": {"s:r:d": [P+1 ints]},
     "node_features": {ntype: {name: {"dtype": "float32", "shape": [rows, ...]}}},
     "edge_features": {"s:r:d": {...}},
     "quality": {"edge_cut": ..., "node_balance": ..., "edge_balance": ...,
                 "train_balance": ... | null, "num_cut_edges": ...},
     "parts": [{"dir": "part-0", "num_inner_nodes": .., "num_local_nodes": ..,
                "num_inner_edges": .., "num_local_edges": ..}, ...]}

(feature ``shape[0]`` is the total number of rows over all partitions). The fields
are declared once, as :class:`PartitionFile`: :func:`write_config` writes one,
:func:`load_partition_config` is the one reader (the header by
:func:`graphrun.wire.check_header`, the book's fields by
:meth:`PartitionBook.from_config`, every other field by the declaration). Every
``.npy`` loads with ``mmap_mode="r"``. The directory is written to a temporary
sibling and renamed when complete. Readers reject another ``format``/``version``,
corrupt JSON and missing or inconsistent files with a
:class:`~graphrun.errors.PartitionFormatError` naming the file and the field.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np

from graphrun.errors import ArgumentError, PartitionFormatError
from graphrun.files import read_json
from graphrun.graph import Graph
from graphrun.graph.format import IdMapInfo, Schema, ensure_free, feature_schema, load_npy
from graphrun.graph.npyfile import flushed, open_npy
from graphrun.names import etype_key, owners
from graphrun.partition import compacted
from graphrun.partition.book import CONFIG_FILE, PartitionBook, check_ids
from graphrun.partition.npyout import save_column, save_rows
from graphrun.partition.quality import Quality
from graphrun.partition.relabel import Relabelling, local_structure, write_edge_maps
from graphrun.wire import Header, check_header, convert, write_json

FORMAT = "graphrun-partition"
VERSION = 1
MAPPING_DIR = "mapping"


class Balance(msgspec.Struct):
    """What the partitioner balanced, and within which tolerance."""

    train: bool
    edges: bool
    tolerance: float


class PartInfo(msgspec.Struct, kw_only=True):
    """One partition's directory (a plain name under the partition directory) and sizes."""

    dir: str
    num_inner_nodes: int
    num_local_nodes: int
    num_inner_edges: int
    num_local_edges: int | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        if "/" in self.dir or self.dir in ("", ".", ".."):
            raise ValueError(f"dir: {self.dir!r} is not a plain name")
        for name in ("num_inner_nodes", "num_local_nodes", "num_inner_edges"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0")


class MappingLayout(msgspec.Struct, kw_only=True):
    """How ``mapping/`` is laid out: global arrays, or one shard per rank cut at the
    bounds (the distributed mode)."""

    layout: Literal["global", "sharded"]
    node_bounds: list[int] = msgspec.field(default_factory=list)
    edge_bounds: list[int] = msgspec.field(default_factory=list)


class DistributedInfo(msgspec.Struct):
    """How the distributed mode ran: its ranks and its initial assignment."""

    ranks: int
    init: str


class PartitionFile(Header, kw_only=True):
    """``partition.json`` (the layout in the module docstring), fields in the order
    written. The book's fields (``num_parts`` .. ``edge_ranges``) are checked further by
    :meth:`PartitionBook.from_config`; fields a writer may leave out are ``UNSET``."""

    graph_name: str | msgspec.UnsetType = msgspec.UNSET
    method: str | msgspec.UnsetType = msgspec.UNSET
    halo_hops: int = 1
    seed: int | msgspec.UnsetType | None = msgspec.UNSET
    balance: Balance | msgspec.UnsetType = msgspec.UNSET
    num_nodes: int | msgspec.UnsetType = msgspec.UNSET
    num_edges: int | msgspec.UnsetType = msgspec.UNSET
    num_parts: int
    node_types: list[str]
    edge_types: list[tuple[str, str, str]]
    node_offsets: list[int]
    edge_offsets: list[int]
    node_ranges: dict[str, list[int]]
    edge_ranges: dict[str, list[int]]
    node_features: Schema = msgspec.field(default_factory=dict)
    edge_features: Schema = msgspec.field(default_factory=dict)
    quality: Quality | msgspec.UnsetType = msgspec.UNSET
    parts: list[PartInfo]
    id_maps: dict[str, IdMapInfo] = msgspec.field(default_factory=dict)
    mapping: MappingLayout | msgspec.UnsetType = msgspec.UNSET
    distributed: DistributedInfo | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        if self.halo_hops < 0:
            raise ValueError(f"halo_hops: must be >= 0, got {self.halo_hops}")


# ---- writer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    method: str
    halo_hops: int
    balance_train: bool
    balance_edges: bool
    tolerance: float
    seed: int


def _write_part(tmp: Path, graph: Graph, rl: Relabelling, part: int, halo: int) -> PartInfo:
    d = tmp / f"part-{part}"
    d.mkdir()
    loc = local_structure(graph, rl, part, halo)
    np.save(d / "nodes.npy", loc.nodes)
    np.save(d / "indptr.npy", loc.indptr)
    save_column(d / "indices.npy", loc, "src")
    save_column(d / "eids.npy", loc, "eids")
    nto, eto = graph.node_type_offsets, graph.edge_type_offsets
    assert nto is not None and eto is not None
    if graph.is_hetero:
        out = open_npy(d / "etypes.npy", np.dtype(np.int32), (loc.num_edges,))
        at = 0
        for piece in loc.column("orig"):
            out[at : at + len(piece)] = owners(eto, piece)
            at += len(piece)
        flushed(out)
    for t, ntype in enumerate(graph.node_types):
        a, b = rl.node_block(part, t)
        rows = rl.orig_nids[a:b] - nto[t]
        _write_features(d / "node" / ntype, graph.ndata.get(ntype, {}), rows)
    elo = rl.book.owned_edges(part)[0]
    owned = loc.edges[0].orig  # the inner rows' in-edges in original order: by new id
    for r, et in enumerate(graph.edge_types):
        a, b = rl.edge_block(part, r)
        rows = owned[a - elo : b - elo].astype(np.int64) - eto[r]
        _write_features(d / "edge" / etype_key(et), graph.edata.get(etype_key(et), {}), rows)
    lo, hi = rl.book.owned_nodes(part)
    ehi = rl.book.owned_edges(part)[1]
    return PartInfo(
        dir=d.name,
        num_inner_nodes=hi - lo,
        num_local_nodes=len(loc.nodes),
        num_inner_edges=ehi - elo,
        num_local_edges=loc.num_edges,
    )


def _write_features(d: Path, feats: dict[str, np.ndarray], rows: np.ndarray) -> None:
    if not feats:
        return
    d.mkdir(parents=True, exist_ok=True)
    for name, arr in feats.items():
        save_rows(d / f"{name}.npy", arr, rows)


def write_partition(
    graph: Graph,
    rl: Relabelling,
    tmp: Path,
    opts: WriteOptions,
    quality: Quality,
    id_maps: Mapping[str, np.ndarray] | None = None,
) -> PartitionFile:
    """Write the partition directory's content into ``tmp``; returns the config."""
    parts = [_write_part(tmp, graph, rl, p, opts.halo_hops) for p in range(rl.book.num_parts)]
    m = tmp / MAPPING_DIR
    m.mkdir()
    np.save(m / "orig_nids.npy", rl.orig_nids.astype(np.int64, copy=False))
    np.save(m / "new_nids.npy", rl.new_nids.astype(np.int64, copy=False))
    e = (graph.num_edges,)
    orig_eids = open_npy(m / "orig_eids.npy", np.dtype(np.int64), e)
    new_eids = open_npy(m / "new_eids.npy", np.dtype(np.int64), e)
    write_edge_maps(graph, rl, orig_eids, new_eids)
    del orig_eids, new_eids
    for ntype, ids in (id_maps or {}).items():
        (m / "ids").mkdir(exist_ok=True)
        np.save(m / "ids" / f"{ntype}.npy", np.ascontiguousarray(ids), allow_pickle=False)
    return write_config(
        tmp, opts, rl.book, graph_name=graph.name, num_nodes=int(graph.num_nodes),
        num_edges=int(graph.num_edges), node_features=feature_schema(graph.ndata),
        edge_features=feature_schema(graph.edata), quality=quality, parts=parts,
        id_map_dtypes={t: str(ids.dtype) for t, ids in (id_maps or {}).items()},
    )  # fmt: skip


def write_config(
    tmp: Path,
    opts: WriteOptions,
    book: PartitionBook,
    *,
    graph_name: str,
    num_nodes: int,
    num_edges: int,
    node_features: Schema,
    edge_features: Schema,
    quality: Quality,
    parts: list[PartInfo],
    id_map_dtypes: Mapping[str, str],
    mapping: MappingLayout | msgspec.UnsetType = msgspec.UNSET,
    distributed: DistributedInfo | msgspec.UnsetType = msgspec.UNSET,
) -> PartitionFile:
    """Write ``tmp/partition.json`` (the layout in the module docstring; ``mapping`` and
    ``distributed``: the distributed mode's sharded mapping and ranks); returns it."""
    cfg = PartitionFile(
        FORMAT,
        VERSION,
        graph_name=graph_name,
        method=opts.method,
        halo_hops=opts.halo_hops,
        seed=opts.seed,
        balance=Balance(opts.balance_train, opts.balance_edges, opts.tolerance),
        num_nodes=num_nodes,
        num_edges=num_edges,
        **book.to_config(),
        node_features=node_features,
        edge_features=edge_features,
        quality=quality,
        parts=parts,
        id_maps={t: IdMapInfo(d) for t, d in id_map_dtypes.items()},
        mapping=mapping,
        distributed=distributed,
    )
    write_json(tmp / CONFIG_FILE, cfg)
    return cfg


def start_shared_output(out: str | Path) -> Path:
    """The staging directory of ``out`` that ranks no launcher watches all know by name
    (``.OUT.tmp-ranks``, beside it), made empty: one rank calls it before any writes (a
    failed attempt's leftovers are removed). Fails if ``out`` is not empty."""
    final = Path(out)
    ensure_free(final)
    tmp = shared_output(final)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    except OSError as exc:
        raise PartitionFormatError(f"{final}: cannot create ({exc.strerror or exc})") from None
    return tmp


def shared_output(out: str | Path) -> Path:
    final = Path(out)
    return final.parent / f".{final.name}.tmp-ranks"


# ---- readers -----------------------------------------------------------------------------


def _config_file(path: Path) -> Path:
    return path if path.name == CONFIG_FILE else path / CONFIG_FILE


def load_partition_config(path: str | Path) -> dict[str, Any]:
    """Read and check ``partition.json`` of a partition directory (or the file itself)."""
    cfile = _config_file(Path(path))
    if not cfile.parent.is_dir():
        raise PartitionFormatError(f"{cfile.parent}: no such partition directory")
    cfg = read_json(cfile, "partition config", PartitionFormatError)
    check_header(cfg, str(cfile), FORMAT, VERSION, PartitionFormatError)
    PartitionBook.from_config(cfg, source=str(cfile))  # the book's fields, its messages
    declared = convert(PartitionFile, cfg, str(cfile), PartitionFormatError)
    if len(declared.parts) != declared.num_parts:
        raise PartitionFormatError(
            f"{cfile}: field 'parts' must list {declared.num_parts} partitions"
        )
    return cfg


def load_partition_book(path: str | Path) -> PartitionBook:
    """Read the partition book from a partition directory (or its ``partition.json``)."""
    return PartitionBook.from_config(
        load_partition_config(path), source=str(_config_file(Path(path)))
    )


def _load(path: Path, dtype: np.dtype | None = None, length: int | None = None) -> np.ndarray:
    arr = load_npy(path, True, PartitionFormatError)
    if dtype is not None and arr.dtype != dtype:
        raise PartitionFormatError(f"{path}: dtype {arr.dtype}, expected {dtype}")
    if length is not None and (arr.ndim != 1 or len(arr) != length):
        raise PartitionFormatError(f"{path}: shape {arr.shape}, expected ({length},)")
    return arr


@dataclass(frozen=True, eq=False)
class Partition:
    """One partition loaded from disk; every array is memory-mapped read-only.

    ``nodes[:num_inner_nodes]`` are the owned nodes (new ids ``book.owned_nodes(part)``),
    the rest are halo nodes. ``indptr``/``indices``/``eids`` are the CSC of the local
    nodes (sources and edge ids as new global ids); ``etypes`` is None for a
    homogeneous graph. ``node_feats[ntype][name]`` has one row per owned node of that
    type (row = per-type id - ``book.node_ranges(ntype)[part]``).
    """

    path: Path
    part: int
    book: PartitionBook
    config: dict[str, Any]
    nodes: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    eids: np.ndarray
    etypes: np.ndarray | None
    node_feats: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    edge_feats: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    base_root: Path | None = None  # where its compacted directory is (None: ``path``)

    @property
    def num_inner_nodes(self) -> int:
        a, b = self.book.owned_nodes(self.part)
        return b - a

    @property
    def num_local_nodes(self) -> int:
        return len(self.nodes)

    @property
    def inner_mask(self) -> np.ndarray:
        mask = np.zeros(len(self.nodes), dtype=bool)
        mask[: self.num_inner_nodes] = True
        return mask

    def local_node_types(self) -> tuple[np.ndarray, np.ndarray]:
        """``(type id int32, per-type new id int64)`` of every local node."""
        return self.book.to_per_type(self.nodes)

    @property
    def halo_hops(self) -> int:
        return int(self.config.get("halo_hops", 1))


def load_partition(path: str | Path, part: int, own: Path | None = None) -> Partition:
    """Load partition ``part`` of the partition directory ``path`` (memory-mapped): its
    newest compacted directory, in ``path`` or ``own`` (a replica's), or ``part-K``."""
    root = Path(path)
    cfg = load_partition_config(root)
    cfile = root / CONFIG_FILE
    book = PartitionBook.from_config(cfg, source=str(cfile))
    if not isinstance(part, int | np.integer) or not 0 <= part < book.num_parts:
        raise PartitionFormatError(
            f"{cfile}: has no partition {part!r} (num_parts = {book.num_parts})"
        )
    info = cfg["parts"][part]
    base = compacted.newest([root] if own is None else [root, own], int(part))
    d = compacted.part_dir(base, int(part), info["dir"])  # a live store's, folded in
    if not d.is_dir():
        raise PartitionFormatError(f"{d}: missing (partition {part})")
    n_local = info["num_local_nodes"]
    nodes = _load(d / "nodes.npy", np.dtype(np.int64), n_local)
    indptr = _load(d / "indptr.npy", np.dtype(np.int64), n_local + 1)
    e_local = int(indptr[-1]) if len(indptr) else 0
    indices = _load(d / "indices.npy", np.dtype(np.int64), e_local)
    eids = _load(d / "eids.npy", np.dtype(np.int64), e_local)
    etypes = _load(d / "etypes.npy", np.dtype(np.int32), e_local) if book.is_hetero else None
    a, b = book.owned_nodes(part)
    if info["num_inner_nodes"] != b - a or (b > a and (nodes[0] != a or nodes[b - a - 1] != b - 1)):
        raise PartitionFormatError(
            f"{d / 'nodes.npy'}: the inner nodes do not match node_offsets[{part}] in {cfile}"
        )
    node_feats = _load_features(d / "node", cfg.get("node_features", {}), book, part, True, cfile)
    edge_feats = _load_features(d / "edge", cfg.get("edge_features", {}), book, part, False, cfile)
    return Partition(root, int(part), book, cfg, nodes, indptr, indices, eids, etypes,
                     node_feats, edge_feats, base)  # fmt: skip


def _load_features(
    d: Path, schema: dict[str, Any], book: PartitionBook, part: int, nodes: bool, cfile: Path
) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    kind = "node_features" if nodes else "edge_features"
    for key, feats in schema.items():
        if not isinstance(feats, dict):
            raise PartitionFormatError(f"{cfile}: field '{kind}.{key}' must be an object")
        try:
            lo, hi = book.owned_nodes(part, key) if nodes else book.owned_edges(part, key)
        except ArgumentError as exc:  # unknown type name in the schema
            raise PartitionFormatError(f"{cfile}: field '{kind}.{key}': {exc}") from None
        out[key] = {}
        for name, spec in feats.items():
            f = d / key / f"{name}.npy"
            arr = _load(f)
            try:
                shape = tuple(spec["shape"])
                dtype = np.dtype(spec["dtype"])
            except TypeError as exc:
                raise PartitionFormatError(
                    f"{cfile}: field '{kind}.{key}.{name}' is malformed ({exc})"
                ) from None
            if arr.dtype != dtype or arr.shape != (hi - lo, *shape[1:]):
                raise PartitionFormatError(
                    f"{f}: dtype {arr.dtype} shape {arr.shape}, expected {dtype} "
                    f"{(hi - lo, *shape[1:])} from {cfile} field '{kind}.{key}.{name}'"
                )
            out[key][name] = arr
    return out


@dataclass(frozen=True, eq=False)
class IdMapping:
    """Original <-> new ids, memory-mapped from ``OUT/mapping``.

    "Original" ids are the dataset's: homogeneous ids with the nodes of each type
    contiguous in ``node_types`` order (``orig_type_offsets``), so a dataset per-type
    id ``i`` of type ``t`` is the original homogeneous id ``orig_type_offsets[t] + i``.
    ``raw_ids[ntype]`` (when the dataset came from an importer) holds the raw input id
    of every node of that type, by dataset per-type id.
    """

    book: PartitionBook
    orig_nids: np.ndarray
    new_nids: np.ndarray
    orig_eids: np.ndarray
    new_eids: np.ndarray
    raw_ids: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def orig_type_offsets(self) -> np.ndarray:
        counts = [self.book.num_nodes_of(t) for t in self.book.node_types]
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def new_of_orig(self, ntype: str, orig_per_type: Any) -> np.ndarray:
        """New homogeneous ids of dataset per-type ids of ``ntype``."""
        t = self.book.ntype_id(ntype)
        offs = self.orig_type_offsets
        ids = check_ids(orig_per_type, "orig_per_type", int(offs[t + 1] - offs[t]), ntype)
        return np.asarray(self.new_nids[offs[t] + ids])

    def orig_of_new(self, new_ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(type id, dataset per-type id)`` of new homogeneous ids."""
        ids = check_ids(new_ids, "new_ids", len(self.orig_nids))
        orig = np.asarray(self.orig_nids[ids])
        offs = self.orig_type_offsets
        t = owners(offs, orig)
        return t.astype(np.int32), orig - offs[t]


def load_id_mapping(path: str | Path) -> IdMapping:
    """The id mappings of a partition directory, global or sharded (read into memory
    when sharded: the shards are concatenated)."""
    root = Path(path)
    cfg = load_partition_config(root)
    cfile = root / CONFIG_FILE
    book = PartitionBook.from_config(cfg, source=str(cfile))
    n, e = book.num_nodes, book.num_edges
    m = root / MAPPING_DIR
    i64 = np.dtype(np.int64)
    raw = cfg.get("id_maps") or {}
    if not isinstance(raw, dict):
        raise PartitionFormatError(f"{cfile}: field 'id_maps' must be an object")
    for ntype in raw:
        if ntype not in book.node_types:
            raise PartitionFormatError(
                f"{cfile}: field 'id_maps' names unknown node type {ntype!r}"
            )
    layout = cfg.get("mapping", {"layout": "global"})
    if not isinstance(layout, dict) or layout.get("layout") not in ("global", "sharded"):
        raise PartitionFormatError(f"{cfile}: field 'mapping.layout' must be global or sharded")
    if layout["layout"] == "sharded":
        return _load_sharded_mapping(root, cfg, book, layout, list(raw))
    raw_ids = {t: _load(m / "ids" / f"{t}.npy", None, book.num_nodes_of(t)) for t in raw}
    return IdMapping(
        book=book,
        orig_nids=_load(m / "orig_nids.npy", i64, n),
        new_nids=_load(m / "new_nids.npy", i64, n),
        orig_eids=_load(m / "orig_eids.npy", i64, e),
        new_eids=_load(m / "new_eids.npy", i64, e),
        raw_ids=raw_ids,
    )


def _shard_bounds(
    layout: dict[str, Any], key: str, parts: int, total: int, cfile: Path
) -> list[int]:
    val = layout.get(key)
    val = val if isinstance(val, list) and all(isinstance(x, int) for x in val) else []
    good = len(val) == parts + 1 and val[0] == 0 and val[-1] == total
    if not good or any(x > y for x, y in itertools.pairwise(val)):
        raise PartitionFormatError(
            f"{cfile}: field 'mapping.{key}' must hold {parts + 1} increasing ids from 0 to {total}"
        )
    return val


def _load_sharded_mapping(
    root: Path, cfg: dict[str, Any], book: PartitionBook, layout: dict[str, Any], raw: list[str]
) -> IdMapping:
    cfile = root / CONFIG_FILE
    p = book.num_parts
    nb = _shard_bounds(layout, "node_bounds", p, book.num_nodes, cfile)
    eb = _shard_bounds(layout, "edge_bounds", p, book.num_edges, cfile)
    i64 = np.dtype(np.int64)
    arrays: dict[str, list[np.ndarray]] = {k: [] for k in ("orig_n", "orig_e", "new_n", "new_e")}
    raw_ids: dict[str, list[np.ndarray]] = {t: [] for t in raw}
    for k in range(p):
        d = root / MAPPING_DIR / f"part-{k}"
        arrays["orig_n"].append(_load(d / "orig_nids.npy", i64, int(np.diff(book.node_offsets)[k])))
        arrays["orig_e"].append(_load(d / "orig_eids.npy", i64, int(np.diff(book.edge_offsets)[k])))
        arrays["new_n"].append(_load(d / "new_nids.npy", i64, nb[k + 1] - nb[k]))
        arrays["new_e"].append(_load(d / "new_eids.npy", i64, eb[k + 1] - eb[k]))
        for t in raw:
            raw_ids[t].append(_load(d / "ids" / f"{t}.npy"))
    ids = {t: np.concatenate(v) for t, v in raw_ids.items()}
    for t, v in ids.items():
        if v.shape != (book.num_nodes_of(t),):
            raise PartitionFormatError(
                f"{root / MAPPING_DIR}/part-*/ids/{t}.npy: {v.shape[0]} ids in all, "
                f"expected {book.num_nodes_of(t)}"
            )
    return IdMapping(
        book=book,
        orig_nids=np.concatenate(arrays["orig_n"]),
        new_nids=np.concatenate(arrays["new_n"]),
        orig_eids=np.concatenate(arrays["orig_e"]),
        new_eids=np.concatenate(arrays["new_e"]),
        raw_ids=ids,
    )
