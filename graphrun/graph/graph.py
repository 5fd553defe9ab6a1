"""The in-memory graph: one type for homogeneous and heterogeneous graphs.

A heterograph is one homogeneous graph plus type information, as DGL's
distributed-heterograph RFC proposes:

* Nodes have global ids ``0 .. num_nodes-1``. Nodes of one type are contiguous:
  type ``t`` owns ids ``node_type_offsets[t] .. node_type_offsets[t+1]-1``, so a
  node's type id and per-type id follow from its global id (``node_type_ids()``,
  ``node_per_type_ids()``) without storing an array per node.
* Edges are COO arrays ``src``/``dst`` (int64, global node ids); the edge id is the
  position. Edges of one canonical type are contiguous in the same way
  (``edge_type_offsets``).
* ``node_types`` are names; ``edge_types`` are canonical ``(src_type, relation,
  dst_type)`` triples. A homogeneous graph has one node type ``"_N"`` and one edge
  type ``("_N", "_E", "_N")``.
* ``ndata[ntype][name]`` holds a node feature (first dimension = number of nodes of
  that type, rows in per-type id order); ``edata[etype_key][name]`` likewise for
  edges, keyed by ``"src:rel:dst"``. Labels are ``ndata[t]["label"]``; splits are
  boolean masks ``train_mask``/``val_mask``/``test_mask``.

CSR (out-edges) and CSC (in-edges) are built on demand and cached: ``csc()`` gives
``(indptr, indices, eids)`` with ``indices`` the source of every in-edge of a
destination node, which is what neighbour sampling reads.

The constructor validates everything and names the array and the first offending
index in a :class:`~graphrun.errors.DatasetError`.
"""

from __future__ import annotations

import contextlib
import mmap
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from graphrun.errors import DatasetError
from graphrun.names import CanonicalEtype, etype_key, parse_etype_key, resolve_etype

DEFAULT_NTYPE = "_N"
SPLITS = ("train", "val", "test")  # the node splits, each a boolean ``<split>_mask`` feature
MASKS = tuple(f"{s}_mask" for s in SPLITS)
DEFAULT_ETYPE = ("_N", "_E", "_N")
SLICE = 1 << 23  # entries a check reads before it lets go of the pages it mapped


def release(arr: np.ndarray) -> None:
    """Unmap the resident pages of a memory-mapped ``arr`` (its whole file) from this
    process: they stay in the page cache and a later read maps them again, but they
    stop counting in its RSS. A pass over a large mapped array calls it slice by slice
    so that the pass holds one slice, not the file. No-op for an array in memory."""
    base = arr.base
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, mmap.mmap):
        with contextlib.suppress(ValueError, OSError):  # closed, or no madvise here
            base.madvise(mmap.MADV_DONTNEED)


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_int_array(name: str, arr: np.ndarray) -> None:
    if not isinstance(arr, np.ndarray):
        raise DatasetError(f"{name}: expected a numpy array, got {type(arr).__name__}")
    if arr.ndim != 1:
        raise DatasetError(f"{name}: expected a 1-d array, got shape {arr.shape}")
    if arr.dtype != np.int64:
        raise DatasetError(f"{name}: expected dtype int64, got {arr.dtype}")


def _check_ids(name: str, ids: np.ndarray, n: int) -> None:
    for start in range(0, len(ids), SLICE):  # in slices: a mapped file is not all held
        piece = ids[start : start + SLICE]
        lo, hi = int(piece.min()), int(piece.max())
        if lo < 0 or hi >= n:
            i = start + _first_bad((piece < 0) | (piece >= n))
            raise DatasetError(f"{name}[{i}] = {int(ids[i])} is out of range [0, {n})")
        release(ids)


def _check_offsets(name: str, offsets: np.ndarray, total: int, count: int) -> None:
    _check_int_array(name, offsets)
    if len(offsets) != count + 1:
        raise DatasetError(f"{name}: expected {count + 1} entries, got {len(offsets)}")
    if offsets[0] != 0 or offsets[-1] != total:
        raise DatasetError(f"{name}: must start at 0 and end at {total}")
    if np.any(np.diff(offsets) < 0):
        raise DatasetError(f"{name}[{_first_bad(np.diff(offsets) < 0) + 1}] decreases")


