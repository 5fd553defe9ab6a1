"""Import CSV or Parquet edge and node tables (read with pyarrow).

Layout of SRC (``EXT`` is ``csv`` or ``parquet``; one format per import)::

    SRC/
      edges.EXT                     src, dst [, etype] [, edge feature columns]
        or edges/S__R__D.EXT        one file per canonical edge type (S, R, D) = (src
                                    node type, relation, dst node type); columns src, dst
      nodes.EXT                     optional: id [, type] [, node feature columns]
        or nodes/T.EXT              one file per node type T; columns id [, features]

SRC may also be a single edges file (``edges.csv``: a homogeneous graph, no node table).

Conventions:

* **Node identity** is ``(node type, id)``. A homogeneous graph has the one node
  type ``_N``. ``etype`` values are canonical ``"src_type:relation:dst_type"``, or a
  bare relation name when there is one node type. Node tables with a ``type``
  column hold nodes of several types; edges of type ``S:R:D`` refer to ``S`` nodes
  by ``src`` and ``D`` nodes by ``dst``.
* **Ids** may be any integers (int64, not necessarily dense) or strings. They are
  mapped to dense per-type ids ``0..n-1``: in node-table row order when the type has
  a node table (every edge endpoint must then appear in it, ids must be unique), else
  in sorted order of the ids seen in the edges. The mapping is kept: the importer
  returns it and ``graphrun import`` stores it in the dataset (``ids/<type>.npy``).
* **Feature columns** are all other columns. ``label`` becomes an int64 label;
  ``train_mask``/``val_mask``/``test_mask`` (boolean or 0/1) become masks; numbered
  columns ``NAME_0 .. NAME_k`` become one 2-d feature ``NAME`` (so ``feat_0..feat_99``
  is ``feat`` of width 100); a Parquet list column becomes a 2-d feature; other
  columns keep their name. Floats become float32, integers int64, booleans bool.
  String feature columns and missing values are errors (in a shared node table,
  a column that is empty for a whole node type is simply absent for that type).

Every problem raises one :class:`DatasetError` line naming the file and column.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from graphrun.errors import DatasetError
from graphrun.graph.graph import DEFAULT_NTYPE, MASKS, Graph
from graphrun.graph.imported import FORMATS, Imported, detect_table_format
from graphrun.names import CanonicalEtype, etype_key, parse_etype_key

_NUMBERED = re.compile(r"^(.+)_(\d+)$")


@dataclass(eq=False)
class TablePart:
    """One node or edge table restricted to one type."""

    file: Path
    table: pa.Table
    rows: np.ndarray | None = None  # row numbers in the file, when split from a bigger table

    def row(self, i: int) -> int:
        return int(self.rows[i]) if self.rows is not None else i

    def full_column(self, name: str) -> pa.ChunkedArray:
        """Column ``name``; a DatasetError naming the first row where it is empty."""
        col = self.table.column(name)
        if col.null_count:
            i = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise DatasetError(f"{self.file}: column {name!r} is empty in row {self.row(i)}")
        return col


def read_table(path: Path, fmt: str) -> pa.Table:
    """Read one CSV/Parquet file; every failure is one DatasetError line naming it."""
    if not path.is_file():
        raise DatasetError(f"{path}: missing")
    try:
        if fmt == "csv":
            import pyarrow.csv as pacsv

            return pacsv.read_csv(path)
        import pyarrow.parquet as pq

        return pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatasetError(f"{path}: cannot read as {fmt} ({first})") from None


def split_by(part: TablePart, column: str) -> list[tuple[str, TablePart]]:
    """Split a table by the values of ``column`` (first-appearance order)."""
    col = part.table.column(column)
    if col.null_count:
        raise DatasetError(f"{part.file}: column {column!r} has missing values")
    col = col.cast(pa.string()) if not pa.types.is_string(col.type) else col
    out = []
    rest = part.table.drop_columns([column])
    for value in pc.unique(col).to_pylist():
        mask = pc.equal(col, value)
        rows = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
        if part.rows is not None:
            rows = part.rows[rows]
        out.append((str(value), TablePart(part.file, rest.filter(mask), rows)))
    return out


def table_files(root: Path, stem: str, fmt: str) -> list[tuple[str, Path]] | None:
    """``[(type_name, file)]`` from ``stem/*.fmt`` or ``[("", stem.fmt)]``; None if neither."""
    single, folder = root / f"{stem}.{fmt}", root / stem
    if single.is_file():
        return [("", single)]
    if folder.is_dir():
        found = sorted(folder.glob(f"*.{fmt}"))
        if not found:
            raise DatasetError(f"{folder}: holds no .{fmt} files")
        return [(f.name[: -len(fmt) - 1], f) for f in found]
    return None


def check_name(f: Path, what: str, name: str) -> str:
    """A node type or relation name: non-empty, no ``/`` or ``:``, not ``.``/``..``."""
    if not name or "/" in name or ":" in name or name in (".", ".."):
        raise DatasetError(f"{f}: {what} name {name!r} is not allowed (empty, '/', ':' or dots)")
    return name


def _checked_etype(f: Path, src: str, rel: str, dst: str) -> CanonicalEtype:
    return (check_name(f, "type", src), check_name(f, "relation", rel), check_name(f, "type", dst))


def parse_file_etype(f: Path, name: str) -> CanonicalEtype:
    parts = name.split("__")
    if len(parts) != 3 or not all(parts):
        raise DatasetError(f"{f}: file name must be SRCTYPE__RELATION__DSTTYPE.<ext>")
    return _checked_etype(f, *parts)


def parse_etype_value(f: Path, value: str, hetero_nodes: bool) -> CanonicalEtype:
    if value and ":" not in value and not hetero_nodes:
        return (DEFAULT_NTYPE, check_name(f, "relation", value), DEFAULT_NTYPE)
    try:
        etype = parse_etype_key(value)
    except DatasetError:
        raise DatasetError(
            f"{f}: column 'etype' value {value!r} is not 'src_type:relation:dst_type'"
        ) from None
    return _checked_etype(f, *etype)


def _require(part: TablePart, columns: Iterable[str]) -> None:
    for c in columns:
        if c not in part.table.column_names:
            raise DatasetError(f"{part.file}: column {c!r} is missing")


def _check_id_column(part: TablePart, column: str) -> pa.ChunkedArray:
    col = part.full_column(column)
    t = col.type
    if pa.types.is_dictionary(t):  # e.g. a pandas categorical written to Parquet
        t = t.value_type
        col = col.cast(t)
    if pa.types.is_integer(t):
        return col.cast(pa.int64())
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return col.cast(pa.string())
    raise DatasetError(
        f"{part.file}: column {column!r} has type {t}; ids must be integers or strings"
    )


def _to_numpy_ids(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    if pa.types.is_integer(arr.type):
        return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.asarray(arr.to_numpy(zero_copy_only=False).astype(str))


def _unify(cols: list[pa.ChunkedArray]) -> list[pa.ChunkedArray]:
    """Integer and string ids of one type: compare them all as strings."""
    if all(pa.types.is_integer(c.type) for c in cols):
        return cols
    return [c.cast(pa.string()) for c in cols]


def _column_numpy(part: TablePart, name: str) -> np.ndarray:
    col = part.full_column(name)
    where = f"{part.file}: column {name!r}"
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        flat = pc.list_flatten(col)
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths != lengths[0]).any():
            raise DatasetError(f"{where}: lists of different lengths")
        values = _scalar_numpy(where, flat.type, flat)
        return values.reshape(len(col), int(lengths[0]) if len(lengths) else 0)
    return _scalar_numpy(where, t, col)


def _scalar_numpy(where: str, t: pa.DataType, col: Any) -> np.ndarray:
    arr = col.to_numpy(zero_copy_only=False) if hasattr(col, "to_numpy") else np.asarray(col)
    if pa.types.is_floating(t):
        return np.asarray(arr, dtype=np.float32)
    if pa.types.is_integer(t):
        return np.asarray(arr, dtype=np.int64)
    if pa.types.is_boolean(t):
        return np.asarray(arr, dtype=bool)
    raise DatasetError(f"{where} has type {t}; feature columns must be numeric or boolean")


def features(part: TablePart, skip: set[str]) -> dict[str, np.ndarray]:
    """Feature arrays of one table (see the module docstring for the naming rules)."""
    names = [c for c in part.table.column_names if c not in skip]
    present = set()
    for c in names:
        col = part.table.column(c)
        if len(col) and col.null_count == len(col):
            continue  # a shared table's column for another node type
        present.add(c)
    groups: dict[str, list[tuple[int, str]]] = {}
    for c in names:
        m = _NUMBERED.match(c)
        if c in present and m and m.group(1) not in present:
            groups.setdefault(m.group(1), []).append((int(m.group(2)), c))
    out: dict[str, np.ndarray] = {}
    grouped: set[str] = set()
    for base, members in groups.items():
        members.sort()
        if [i for i, _ in members] != list(range(len(members))):
            continue  # not 0..k-1: keep the columns as they are
        cols = [_column_numpy(part, c) for _, c in members]
        out[base] = np.stack(cols, axis=1) if cols else np.empty((part.table.num_rows, 0))
        if out[base].dtype == np.float64:
            out[base] = out[base].astype(np.float32)
        grouped.update(c for _, c in members)
    for c in names:
        if c in present and c not in grouped:
            out[c] = _column_numpy(part, c)
    if "label" in out and out["label"].dtype != np.int64:
        raise DatasetError(f"{part.file}: column 'label' must hold integers")
    for mask in MASKS:
        if mask in out:
            v = out[mask]
            if v.dtype != bool and not np.isin(v, (0, 1)).all():
                raise DatasetError(f"{part.file}: column {mask!r} must be boolean or 0/1")
            out[mask] = v.astype(bool)
    return out


def _read_nodes(root: Path, fmt: str) -> dict[str, TablePart]:
    nodes: dict[str, TablePart] = {}
    for tname, f in table_files(root, "nodes", fmt) or []:
        part = TablePart(f, read_table(f, fmt))
        _require(part, ["id"])
        if tname:
            nodes[check_name(f, "node type", tname)] = part
        elif "type" in part.table.column_names:
            nodes.update((check_name(f, "node type", t), p) for t, p in split_by(part, "type"))
        else:
            nodes[DEFAULT_NTYPE] = part
    return nodes


def _read_edges(
    root: Path, fmt: str, nodes: dict[str, TablePart]
) -> list[tuple[CanonicalEtype, TablePart]]:
    files = [("", root)] if root.is_file() else table_files(root, "edges", fmt)
    if files is None:
        raise DatasetError(f"{root}: no edges.{fmt} and no edges/ folder of .{fmt} files")
    only = next(iter(nodes)) if len(nodes) == 1 else DEFAULT_NTYPE
    edges: list[tuple[CanonicalEtype, TablePart]] = []
    for tname, f in files:
        part = TablePart(f, read_table(f, fmt))
        _require(part, ["src", "dst"])
        if tname:
            edges.append((parse_file_etype(f, tname), part))
        elif "etype" in part.table.column_names:
            for value, p in split_by(part, "etype"):
                et = parse_etype_value(f, value, len(nodes) > 1)
                if et[0] == DEFAULT_NTYPE and et[2] == DEFAULT_NTYPE:
                    et = (only, et[1], only)
                edges.append((et, p))
        elif len(nodes) > 1:
            raise DatasetError(f"{f}: needs an 'etype' column (the nodes have several types)")
        else:
            edges.append(((only, "_E", only), part))
    return edges


def _node_ids(
    ntype: str, nodes: dict[str, TablePart], ends: list[tuple[TablePart, str]]
) -> pa.Array:
    """The original ids of one node type in dense-id order."""
    if ntype in nodes:
        part = nodes[ntype]
        ids = _check_id_column(part, "id")
        arr = _to_numpy_ids(ids)
        uniq, counts = np.unique(arr, return_counts=True)
        if (counts > 1).any():
            dup = uniq[counts > 1][0].item()
            rows = np.flatnonzero(arr == dup)
            raise DatasetError(
                f"{part.file}: id {dup!r} appears twice (rows {rows[0]} and {rows[1]})"
            )
        return ids.combine_chunks()
    cols = [_check_id_column(p, c) for p, c in ends]
    cols = _unify(cols)
    merged = pa.chunked_array([ch for c in cols for ch in c.chunks], type=cols[0].type)
    return pa.array(np.unique(_to_numpy_ids(merged)))


def _dense(part: TablePart, column: str, ids: pa.Array, ntype: str) -> np.ndarray:
    col = _check_id_column(part, column)
    if pa.types.is_integer(col.type) != pa.types.is_integer(ids.type):
        col, ids = col.cast(pa.string()), ids.cast(pa.string())
    idx = pc.index_in(col, value_set=ids)
    if idx.null_count:
        i = int(np.flatnonzero(idx.is_null().to_numpy(zero_copy_only=False))[0])
        raise DatasetError(
            f"{part.file}: row {part.row(i)}: {column} id {col[i].as_py()!r} is not a known "
            f"{ntype!r} node (not in its node table)"
        )
    return np.asarray(idx.to_numpy(zero_copy_only=False), dtype=np.int64)


def import_tables(path: str | Path, fmt: str | None = None, name: str | None = None) -> Imported:
    """Build a graph from CSV/Parquet tables (see the module docstring)."""
    root = Path(path)
    if not root.exists():
        raise DatasetError(f"{root}: no such file or directory")
    fmt = fmt or detect_table_format(root)
    if fmt not in FORMATS:
        raise DatasetError(f"{root}: no edges.csv/edges.parquet or edges/ folder found")
    nodes = {} if root.is_file() else _read_nodes(root, fmt)
    edges = _read_edges(root, fmt, nodes)
    ntypes = list(nodes)
    for et, _ in edges:
        for t in (et[0], et[2]):
            if t not in ntypes:
                ntypes.append(t)
    id_maps: dict[str, np.ndarray] = {}
    dense_ids: dict[str, pa.Array] = {}
    for t in ntypes:
        ends = [(p, "src") for et, p in edges if et[0] == t]
        ends += [(p, "dst") for et, p in edges if et[2] == t]
        dense_ids[t] = _node_ids(t, nodes, ends)
        id_maps[t] = _to_numpy_ids(dense_ids[t])
    counts = [len(dense_ids[t]) for t in ntypes]
    offsets = dict(zip(ntypes, np.concatenate([[0], np.cumsum(counts)]).tolist(), strict=False))
    srcs, dsts, edata = [], [], {}
    for et, part in edges:
        srcs.append(_dense(part, "src", dense_ids[et[0]], et[0]) + offsets[et[0]])
        dsts.append(_dense(part, "dst", dense_ids[et[2]], et[2]) + offsets[et[2]])
        feats = features(part, {"src", "dst"})
        if feats:
            edata[etype_key(et)] = feats
    ndata = {}
    for t, part in nodes.items():
        feats = features(part, {"id"})
        if feats:
            ndata[t] = feats
    try:
        graph = Graph(
            num_nodes=int(sum(counts)),
            src=np.concatenate(srcs),
            dst=np.concatenate(dsts),
            node_types=tuple(ntypes),
            edge_types=tuple(et for et, _ in edges),
            node_type_offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            edge_type_offsets=np.concatenate([[0], np.cumsum([len(s) for s in srcs])]).astype(
                np.int64
            ),
            ndata=ndata,
            edata=edata,
            name=name or root.stem,
        )
    except DatasetError as exc:
        raise DatasetError(f"{root}: {exc}") from None
    return Imported(graph, id_maps)
