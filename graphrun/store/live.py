"""The live graph's delta on one partition: write pieces, versions, reads at a version.

A write batch (:class:`graphrun.distributed.writer.GraphWriter`) gets a **version** from
the sequencer (partition 0's primary, :mod:`graphrun.store.live_ops`) and sends each
partition it touches a :class:`Piece`: the new nodes the partition owns (with type,
original id, every node feature of their type), the new edges whose destination it
owns (with type and every edge feature of that type), the edges it owns that are
deleted, and feature rows it owns that are overwritten. A piece is checked wholly
(:func:`~graphrun.store.live_check.check_piece`: one
:class:`~graphrun.errors.ArgumentError` naming the field, nothing of a bad piece is
kept), then held *pending* (invisible) until the sequencer's decision commits or aborts
its version (:class:`LiveDelta`).

**Ids.** Base ids stay as partitioned. A new node's id is a homogeneous id ``>= N``
(``N`` the base ``num_nodes``), taken from **growth blocks** of :data:`GROWTH_BLOCK` ids:
block ``b`` is ``[N + b*B, N + (b+1)*B)``, owned by one partition (``block_owner[b]``),
handed out by the sequencer (:class:`Blocks`). The same id is the node's id in its
type's id space too: per-type ids of base nodes are below ``num_nodes(t) <= N``, so an
id ``>= N`` is never a base row of any type; the node's type is recorded per node (an
int32). New edges get ids ``>= E`` (base ``num_edges``) the same way; an edge is owned by
its destination's partition. On the owner, a growth id's local row is
``part_rows + (id - N)`` (:func:`growth_row`): a client routes it with the block table
and the server finds it in its delta, so the row says which id it is without a table.

**Reads at a version.** A read at ``V`` sees exactly the committed pieces with version
``<= V``: new nodes and their rows, appended in-edges, deletions, and for an updated row
the latest update ``<= V``. Aborted pieces are dropped. The delta's memory (pending and
committed, with its indexes) is counted against :data:`LIVE_DELTA_MAX_BYTES`.

No torch here: the store imports none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import numpy as np
import numpy.typing as npt

from graphrun.errors import ArgumentError, StoreError
from graphrun.rpc.codec import wire_dtype

GROWTH_BLOCK = 4096  # ids per growth block
LIVE_DELTA_MAX_BYTES = 1 << 30  # the uncompacted delta of one partition
LIVE_BACKPRESSURE = 0.75  # past this share of the bound, prepares are told to retry
LIVE_RETRY_AFTER_S = 0.05  # what a slowed writer is told to wait
LIVE_DECIDE_TIMEOUT_S = 30.0  # an undecided version is aborted after this (writer died)
MAX_PIECE_ROWS = 1 << 21  # new nodes, new edges, deletions or updated rows in one piece
MAX_PIECE_KEYS = 256  # feature tensors named in one piece
MAX_GROWTH_BLOCKS = 1 << 16  # per id space: 268M new ids before compaction renumbers
MAX_UNDECIDED = 64  # versions begun and not decided yet (the sequencer's)
MAX_LIVE_NODES = 1 << 22  # new nodes whose original ids the sequencer keeps (uncompacted)


class Rows(msgspec.Struct, frozen=True):
    """One array: its dtype (a wire dtype name), shape and bytes (C order)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @staticmethod
    def of(arr: np.ndarray) -> Rows:
        a = np.ascontiguousarray(arr)
        return Rows(a.dtype.name, tuple(int(x) for x in a.shape), a.tobytes())

    def array(self, what: str) -> np.ndarray:
        """The array, read-only; ArgumentError naming ``what`` if it is not one."""
        try:
            dt = wire_dtype(self.dtype)
        except ValueError as exc:
            raise ArgumentError(f"{what}: {exc}") from None
        if len(self.shape) > 8 or any(x < 0 for x in self.shape):
            raise ArgumentError(f"{what}: shape {self.shape} is not a list of sizes >= 0")
        n = int(np.prod(self.shape, dtype=np.int64))
        if n * dt.itemsize != len(self.data):
            raise ArgumentError(
                f"{what}: {len(self.data)} bytes do not hold {self.dtype} {self.shape}"
            )
        return np.frombuffer(self.data, dtype=dt).reshape(self.shape)


