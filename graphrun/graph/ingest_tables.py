"""Node and edge tables read in bounded, checked chunks: what ``graphrun ingest`` sends
to a live store (issue 42), one chunk a write batch.

Layout of SRC (``EXT`` is ``csv`` or ``parquet``; the same conventions as ``graphrun
import``, :mod:`graphrun.graph.tables`, whose column rules apply)::

    SRC/
      nodes.EXT or nodes/T.EXT      id [, type] [, label, train_mask, feat_0 .. feat_k, ...]
      edges.EXT or edges/S__R__D.EXT  src, dst [, etype] [, edge feature columns]

    SRC/ (npy, a homogeneous graph)
      nodes/id.npy [, NAME.npy ...]   original ids of the new nodes; NAME.npy: one row
                                      per id, the node feature NAME (label, feat, ...)
      edges/src.npy, edges/dst.npy [, NAME.npy ...]   original ids of the ends; edge features

Either part may be absent (edges between nodes already in the store; nodes without
edges). Ids are the user's own **integer** ids: a new node's ``id``, an edge's ``src``
and ``dst`` (a node already in the store or added by an earlier chunk). Every node file
is read before any edge file, so an edge's new endpoint exists when the edge is sent.
An edge table without ``etype`` holds the homogeneous edge type ``_N:_E:_N``; a bare
relation in ``etype`` is resolved by the store (a unique relation).

Chunks: at most ``chunk_rows`` rows of one file (:data:`MAX_CHUNK_ROWS`) and
:data:`MAX_CHUNK_BYTES` of arrays; a chunk of a table with a ``type``/``etype`` column is
split by type. Each chunk is checked whole before it is yielded (ids integer and present,
node ids not repeated in the chunk, features numeric, rows of equal count); a bad chunk
is one :class:`DatasetError` line naming the file, the row (counted from 0, the header
not counted) or the column, and what is wrong. :func:`plan_sources` checks the layout
and every file's columns before a row is read (the command calls it before it connects).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import pyarrow as pa

from graphrun.errors import ArgumentError, DatasetError
from graphrun.graph.format import load_npy
from graphrun.graph.graph import DEFAULT_ETYPE, DEFAULT_NTYPE
from graphrun.graph.imported import FORMATS
from graphrun.graph.tables import (
    MASKS,
    TablePart,
    check_name,
    features,
    parse_etype_value,
    parse_file_etype,
    split_by,
    table_files,
)
from graphrun.names import CanonicalEtype

MAX_CHUNK_ROWS = 1 << 21  # the store's rows of one piece (store/live.py MAX_PIECE_ROWS)
DEFAULT_CHUNK_ROWS = 10_000
MAX_CHUNK_BYTES = 128 << 20  # half a store request's bound (256 MiB): a piece fits
CSV_BLOCK_BYTES = 4 << 20
Kind = Literal["nodes", "edges"]
ID_COLUMNS: dict[Kind, tuple[str, ...]] = {"nodes": ("id",), "edges": ("src", "dst")}


@dataclass(frozen=True)
class Source:
    """One file (or, for npy, one folder) to read: nodes or edges, and its type when the
    file name gives it (``nodes/T.EXT``, ``edges/S__R__D.EXT``)."""

    kind: Kind
    path: Path
    fmt: str
    ntype: str = ""
    etype: CanonicalEtype | None = None


@dataclass(frozen=True, eq=False)
class NodeChunk:
    """New nodes of one type: original ids and their feature rows."""

    file: Path
    rows: np.ndarray  # each row's number in the file
    ntype: str
    ids: np.ndarray  # int64
    features: dict[str, np.ndarray] = field(default_factory=dict)

    def where(self) -> str:
        return f"{self.file}: rows {int(self.rows[0])}..{int(self.rows[-1])}"


@dataclass(frozen=True, eq=False)
class EdgeChunk:
    """New edges of one type: the original ids of their ends and their feature rows."""

    file: Path
    rows: np.ndarray
    etype: CanonicalEtype | str  # a triple, or a relation the store resolves
    src: np.ndarray  # int64
    dst: np.ndarray
    features: dict[str, np.ndarray] = field(default_factory=dict)

    def where(self) -> str:
        return f"{self.file}: rows {int(self.rows[0])}..{int(self.rows[-1])}"


Chunk = NodeChunk | EdgeChunk
C = TypeVar("C", NodeChunk, EdgeChunk)


def detect(root: Path) -> str:
    """``csv``, ``parquet`` or ``npy``: the one format of SRC's tables."""
    if root.is_file():
        if root.suffix[1:] in FORMATS:
            return root.suffix[1:]
        raise DatasetError(f"{root}: not a .csv or .parquet file")
    found = [
        fmt
        for fmt in FORMATS
        if any(
            (root / f"{k}.{fmt}").is_file() or any((root / k).glob(f"*.{fmt}")) for k in ID_COLUMNS
        )
    ]
    if (root / "nodes" / "id.npy").is_file() or (root / "edges" / "src.npy").is_file():
        found.append("npy")
    if len(found) != 1:
        what = "no" if not found else f"several formats of ({', '.join(found)})"
        raise DatasetError(
            f"{root}: holds {what} node or edge tables (see `graphrun ingest --help`)"
        )
    return found[0]


