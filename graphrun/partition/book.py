"""The partition book: global id -> (partition, local id), by binary search over ranges.

After relabelling (see :mod:`graphrun.partition.format`) partition ``p`` owns the
contiguous homogeneous node ids ``[node_offsets[p], node_offsets[p+1])``. Inside that
block nodes are grouped by node type (in ``node_types`` order), so each node type
``t`` owns a contiguous per-type range ``[node_ranges(t)[p], node_ranges(t)[p+1])`` in
every partition. Edges are laid out the same way (``edge_offsets``, ``edge_ranges``).

Every lookup is a ``np.searchsorted`` over at most ``P * T + 1`` boundaries, so it
costs O(log(P*T)) per id and is vectorised over arrays. Nothing here reads files
except :func:`load_partition_book`.

Ids may be passed as any integer array-like (or a scalar); results are int64 arrays
of the same shape (type ids are int32). Out-of-range ids raise
:class:`~graphrun.errors.ArgumentError` naming the argument and the first bad index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from graphrun.errors import ArgumentError, PartitionFormatError
from graphrun.names import CanonicalEtype, etype_key, owners, resolve_etype

T = TypeVar("T")

CONFIG_FILE = "partition.json"


def check_ids(ids: Any, arg: str, upper: int, of: str = "") -> np.ndarray:
    """``ids`` as int64 (shape kept), every id in ``[0, upper)``; an ArgumentError naming
    ``arg``, the first bad position and value otherwise (``of`` names the id space)."""
    arr = np.asarray(ids)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        if arr.size == 0:
            return arr.astype(np.int64)
        raise ArgumentError(f"{arg}: expected integer ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size:
        flat = arr.reshape(-1)
        bad = (flat < 0) | (flat >= upper)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            where = f" of {of}" if of else ""
            raise ArgumentError(f"{arg}[{i}] = {int(flat[i])} is out of range [0, {upper}){where}")
    return arr


def _check_bounds(arr: np.ndarray, name: str, parts: int, total: int | None, src: str) -> None:
    if arr.ndim != 1 or len(arr) != parts + 1:
        raise PartitionFormatError(f"{src}: field {name!r} must hold {parts + 1} integers")
    if arr[0] != 0:
        raise PartitionFormatError(f"{src}: field {name!r} must start at 0")
    if np.any(np.diff(arr) < 0):
        raise PartitionFormatError(f"{src}: field {name!r} decreases")
    if total is not None and arr[-1] != total:
        raise PartitionFormatError(f"{src}: field {name!r} must end at {total}, not {arr[-1]}")


@dataclass(frozen=True, eq=False)
class _Layout:
    """Homogeneous-id layout of one kind (nodes or edges) over (part, type) blocks."""

    offsets: np.ndarray  # [P+1] homogeneous partition boundaries
    ranges: np.ndarray  # [T, P+1] per-type boundaries
    block_starts: np.ndarray = field(init=False)  # [P*T] homo start of block (p, t), p-major

    def __post_init__(self) -> None:
        counts = np.diff(self.ranges, axis=1)  # [T, P]
        within = np.cumsum(counts, axis=0) - counts  # [T, P] start of type t inside part p
        starts = self.offsets[:-1][None, :] + within  # [T, P]
        object.__setattr__(self, "block_starts", np.ascontiguousarray(starts.T).reshape(-1))

    @property
    def num_types(self) -> int:
        return int(self.ranges.shape[0])

    def to_homo(self, t: int, ids: np.ndarray) -> np.ndarray:
        p = owners(self.ranges[t], ids)
        return self.block_starts[p * self.num_types + t] + (ids - self.ranges[t][p])

    def to_per_type(self, homo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        block = owners(self.block_starts, homo)
        t = block % self.num_types
        p = block // self.num_types
        per_type = self.ranges[t, p] + (homo - self.block_starts[block])
        return t.astype(np.int32), per_type.astype(np.int64, copy=False)


@dataclass(frozen=True, eq=False)
class PartitionBook:
    """Maps node and edge ids to partitions and local rows. Pure numpy, vectorised.

    Build it with :meth:`from_config` (the ``partition.json`` dict) or
    :func:`load_partition_book`. ``node_ranges_all[t]`` / ``edge_ranges_all[r]`` are
    the per-type boundaries in ``node_types`` / ``edge_types`` order.
    """

    num_parts: int
    node_types: tuple[str, ...]
    edge_types: tuple[CanonicalEtype, ...]
    node_offsets: np.ndarray
    edge_offsets: np.ndarray
    node_ranges_all: np.ndarray
    edge_ranges_all: np.ndarray
    _nodes: _Layout = field(init=False, repr=False)
    _edges: _Layout = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("node_offsets", "edge_offsets", "node_ranges_all", "edge_ranges_all"):
            arr = np.array(getattr(self, name), dtype=np.int64)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "node_types", tuple(self.node_types))
        object.__setattr__(self, "edge_types", tuple(tuple(e) for e in self.edge_types))
        self._validate("partition book")
        object.__setattr__(self, "_nodes", _Layout(self.node_offsets, self.node_ranges_all))
        object.__setattr__(self, "_edges", _Layout(self.edge_offsets, self.edge_ranges_all))

    def _validate(self, src: str) -> None:
        p = self.num_parts
        if not isinstance(p, int | np.integer) or isinstance(p, bool) or p < 1:
            raise PartitionFormatError(f"{src}: field 'num_parts' must be a positive integer")
        if not self.node_types:
            raise PartitionFormatError(f"{src}: field 'node_types' is empty")
        if not self.edge_types:
            raise PartitionFormatError(f"{src}: field 'edge_types' is empty")
        for kind, types, offsets, ranges in (
            ("node", self.node_types, self.node_offsets, self.node_ranges_all),
            ("edge", self.edge_types, self.edge_offsets, self.edge_ranges_all),
        ):
            _check_bounds(offsets, f"{kind}_offsets", p, None, src)
            if ranges.shape != (len(types), p + 1):
                raise PartitionFormatError(
                    f"{src}: field '{kind}_ranges' must hold {p + 1} integers "
                    f"for each of the {len(types)} {kind} types"
                )
            for t, name in enumerate(types):
                label = name if isinstance(name, str) else etype_key(name)
                _check_bounds(ranges[t], f"{kind}_ranges.{label}", p, None, src)
            if not np.array_equal(np.diff(offsets), np.diff(ranges, axis=1).sum(axis=0)):
                raise PartitionFormatError(
                    f"{src}: field '{kind}_offsets' disagrees with the per-type "
                    f"'{kind}_ranges' (partition sizes differ)"
                )

    # ---- config ---------------------------------------------------------------------

    @classmethod
    def from_config(cls, cfg: dict[str, Any], source: str = CONFIG_FILE) -> PartitionBook:
        """Build from a ``partition.json`` dict; errors name ``source`` and the field."""
        try:
            node_types = tuple(str(t) for t in _get(cfg, "node_types", list, source))
            edge_types = tuple(_etype(e, source) for e in _get(cfg, "edge_types", list, source))
            nranges = _get(cfg, "node_ranges", dict, source)
            eranges = _get(cfg, "edge_ranges", dict, source)
            for name in node_types:
                if name not in nranges:
                    raise PartitionFormatError(f"{source}: field 'node_ranges.{name}' is missing")
            for et in edge_types:
                if etype_key(et) not in eranges:
                    raise PartitionFormatError(
                        f"{source}: field 'edge_ranges.{etype_key(et)}' is missing"
                    )
            book = cls(
                num_parts=_get(cfg, "num_parts", int, source),
                node_types=node_types,
                edge_types=edge_types,
                node_offsets=_int_array(
                    _get(cfg, "node_offsets", list, source), "node_offsets", source
                ),
                edge_offsets=_int_array(
                    _get(cfg, "edge_offsets", list, source), "edge_offsets", source
                ),
                node_ranges_all=_int_matrix(nranges, node_types, "node_ranges", source),
                edge_ranges_all=_int_matrix(
                    eranges, [etype_key(e) for e in edge_types], "edge_ranges", source
                ),
            )
        except PartitionFormatError as exc:
            msg = str(exc).replace("partition book:", f"{source}:")
            raise PartitionFormatError(msg) from None
        return book

    def to_config(self) -> dict[str, Any]:
        """The book's fields of ``partition.json`` (JSON-serialisable)."""
        return {
            "num_parts": int(self.num_parts),
            "node_types": list(self.node_types),
            "edge_types": [list(e) for e in self.edge_types],
            "node_offsets": self.node_offsets.tolist(),
            "edge_offsets": self.edge_offsets.tolist(),
            "node_ranges": {
                t: self.node_ranges_all[i].tolist() for i, t in enumerate(self.node_types)
            },
            "edge_ranges": {
                etype_key(e): self.edge_ranges_all[i].tolist()
                for i, e in enumerate(self.edge_types)
            },
        }

    # ---- sizes and types ------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return int(self.node_offsets[-1])

    @property
    def num_edges(self) -> int:
        return int(self.edge_offsets[-1])

    @property
    def is_hetero(self) -> bool:
        return len(self.node_types) > 1 or len(self.edge_types) > 1

    def ntype_id(self, ntype: str) -> int:
        try:
            return self.node_types.index(ntype)
        except ValueError:
            raise ArgumentError(
                f"ntype: unknown node type {ntype!r}; known: {list(self.node_types)}"
            ) from None

    def etype_id(self, etype: CanonicalEtype | str) -> int:
        """Index of an edge type given as a triple, ``"src:rel:dst"`` or a unique relation."""
        return resolve_etype(etype, self.edge_types)

    def num_nodes_of(self, ntype: str) -> int:
        return int(self.node_ranges_all[self.ntype_id(ntype)][-1])

    def num_edges_of(self, etype: CanonicalEtype | str) -> int:
        return int(self.edge_ranges_all[self.etype_id(etype)][-1])

    def node_ranges(self, ntype: str) -> np.ndarray:
        """int64 [P+1]: partition p owns per-type ids [r[p], r[p+1]) of ``ntype``."""
        return self.node_ranges_all[self.ntype_id(ntype)]

    def edge_ranges(self, etype: CanonicalEtype | str) -> np.ndarray:
        return self.edge_ranges_all[self.etype_id(etype)]

    def _check_part(self, part: int) -> int:
        if not isinstance(part, int | np.integer) or not 0 <= part < self.num_parts:
            raise ArgumentError(f"part: {part!r} is not a partition in [0, {self.num_parts})")
        return int(part)

    def owned_nodes(self, part: int, ntype: str | None = None) -> tuple[int, int]:
        """``(start, end)``: the homogeneous (or per-type) node ids partition ``part`` owns."""
        p = self._check_part(part)
        bounds = self.node_offsets if ntype is None else self.node_ranges(ntype)
        return int(bounds[p]), int(bounds[p + 1])

    def owned_edges(self, part: int, etype: CanonicalEtype | str | None = None) -> tuple[int, int]:
        p = self._check_part(part)
        bounds = self.edge_offsets if etype is None else self.edge_ranges(etype)
        return int(bounds[p]), int(bounds[p + 1])

    def node_type_block(self, part: int, ntype: str) -> tuple[int, int]:
        """``(start, end)`` homogeneous ids of the ``ntype`` nodes that ``part`` owns."""
        p, t = self._check_part(part), self.ntype_id(ntype)
        start = int(self._nodes.block_starts[p * self._nodes.num_types + t])
        r = self.node_ranges_all[t]
        return start, start + int(r[p + 1] - r[p])

    def edge_type_block(self, part: int, etype: CanonicalEtype | str) -> tuple[int, int]:
        """``(start, end)`` homogeneous ids of the ``etype`` edges that ``part`` owns."""
        p, t = self._check_part(part), self.etype_id(etype)
        start = int(self._edges.block_starts[p * self._edges.num_types + t])
        r = self.edge_ranges_all[t]
        return start, start + int(r[p + 1] - r[p])

    # ---- node lookups ---------------------------------------------------------------

    def partid2nids(self, part: int, ntype: str | None = None) -> np.ndarray:
        """The node ids ``part`` owns (per-type ids with ``ntype``), DistDGL's name."""
        return np.arange(*self.owned_nodes(part, ntype), dtype=np.int64)

    def partid2eids(self, part: int, etype: CanonicalEtype | str | None = None) -> np.ndarray:
        """The edge ids ``part`` owns (per-type ids with ``etype``), DistDGL's name."""
        return np.arange(*self.owned_edges(part, etype), dtype=np.int64)

    def _node_ids(self, ids: Any, ntype: str | None) -> tuple[np.ndarray, np.ndarray]:
        if ntype is None:
            return check_ids(ids, "ids", self.num_nodes), self.node_offsets
        bounds = self.node_ranges(ntype)
        return check_ids(ids, "ids", int(bounds[-1])), bounds

    def nid2part(self, ids: Any, ntype: str | None = None) -> np.ndarray:
        """Partition of each node id (homogeneous new ids when ``ntype`` is None)."""
        arr, bounds = self._node_ids(ids, ntype)
        return owners(bounds, arr)

    def nid2local(self, ids: Any, ntype: str | None = None) -> np.ndarray:
        """Row of each node in its owner's arrays.

        With ``ntype``: the row in ``part-K/node/<ntype>/*.npy``. Without: the position
        among the owner's inner nodes (= the row in ``part-K/nodes.npy``).
        """
        arr, bounds = self._node_ids(ids, ntype)
        return arr - bounds[owners(bounds, arr)]

    def to_homo(self, ntype: str, per_type_ids: Any) -> np.ndarray:
        """Homogeneous new ids of per-type new ids of ``ntype``."""
        t = self.ntype_id(ntype)
        arr = check_ids(per_type_ids, "per_type_ids", int(self.node_ranges_all[t][-1]))
        return self._nodes.to_homo(t, arr)

    def to_per_type(self, homo_ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(type_ids int32, per_type_ids int64)`` of homogeneous new node ids."""
        return self._nodes.to_per_type(check_ids(homo_ids, "homo_ids", self.num_nodes))

    # ---- edge lookups ---------------------------------------------------------------

    def _edge_ids(
        self, ids: Any, etype: CanonicalEtype | str | None
    ) -> tuple[np.ndarray, np.ndarray]:
        if etype is None:
            return check_ids(ids, "ids", self.num_edges), self.edge_offsets
        bounds = self.edge_ranges(etype)
        return check_ids(ids, "ids", int(bounds[-1])), bounds

    def eid2part(self, ids: Any, etype: CanonicalEtype | str | None = None) -> np.ndarray:
        arr, bounds = self._edge_ids(ids, etype)
        return owners(bounds, arr)

    def eid2local(self, ids: Any, etype: CanonicalEtype | str | None = None) -> np.ndarray:
        """Row of each edge in ``part-K/edge/<etype>/*.npy`` (or among the owner's edges)."""
        arr, bounds = self._edge_ids(ids, etype)
        return arr - bounds[owners(bounds, arr)]

    def etype_to_homo(self, etype: CanonicalEtype | str, ids: Any) -> np.ndarray:
        r = self.etype_id(etype)
        arr = check_ids(ids, "ids", int(self.edge_ranges_all[r][-1]))
        return self._edges.to_homo(r, arr)

    def eid_to_per_type(self, homo_eids: Any) -> tuple[np.ndarray, np.ndarray]:
        return self._edges.to_per_type(check_ids(homo_eids, "homo_eids", self.num_edges))


# ---- config parsing helpers -------------------------------------------------------------


def _get(cfg: dict[str, Any], key: str, typ: type[T], source: str) -> T:
    if not isinstance(cfg, dict):
        raise PartitionFormatError(f"{source}: expected a JSON object")
    if key not in cfg:
        raise PartitionFormatError(f"{source}: field {key!r} is missing")
    val = cfg[key]
    if not isinstance(val, typ) or isinstance(val, bool):
        raise PartitionFormatError(
            f"{source}: field {key!r} has the wrong type ({type(val).__name__}, "
            f"expected {typ.__name__})"
        )
    return val


def _etype(e: Any, source: str) -> CanonicalEtype:
    if not isinstance(e, list | tuple) or len(e) != 3 or not all(isinstance(x, str) for x in e):
        raise PartitionFormatError(
            f"{source}: field 'edge_types' holds {e!r}, not [src_type, relation, dst_type]"
        )
    return (e[0], e[1], e[2])


def _int_array(val: Any, name: str, source: str) -> np.ndarray:
    if not isinstance(val, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in val
    ):
        raise PartitionFormatError(f"{source}: field {name!r} must be a list of integers")
    return np.array(val, dtype=np.int64).reshape(-1)


def _int_matrix(
    d: dict[str, Any], keys: list[str] | tuple[str, ...], name: str, src: str
) -> np.ndarray:
    rows = [_int_array(d[k], f"{name}.{k}", src) for k in keys]
    if len({len(r) for r in rows}) > 1:
        raise PartitionFormatError(f"{src}: field {name!r} has lists of different lengths")
    return np.stack(rows) if rows else np.zeros((0, 1), dtype=np.int64)