class Piece(msgspec.Struct, frozen=True, kw_only=True):
    """What one partition gets of one write batch (see the module docstring)."""

    version: int
    new_nodes: Rows | None = None  # int64 graph ids owned here
    node_types: Rows | None = None  # int32 ntype index per new node
    node_orig: Rows | None = None  # int64 original ids
    node_features: dict[str, Rows] = msgspec.field(default_factory=dict)
    new_edges: Rows | None = None  # int64 [3, m]: src, dst (dst owned here), eid
    edge_types: Rows | None = None  # int32 etype index
    edge_features: dict[str, Rows] = msgspec.field(default_factory=dict)
    deleted_edges: Rows | None = None  # int64 eids owned here
    updates: dict[str, tuple[Rows, Rows]] = msgspec.field(default_factory=dict)


def growth_row(ids: np.ndarray, base: int, part_rows: int | np.ndarray) -> np.ndarray:
    """The local rows of growth ids (``>= base``) on their owner."""
    return part_rows + (ids - base)


def growth_ids(rows: np.ndarray, base: int, part_rows: int | np.ndarray) -> np.ndarray:
    """The growth ids of local rows ``>= part_rows`` (inverse of :func:`growth_row`)."""
    return base + (rows - part_rows)


def block_owner_of(ids: np.ndarray, base: int, owners: np.ndarray) -> np.ndarray:
    """The partition owning each growth id (``>= base``); -1 for an unallocated block."""
    b = (ids - base) // GROWTH_BLOCK
    out = np.full(len(ids), -1, dtype=np.int64)
    ok = b < len(owners)
    out[ok] = owners[b[ok]]
    return out


class Blocks:
    """One id space's growth blocks (the sequencer's): owner per block, and each
    partition's open block with how many of its ids are handed out."""

    def __init__(self, base: int, num_parts: int) -> None:
        self.base = base
        self.owners: list[int] = []
        self.open: dict[int, tuple[int, int]] = {}  # part -> (block, ids used)
        self.num_parts = num_parts

    def allocate(self, part: int, count: int) -> list[tuple[int, int]]:
        """``count`` fresh ids owned by ``part`` as ``[(start, count), ...]`` runs."""
        runs: list[tuple[int, int]] = []
        while count > 0:
            block, used = self.open.get(part, (-1, GROWTH_BLOCK))
            if used == GROWTH_BLOCK:
                if len(self.owners) >= MAX_GROWTH_BLOCKS:
                    raise StoreError(
                        f"live: {MAX_GROWTH_BLOCKS} growth blocks are handed out; "
                        "the graph must be compacted first"
                    )
                block, used = len(self.owners), 0
                self.owners.append(part)
            k = min(count, GROWTH_BLOCK - used)
            runs.append((self.base + block * GROWTH_BLOCK + used, k))
            self.open[part] = (block, used + k)
            count -= k
        return runs

    def owner_array(self) -> np.ndarray:
        return np.asarray(self.owners, dtype=np.int64)


def run_ids(runs: list[tuple[int, int]] | list[list[int]]) -> np.ndarray:
    """The ids of ``[(start, count), ...]`` runs, in order."""
    if not runs:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(s, s + c, dtype=np.int64) for s, c in runs])


# ---- a checked piece ------------------------------------------------------------------