def plan_sources(root: Path, fmt: str | None = None) -> list[Source]:
    """Every file to read, nodes first, each one's columns checked (nothing read yet)."""
    if not root.exists():
        raise DatasetError(f"{root}: no such file or directory")
    fmt = fmt or detect(root)
    if fmt == "npy":
        out = [Source(k, root / k, fmt) for k in ID_COLUMNS if (root / k).is_dir()]
        for s in out:
            _npy_arrays(s)
        if not out:
            raise DatasetError(f"{root}: holds no nodes/ or edges/ folder of .npy arrays")
        return out
    if fmt not in FORMATS:
        raise DatasetError(f"{root}: format {fmt!r} is not one of npy, csv, parquet")
    if root.is_file():
        out = [Source("edges", root, fmt)]
    else:
        out = []
        for kind in ID_COLUMNS:
            for name, f in table_files(root, kind, fmt) or []:
                if not name:
                    out.append(Source(kind, f, fmt))
                elif kind == "nodes":
                    out.append(Source(kind, f, fmt, ntype=check_name(f, "node type", name)))
                else:
                    out.append(Source(kind, f, fmt, etype=parse_file_etype(f, name)))
        if not out:
            raise DatasetError(f"{root}: no nodes.{fmt}/edges.{fmt} or nodes/ or edges/ folder")
    for s in out:
        missing = [c for c in ID_COLUMNS[s.kind] if c not in _schema(s).names]
        if missing:
            raise DatasetError(f"{s.path}: column {missing[0]!r} is missing")
    return out


def _schema(s: Source) -> pa.Schema:
    try:
        if s.fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.read_schema(s.path)
        import pyarrow.csv as pacsv

        with pacsv.open_csv(s.path, read_options=_csv_options()) as reader:
            return reader.schema
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DatasetError(f"{s.path}: cannot read as {s.fmt} ({_first_line(exc)})") from None


def _csv_options() -> Any:
    import pyarrow.csv as pacsv

    return pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _npy_arrays(s: Source) -> dict[str, np.ndarray]:
    """The folder's arrays (memory-mapped), ids first, every one of the ids' length."""
    need = ID_COLUMNS[s.kind]
    arrays = {name: load_npy(s.path / f"{name}.npy") for name in need}
    for f in sorted(s.path.glob("*.npy")):
        if f.stem not in arrays:
            arrays[f.stem] = load_npy(f)
    n = len(arrays[need[0]])
    for name, a in arrays.items():
        f = s.path / f"{name}.npy"
        if a.ndim == 0 or len(a) != n:
            raise DatasetError(f"{f}: has {len(a) if a.ndim else 0} rows, {need[0]}.npy has {n}")
        if name in need and (a.ndim != 1 or a.dtype.kind not in "iu"):
            raise DatasetError(f"{f}: expected 1-d integer ids, got {a.dtype} {a.shape}")
        if a.dtype.kind not in "biuf":
            raise DatasetError(f"{f}: dtype {a.dtype}; features must be numeric or boolean")
    return arrays