def build_compressed(
    keys: np.ndarray, values: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group ``values`` by ``keys`` (0..n-1): returns ``(indptr, values_sorted, order)``.

    ``order`` is the stable permutation that sorts by key (the edge ids when
    ``keys``/``values`` are edge endpoints).
    """
    order = np.argsort(keys, kind="stable")
    counts = np.bincount(keys, minlength=n)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, values[order], order.astype(np.int64, copy=False)


@dataclass(frozen=True, eq=False)
class Graph:
    """A validated graph. See the module docstring for the layout."""

    num_nodes: int
    src: np.ndarray
    dst: np.ndarray
    node_types: tuple[str, ...] = (DEFAULT_NTYPE,)
    edge_types: tuple[CanonicalEtype, ...] = (DEFAULT_ETYPE,)
    node_type_offsets: np.ndarray | None = None
    edge_type_offsets: np.ndarray | None = None
    ndata: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    edata: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    name: str = "graph"

    def __post_init__(self) -> None:
        if self.node_type_offsets is None:
            if len(self.node_types) != 1:
                raise DatasetError("node_type_offsets: required with more than one node type")
            object.__setattr__(
                self, "node_type_offsets", np.array([0, self.num_nodes], dtype=np.int64)
            )
        if self.edge_type_offsets is None:
            if len(self.edge_types) != 1:
                raise DatasetError("edge_type_offsets: required with more than one edge type")
            object.__setattr__(
                self, "edge_type_offsets", np.array([0, len(self.src)], dtype=np.int64)
            )
        object.__setattr__(self, "node_types", tuple(self.node_types))
        object.__setattr__(self, "edge_types", tuple(tuple(e) for e in self.edge_types))
        self.validate()

    # ---- validation -------------------------------------------------------------

    def validate(self) -> None:
        if not isinstance(self.num_nodes, int | np.integer) or self.num_nodes < 0:
            raise DatasetError(f"num_nodes: expected a non-negative integer, got {self.num_nodes}")
        _check_int_array("src", self.src)
        _check_int_array("dst", self.dst)
        if len(self.src) != len(self.dst):
            raise DatasetError(
                f"src and dst have different lengths ({len(self.src)} vs {len(self.dst)})"
            )
        _check_ids("src", self.src, self.num_nodes)
        _check_ids("dst", self.dst, self.num_nodes)
        if len(set(self.node_types)) != len(self.node_types):
            raise DatasetError(f"node_types: duplicate names in {list(self.node_types)}")
        if len(set(self.edge_types)) != len(self.edge_types):
            raise DatasetError("edge_types: duplicate canonical edge types")
        for et in self.edge_types:
            if len(et) != 3:
                raise DatasetError(f"edge_types: {et!r} is not (src_type, relation, dst_type)")
            for t in (et[0], et[2]):
                if t not in self.node_types:
                    raise DatasetError(f"edge type {etype_key(et)}: unknown node type {t!r}")
        assert self.node_type_offsets is not None and self.edge_type_offsets is not None
        _check_offsets(
            "node_type_offsets", self.node_type_offsets, self.num_nodes, len(self.node_types)
        )
        _check_offsets(
            "edge_type_offsets", self.edge_type_offsets, self.num_edges, len(self.edge_types)
        )
        if self.is_hetero:
            self._check_edge_endpoint_types()
        for ntype, feats in self.ndata.items():
            if ntype not in self.node_types:
                raise DatasetError(f"ndata: unknown node type {ntype!r}")
            n = self.num_nodes_of(ntype)
            for fname, arr in feats.items():
                _check_rows(f"ndata[{ntype!r}][{fname!r}]", arr, n)
        keys = {etype_key(e) for e in self.edge_types}
        for ekey, feats in self.edata.items():
            if ekey not in keys:
                raise DatasetError(f"edata: unknown edge type {ekey!r}")
            m = self.num_edges_of(parse_etype_key(ekey))
            for fname, arr in feats.items():
                _check_rows(f"edata[{ekey!r}][{fname!r}]", arr, m)

    def _check_edge_endpoint_types(self) -> None:
        assert self.edge_type_offsets is not None and self.node_type_offsets is not None
        nto = self.node_type_offsets
        for r, et in enumerate(self.edge_types):
            a, b = int(self.edge_type_offsets[r]), int(self.edge_type_offsets[r + 1])
            for end, arr, t in (("src", self.src, et[0]), ("dst", self.dst, et[2])):
                ti = self.node_types.index(t)
                lo, hi = int(nto[ti]), int(nto[ti + 1])
                seg = arr[a:b]
                bad = (seg < lo) | (seg >= hi)
                if bad.any():
                    i = a + _first_bad(bad)
                    raise DatasetError(
                        f"{end}[{i}] = {int(arr[i])} is not a {t!r} node "
                        f"(edge type {etype_key(et)} needs ids in [{lo}, {hi}))"
                    )

    # ---- sizes and types --------------------------------------------------------

    @property
    def num_edges(self) -> int:
        return len(self.src)

    @property
    def is_hetero(self) -> bool:
        return len(self.node_types) > 1 or len(self.edge_types) > 1

    def num_nodes_of(self, ntype: str) -> int:
        t = self._ntype_index(ntype)
        nto = self.node_type_offsets
        assert nto is not None
        return int(nto[t + 1] - nto[t])

    def num_edges_of(self, etype: CanonicalEtype | str) -> int:
        r = self._etype_index(etype)
        eto = self.edge_type_offsets
        assert eto is not None
        return int(eto[r + 1] - eto[r])

    def _ntype_index(self, ntype: str) -> int:
        try:
            return self.node_types.index(ntype)
        except ValueError:
            raise DatasetError(
                f"unknown node type {ntype!r}; known: {list(self.node_types)}"
            ) from None

    def _etype_index(self, etype: CanonicalEtype | str) -> int:
        return resolve_etype(etype, self.edge_types, "etype", DatasetError)

    def node_type_ids(self) -> np.ndarray:
        """Node type id of every node (int32)."""
        assert self.node_type_offsets is not None
        return np.repeat(
            np.arange(len(self.node_types), dtype=np.int32), np.diff(self.node_type_offsets)
        )

    def node_per_type_ids(self) -> np.ndarray:
        """Per-type id of every node (int64)."""
        assert self.node_type_offsets is not None
        return np.arange(self.num_nodes, dtype=np.int64) - np.repeat(
            self.node_type_offsets[:-1], np.diff(self.node_type_offsets)
        )

    def edge_type_ids(self) -> np.ndarray:
        """Edge type id of every edge (int32)."""
        assert self.edge_type_offsets is not None
        return np.repeat(
            np.arange(len(self.edge_types), dtype=np.int32), np.diff(self.edge_type_offsets)
        )

    def edge_per_type_ids(self) -> np.ndarray:
        """Per-type id of every edge (int64)."""
        assert self.edge_type_offsets is not None
        return np.arange(self.num_edges, dtype=np.int64) - np.repeat(
            self.edge_type_offsets[:-1], np.diff(self.edge_type_offsets)
        )

    def node_ids_of(self, ntype: str) -> np.ndarray:
        """Global ids of the nodes of one type."""
        t = self._ntype_index(ntype)
        assert self.node_type_offsets is not None
        return np.arange(self.node_type_offsets[t], self.node_type_offsets[t + 1], dtype=np.int64)

    # ---- adjacency --------------------------------------------------------------

    @cached_property
    def _csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return build_compressed(self.dst, self.src, self.num_nodes)

    @cached_property
    def _csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return build_compressed(self.src, self.dst, self.num_nodes)

    def csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """In-edges: ``(indptr[num_nodes+1], src_of_in_edge[E], edge_id[E])``."""
        return self._csc

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Out-edges: ``(indptr[num_nodes+1], dst_of_out_edge[E], edge_id[E])``."""
        return self._csr

    def in_degrees(self) -> np.ndarray:
        return np.bincount(self.dst, minlength=self.num_nodes).astype(np.int64)

    def out_degrees(self) -> np.ndarray:
        return np.bincount(self.src, minlength=self.num_nodes).astype(np.int64)

    def __repr__(self) -> str:
        kind = "hetero" if self.is_hetero else "homo"
        return (
            f"Graph(name={self.name!r}, {kind}, num_nodes={self.num_nodes}, "
            f"num_edges={self.num_edges}, node_types={list(self.node_types)}, "
            f"edge_types={[etype_key(e) for e in self.edge_types]})"
        )


def _check_rows(name: str, arr: object, n: int) -> None:
    if not isinstance(arr, np.ndarray):
        raise DatasetError(f"{name}: expected a numpy array, got {type(arr).__name__}")
    if arr.ndim == 0 or arr.shape[0] != n:
        raise DatasetError(f"{name}: expected {n} rows, got shape {arr.shape}")
    if arr.dtype == object:
        raise DatasetError(f"{name}: object arrays are not supported")
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise DatasetError(f"{name}: complex values ({arr.dtype}) are not supported")
    if np.issubdtype(arr.dtype, np.floating):
        _check_finite(name, arr)


def _check_finite(name: str, arr: np.ndarray, rows_per_chunk: int = 1 << 16) -> None:
    """NaN or infinite features train a model to NaN and report success: refuse them,
    naming the first bad row (chunked: a memory-mapped feature is never copied whole)."""
    for lo in range(0, arr.shape[0], rows_per_chunk):
        chunk = arr[lo : lo + rows_per_chunk]
        bad = ~np.isfinite(chunk)
        release(arr)  # a mapped file: one slice's pages held, not the file's
        if bad.any():
            rows = np.flatnonzero(bad.reshape(len(chunk), -1).any(axis=1))
            total = sum(
                int((~np.isfinite(arr[i : i + rows_per_chunk])).sum())
                for i in range(lo, arr.shape[0], rows_per_chunk)
            )
            raise DatasetError(
                f"{name}: {total} NaN or infinite values (first in row {lo + int(rows[0])})"
            )