@dataclass
class Batch:
    """A checked piece as arrays (see :class:`Piece`)."""

    version: int
    nodes: np.ndarray
    ntypes: np.ndarray
    orig: np.ndarray
    edges: np.ndarray  # int64 [3, m]
    etypes: np.ndarray
    deleted: np.ndarray
    new_rows: dict[str, tuple[np.ndarray, np.ndarray]]  # key -> (new ids, their rows)
    updates: dict[str, tuple[np.ndarray, np.ndarray]]  # key -> (ids, new rows)

    @property
    def nbytes(self) -> int:
        arrays = [self.nodes, self.ntypes, self.orig, self.edges, self.etypes, self.deleted]
        arrays += [a for d in (self.new_rows, self.updates) for pair in d.values() for a in pair]
        return sum(int(a.nbytes) for a in arrays)


# ---- the delta -------------------------------------------------------------------------


def _lookup(sorted_ids: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(found, position)`` of each id in a sorted array."""
    if len(sorted_ids) == 0:
        return np.zeros(len(ids), dtype=bool), np.zeros(len(ids), dtype=np.int64)
    pos = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return sorted_ids[pos] == ids, pos


def _at(values: np.ndarray, found: np.ndarray, pos: np.ndarray, fill: int) -> np.ndarray:
    """``values[pos]`` where found, ``fill`` elsewhere (``values`` may be empty)."""
    if len(values) == 0:
        return np.full(len(pos), fill, dtype=np.int64)
    return np.where(found, values[pos], fill)


def _cat(parts: list[np.ndarray], dtype: npt.DTypeLike) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def spans(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """int64 ``concat(arange(starts[i], ends[i]))`` without a Python loop."""
    counts = ends - starts
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, np.int64)
    offs = np.repeat(starts - np.cumsum(counts) + counts, counts)
    return np.arange(total, dtype=np.int64) + offs


@dataclass
class _Index:
    """The committed pieces as sorted arrays (rebuilt after each commit)."""

    node_id: np.ndarray  # sorted growth node ids, with their type, orig id and version
    node_type: np.ndarray
    node_orig: np.ndarray
    node_ver: np.ndarray
    # new edges sorted by (dst, version): src, dst, eid, etype, version
    edges: np.ndarray  # int64 [5, m]
    edge_by_eid: np.ndarray  # positions in ``edges`` sorted by eid
    del_eid: np.ndarray  # sorted deleted eids, the version that deleted each
    del_ver: np.ndarray
    # key -> (ids sorted by (id, version), versions, rows): new items' rows and updates
    rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)


def _build_index(batches: list[Batch]) -> _Index:
    def ver(b: Batch, n: int) -> np.ndarray:
        return np.full(n, b.version, dtype=np.int64)

    nid = _cat([b.nodes for b in batches], np.int64)
    order = np.argsort(nid, kind="stable")
    edges = np.empty((5, 0), np.int64)
    if batches:
        edges = np.hstack(
            [np.vstack([b.edges, b.etypes[None], ver(b, len(b.etypes))[None]]) for b in batches]
        )
    edges = edges[:, np.lexsort((edges[4], edges[1]))]
    d_eid = _cat([b.deleted for b in batches], np.int64)
    d_ver = _cat([ver(b, len(b.deleted)) for b in batches], np.int64)
    d_order = np.argsort(d_eid, kind="stable")  # versions ascending: the first deletion first
    rows: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]] = {}
    for b in batches:
        for key, (ids, vals) in (*b.new_rows.items(), *b.updates.items()):
            i, v, r = rows.setdefault(key, ([], [], []))
            i.append(ids)
            v.append(ver(b, len(ids)))
            r.append(vals)
    index = _Index(
        nid[order],
        _cat([b.ntypes for b in batches], np.int32)[order],
        _cat([b.orig for b in batches], np.int64)[order],
        _cat([ver(b, len(b.nodes)) for b in batches], np.int64)[order],
        edges,
        np.argsort(edges[2], kind="stable"),
        d_eid[d_order],
        d_ver[d_order],
    )
    for key, (i, v, r) in rows.items():
        ids, vers, vals = np.concatenate(i), np.concatenate(v), np.concatenate(r)
        o = np.lexsort((vers, ids))
        index.rows[key] = (ids[o], vers[o], vals[o])
    return index


class LiveDelta:
    """One partition's pending and committed pieces, and reads over them at a version."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = LIVE_DELTA_MAX_BYTES if max_bytes is None else max_bytes
        self.pending: dict[int, tuple[Batch, float]] = {}  # version -> (batch, when held)
        self.committed: dict[int, Batch] = {}
        self.nbytes = 0
        self._index: _Index | None = None
        self._pending_nodes = np.empty(0, np.int64)
        self._pending_edges = np.empty(0, np.int64)

    # ---- holding pieces

    def slowed(self) -> bool:
        """Whether a writer should wait (past :data:`LIVE_BACKPRESSURE` of the bound)."""
        return self.nbytes > LIVE_BACKPRESSURE * self.max_bytes

    def hold(self, batch: Batch, now: float) -> None:
        """Keep ``batch`` pending (invisible); StoreError if it would pass the bound."""
        if batch.version in self.pending or batch.version in self.committed:
            raise ArgumentError(f"piece: version {batch.version} is held already")
        cost = 2 * batch.nbytes  # the batch and its share of the index
        if self.nbytes + cost > self.max_bytes:
            raise StoreError(
                f"live: the delta would hold {self.nbytes + cost} bytes, over its bound "
                f"of {self.max_bytes} (LIVE_DELTA_MAX_BYTES): compaction must run first"
            )
        self.pending[batch.version] = (batch, now)
        self.nbytes += cost
        self._pending_changed()

    def commit(self, version: int) -> bool:
        """Make a pending piece visible; False if none is held for ``version``."""
        held = self.pending.pop(version, None)
        if held is None:
            return False
        self.committed[version] = held[0]
        self._index = None
        self._pending_changed()
        return True

    def abort(self, version: int) -> bool:
        held = self.pending.pop(version, None)
        if held is None:
            return False
        self.nbytes -= 2 * held[0].nbytes
        self._pending_changed()
        return True

    def _pending_changed(self) -> None:
        batches = [b for b, _ in self.pending.values()]
        self._pending_nodes = np.sort(_cat([b.nodes for b in batches], np.int64))
        self._pending_edges = np.sort(_cat([b.edges[2] for b in batches], np.int64))

    def lowest(self) -> int:
        """The lowest version held (pending or committed); 0: the partition is its base."""
        held = [*self.pending, *self.committed]
        return min(held) if held else 0

    def undecided(self, upto: int) -> list[int]:
        """The pending versions ``<= upto``, lowest first."""
        return sorted(v for v in self.pending if v <= upto)

    def stale(self, now: float, after: float) -> list[int]:
        """The pending versions held longer than ``after`` seconds."""
        return sorted(v for v, (_, t) in self.pending.items() if now - t > after)

    # ---- reads

    @property
    def index(self) -> _Index:
        if self._index is None:
            self._index = _build_index([self.committed[v] for v in sorted(self.committed)])
        return self._index

    def has_nodes(self, ids: np.ndarray) -> np.ndarray:
        """Whether each growth id is held (pending or committed)."""
        found, _ = _lookup(self.index.node_id, ids)
        return found | _lookup(self._pending_nodes, ids)[0]

    def has_edges(self, eids: np.ndarray, committed_only: bool = False) -> np.ndarray:
        ix = self.index
        found, _ = _lookup(ix.edges[2][ix.edge_by_eid], eids)
        return found if committed_only else found | _lookup(self._pending_edges, eids)[0]

    def node_types_of(self, ids: np.ndarray, extra: Batch | None = None) -> np.ndarray:
        """The ntype of each committed growth node (or new in ``extra``); -1 otherwise."""
        ix = self.index
        found, pos = _lookup(ix.node_id, ids)
        out = _at(ix.node_type, found, pos, -1).astype(np.int32)
        if extra is not None and len(extra.nodes):
            o = np.argsort(extra.nodes)
            hit, p = _lookup(extra.nodes[o], ids)
            out[hit] = extra.ntypes[o][p[hit]]
        return out

    def edge_types_of(self, eids: np.ndarray, extra: Batch | None = None) -> np.ndarray:
        ix = self.index
        found, pos = _lookup(ix.edges[2][ix.edge_by_eid], eids)
        return _at(ix.edges[3][ix.edge_by_eid], found, pos, -1).astype(np.int32)

    def nodes_at(self, ids: np.ndarray, version: int) -> np.ndarray:
        """Whether each growth id is a node visible at ``version``."""
        ix = self.index
        found, pos = _lookup(ix.node_id, ids)
        return found & (_at(ix.node_ver, found, pos, 0) <= version)

    def nodes_upto(self, version: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, ntypes)`` of the growth nodes visible at ``version``, by id."""
        ix = self.index
        keep = ix.node_ver <= version
        return ix.node_id[keep], ix.node_type[keep]

    def orig_of(self, ids: np.ndarray) -> np.ndarray:
        """Original ids of committed growth nodes (-1 where unknown)."""
        ix = self.index
        found, pos = _lookup(ix.node_id, ids)
        return _at(ix.node_orig, found, pos, -1)

    def in_edges(self, dst: np.ndarray, version: int) -> tuple[np.ndarray, np.ndarray]:
        """The new edges into each of ``dst`` visible at ``version`` (not deleted by then):
        ``(counts int64 [len(dst)], edges int64 [4, m]: src, dst, eid, etype)``, grouped
        by ``dst`` in its order."""
        e = self.index.edges  # sorted by dst: only the seeds' runs are looked at
        lo = np.searchsorted(e[1], dst, side="left")
        hi = np.searchsorted(e[1], dst, side="right")
        pos = spans(lo, hi)
        seed = np.repeat(np.arange(len(dst)), hi - lo)
        keep = (e[4, pos] <= version) & ~self.deleted(e[2, pos], version)
        counts = np.bincount(seed[keep], minlength=len(dst))
        return counts.astype(np.int64), e[:4, pos[keep]]

    def new_edges(self, version: int) -> np.ndarray:
        """int64 [4, m] (src, dst, eid, etype) of new edges visible at ``version``."""
        e = self.index.edges
        return e[:4, (e[4] <= version) & ~self.deleted(e[2], version)]

    def deleted(self, eids: np.ndarray, version: int) -> np.ndarray:
        """Whether each edge id is deleted at ``version``."""
        ix = self.index
        found, pos = _lookup(ix.del_eid, eids)
        return found & (_at(ix.del_ver, found, pos, 0) <= version)

    def deleted_at(self, version: int) -> np.ndarray:
        ix = self.index
        return ix.del_eid[ix.del_ver <= version]

    def has_rows(self, key: str) -> bool:
        return key in self.index.rows

    def rows(self, key: str, ids: np.ndarray, version: int, out: np.ndarray) -> np.ndarray:
        """Write into ``out[i]`` the latest row of ``ids[i]`` written at a version
        ``<= version`` (a new item's row or an update); returns whether each was found."""
        entry = self.index.rows.get(key)
        if entry is None:
            return np.zeros(len(ids), dtype=bool)
        r_ids, r_ver, r_vals = entry
        keep = r_ver <= version
        r_ids, r_vals = r_ids[keep], r_vals[keep]
        if len(r_ids) == 0:
            return np.zeros(len(ids), dtype=bool)
        pos = np.searchsorted(r_ids, ids, side="right") - 1  # the last (latest) of each id
        found = (pos >= 0) & (r_ids[np.maximum(pos, 0)] == ids)
        out[found] = r_vals[pos[found]]
        return found