def _npy_features(path: Path, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for name, a in arrays.items():
        kind = a.dtype.kind
        dtype = np.float32 if kind == "f" else bool if kind == "b" else np.int64
        out[name] = np.ascontiguousarray(a, dtype=dtype)
    if "label" in out and arrays["label"].dtype.kind not in "iu":
        raise DatasetError(f"{path / 'label.npy'}: labels must be integers")
    for mask in MASKS:
        if mask in out and not np.isin(out[mask], (0, 1)).all():
            raise DatasetError(f"{path / (mask + '.npy')}: must be boolean or 0/1")
        if mask in out:
            out[mask] = out[mask].astype(bool)
    return out


def _npy_chunks(s: Source, chunk_rows: int) -> Iterator[Chunk]:
    arrays = _npy_arrays(s)
    need = ID_COLUMNS[s.kind]
    n = len(arrays[need[0]])
    for a in range(0, n, chunk_rows):
        rows = np.arange(a, min(n, a + chunk_rows))
        part = {k: v[a : a + chunk_rows] for k, v in arrays.items()}
        ids = [np.asarray(part.pop(c), dtype=np.int64) for c in need]
        feats = _npy_features(s.path, part)
        if s.kind == "nodes":
            yield _checked_nodes(s.path / "id.npy", rows, DEFAULT_NTYPE, ids[0], feats)
        else:
            yield _sized(EdgeChunk(s.path, rows, DEFAULT_ETYPE, ids[0], ids[1], feats))


def _tables(s: Source, chunk_rows: int) -> Iterator[tuple[int, pa.Table]]:
    """``(first row, table)`` of at most ``chunk_rows`` rows each."""
    first, count = 0, 0
    try:
        if s.fmt == "parquet":
            import pyarrow.parquet as pq

            batches = pq.ParquetFile(s.path).iter_batches(batch_size=chunk_rows)
        else:
            import pyarrow.csv as pacsv

            batches = pacsv.open_csv(s.path, read_options=_csv_options())
        held: list[pa.RecordBatch] = []
        for batch in batches:
            held.append(batch)
            count += batch.num_rows
            while count >= chunk_rows:
                table = pa.Table.from_batches(held).combine_chunks()
                yield first, table.slice(0, chunk_rows)
                rest = table.slice(chunk_rows)
                held, count, first = rest.to_batches(), rest.num_rows, first + chunk_rows
        if count:
            yield first, pa.Table.from_batches(held).combine_chunks()
    except (pa.ArrowException, OSError, ValueError) as exc:
        where = f"after row {first + count}" if s.fmt == "csv" else "reading"
        raise DatasetError(f"{s.path}: {where}: {_first_line(exc)}") from None


def _int_ids(part: TablePart, column: str) -> np.ndarray:
    col = part.full_column(column)
    t = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
    if not pa.types.is_integer(t):
        raise DatasetError(
            f"{part.file}: column {column!r} has type {t}; ingest takes integer original ids"
        )
    return np.asarray(col.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def _checked_nodes(
    file: Path, rows: np.ndarray, ntype: str, ids: np.ndarray, feats: dict[str, np.ndarray]
) -> NodeChunk:
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        dup = int(uniq[counts > 1][0])
        a, b = np.flatnonzero(ids == dup)[:2]
        raise DatasetError(f"{file}: id {dup} appears twice (rows {rows[a]} and {rows[b]})")
    return _sized(NodeChunk(file, rows, ntype, ids, feats))


def _sized(chunk: C) -> C:
    arrays = [*chunk.features.values()]
    arrays += [chunk.ids] if isinstance(chunk, NodeChunk) else [chunk.src, chunk.dst]
    size = sum(a.nbytes for a in arrays)
    if size > MAX_CHUNK_BYTES:
        raise DatasetError(
            f"{chunk.where()}: {size} bytes, over the bound of {MAX_CHUNK_BYTES} a chunk; "
            "give a smaller --chunk-rows"
        )
    return chunk


def _table_chunks(s: Source, chunk_rows: int) -> Iterator[Chunk]:
    for first, table in _tables(s, chunk_rows):
        whole = TablePart(s.path, table, np.arange(first, first + table.num_rows))
        if s.kind == "nodes":
            if s.ntype or "type" not in table.column_names:
                typed = [(s.ntype or DEFAULT_NTYPE, whole)]
            else:
                typed = [
                    (check_name(s.path, "node type", t), p) for t, p in split_by(whole, "type")
                ]
            for ntype, part in typed:
                ids = _int_ids(part, "id")
                feats = features(part, {"id"})
                yield _checked_nodes(s.path, _rows(part), ntype, ids, feats)
            continue
        if s.etype is not None or "etype" not in table.column_names:
            etyped: list[tuple[CanonicalEtype | str, TablePart]] = [
                (s.etype or DEFAULT_ETYPE, whole)
            ]
        else:
            etyped = [(_etype(s.path, v), p) for v, p in split_by(whole, "etype")]
        for etype, part in etyped:
            src, dst = _int_ids(part, "src"), _int_ids(part, "dst")
            feats = features(part, {"src", "dst"})
            yield _sized(EdgeChunk(s.path, _rows(part), etype, src, dst, feats))


def _rows(part: TablePart) -> np.ndarray:
    return part.rows if part.rows is not None else np.arange(part.table.num_rows)


def _etype(f: Path, value: str) -> CanonicalEtype | str:
    """A ``etype`` value: a canonical triple, or a bare relation the store resolves."""
    if value and ":" not in value:
        return check_name(f, "relation", value)
    return parse_etype_value(f, value, True)


def read_chunks(sources: list[Source], chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[Chunk]:
    """Every source's chunks, in order, each checked whole before it is yielded."""
    if not 1 <= chunk_rows <= MAX_CHUNK_ROWS:
        raise ArgumentError(f"chunk_rows: {chunk_rows} is not in [1, {MAX_CHUNK_ROWS}]")
    for s in sources:
        if s.fmt == "npy":
            yield from _npy_chunks(s, chunk_rows)
        else:
            yield from _table_chunks(s, chunk_rows)
