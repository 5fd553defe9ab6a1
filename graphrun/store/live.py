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

import logging
import math
import threading
import time
from collections.abc import Callable

import msgspec
import numpy as np

from graphrun.errors import ArgumentError, StoreError
from graphrun.names import owners as base_owners
from graphrun.rpc.codec import wire_dtype
from graphrun.rpc.tuning import background
from graphrun.store.live_index import (
    Batch,
    Run,
    Taken,
    build_run,
    concat,
    due,
    entries,
    latest,
    lookup_sorted,
    merge_runs,
    spans,
    values_at,
)

log = logging.getLogger("graphrun.store")

GROWTH_BLOCK = 4096  # ids per growth block
LIVE_DELTA_MAX_BYTES = 1 << 30  # the uncompacted delta of one partition
LIVE_BACKPRESSURE = 0.75  # past this share of the bound, prepares are told to retry
LIVE_RETRY_AFTER_S = 0.05  # what a slowed writer is told to wait
LIVE_DECIDE_TIMEOUT_S = 30.0  # an undecided version is aborted after this (writer died)
MAX_PIECE_ROWS = 1 << 21  # new nodes, new edges, deletions or updated rows in one piece
MAX_PIECE_KEYS = 256  # feature tensors named in one piece
MAX_GROWTH_BLOCKS = 1 << 16  # per id space: 268M new ids before compaction renumbers
#: the merging thread indexes fresh commits in groups: it waits, up to INDEX_WAIT_S after
#: woken, for INDEX_GROUP entries (a read meanwhile indexes them itself: never staler)
INDEX_GROUP, INDEX_WAIT_S = 1 << 15, 0.02
MAX_UNDECIDED = 64  # versions begun and not decided yet (the sequencer's)
MAX_LIVE_NODES = 1 << 22  # new nodes whose original ids the sequencer keeps (uncompacted)
#: a server's wait at start for its compiled merge (numba, ~0.5 CPU-s), then it serves
WARM_TIMEOUT_S = 30.0  # anyway (a warning): well within the launcher's 120 s for its stores


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
        if math.prod(self.shape) * dt.itemsize != len(self.data):  # exact: no overflow
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
    new_edges: Rows | None = None  # [2, m] src, dst (dst owned here; int64/32); [3, m]: eid too
    edge_ids: list[tuple[int, int]] | None = None  # [2, m]'s ids: (start, count) runs
    edge_types: Rows | None = None  # int32 etype index (None: all 0, one edge type)
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


def id_owners(ids: np.ndarray, ranges: np.ndarray, first: int, blocks: np.ndarray) -> np.ndarray:
    """The partition of each id of one id space, -1 for none: base ids (below
    ``ranges[-1]``) by the partitions' ranges, growth ids (``>= first``) by ``blocks``,
    the owner of each growth block (the writer's and the clients' one routing rule)."""
    out = np.full(len(ids), -1, np.int64)
    base = (ids >= 0) & (ids < ranges[-1])
    out[base] = base_owners(ranges, ids[base])
    grow = ids >= first
    out[grow] = block_owner_of(ids[grow], first, blocks)
    return out


# ---- the delta -------------------------------------------------------------------------


def _by_seed_and_eid(seed: np.ndarray, eid: np.ndarray) -> np.ndarray:
    """The order of ``(seed, eid)`` pairs (all distinct): one sort of both packed in an
    int64 where they fit (30x a ``lexsort`` of 50k pairs), else a ``lexsort``."""
    if len(eid) == 0:
        return np.empty(0, np.int64)
    lo, span = int(eid.min()), int(eid.max()) - int(eid.min()) + 1
    bits = max(span - 1, 1).bit_length()
    if (len(seed) and int(seed.max()) >= 1 << (62 - bits)) or bits > 62:
        return np.lexsort((eid, seed))
    return np.argsort((seed << bits) | (eid - lo))


Resolver = Callable[[np.ndarray], np.ndarray]  # base eids -> their sources


class LiveDelta:
    """One partition's pending and committed pieces, and reads over them at a version."""

    def __init__(
        self, max_bytes: int | None = None, background: bool = False, deferred: bool = False
    ) -> None:
        self.max_bytes = LIVE_DELTA_MAX_BYTES if max_bytes is None else max_bytes
        # deferred: commits indexed when read (an unpromoted replica): :meth:`index_eagerly`
        self.deferred = deferred
        self.pending: dict[int, tuple[Batch, float]] = {}  # version -> (batch, when held)
        self.committed: dict[int, Batch] = {}
        self._lowest_committed = 0  # min(committed), 0: none (read once or twice a piece)
        self.nbytes = 0
        self.work = 0  # index entries sorted so far (the index's cost, for tests)
        self._runs: list[Run] = []
        self._fresh: list[Batch] = []  # committed, not indexed yet
        self._lock = threading.Lock()
        # background: runs are merged by a thread of the delta's own, off the read path
        self._merger: threading.Thread | None = None
        self._wake = threading.Event()
        self._warmed = threading.Event()  # the merging thread loaded its merge, or stopped
        self._compiled = False  # it loaded the compiled kernels: every sort and merge theirs
        self._closed = False
        if background:
            self._merger = threading.Thread(target=self._merge_loop, name="live-merge", daemon=True)
            self._merger.start()
        self._updating: set[int] = set()  # versions held that overwrite rows
        self.taken_nodes, self.taken_edges = Taken(), Taken()  # growth ids held (also folded)
        # compaction (store/compact.py): the versions <= floor are folded into the base;
        # ``base`` is the folded growth (new nodes, edges into them, rows) at version 0,
        # ``base_eids`` the (sorted eid, etype) of new edges folded into the base CSC and
        # ``base_out`` the (sorted growth source, count) of those edges
        self.floor = 0
        self.base: Run | None = None
        self._folds = 0  # folds so far: a merge begun before one is dropped
        self.base_eids = (np.empty(0, np.int64), np.empty(0, np.int64))
        self.base_out = (np.empty(0, np.int64), np.empty(0, np.int64))

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
        if batch.updates:
            self._updating.add(batch.version)
        self.nbytes += cost
        nodes, edges = batch.taken or (None, None)
        self.taken_nodes.add(batch.nodes, batch.version, nodes)
        self.taken_edges.add(batch.edges[2], batch.version, edges)

    def commit(self, version: int) -> bool:
        """Make a pending piece visible; False if none is held for ``version``."""
        held = self.pending.pop(version, None)
        if held is None:
            return False
        self.committed[version] = held[0]
        self._lowest_committed = min(self._lowest_committed or version, version)
        with self._lock:
            self._fresh.append(held[0])
        if not self.deferred:
            self._wake.set()
        return True

    def abort(self, version: int) -> bool:
        held = self.pending.pop(version, None)
        if held is None:
            return False
        self.nbytes -= 2 * held[0].nbytes
        self._updating.discard(version)
        self.taken_nodes.drop(version)
        self.taken_edges.drop(version)
        return True

    def lowest(self) -> int:
        """The lowest version held (pending or committed); 0: the partition is its base."""
        low, committed = min(self.pending, default=0), self._lowest_committed
        return min(low, committed) if low and committed else low or committed

    def lowest_update(self) -> int:
        """The lowest version held that overwrites rows (updates); 0: none."""
        return min(self._updating, default=0)

    def undecided(self, upto: int) -> list[int]:
        """The pending versions ``<= upto``, lowest first."""
        return sorted(v for v in self.pending if v <= upto)

    def stale(self, now: float, after: float) -> list[int]:
        """The pending versions held longer than ``after`` seconds."""
        return sorted(v for v, (_, t) in self.pending.items() if now - t > after)

    # ---- the index

    @property
    def runs(self) -> list[Run]:
        """The read index: the fresh commits become a run, merged as the rule asks
        (:func:`~graphrun.store.live_index.due`); with a merging thread, a read only indexes
        the commits the thread has not taken yet (a run of their size) and merges none."""
        if self.deferred and self._index_outside():  # read after all: merged from now on
            self._wake.set()
        with self._lock:  # a read may come from another thread than the commit's
            flushed = bool(self._fresh)
            self._flush(merge=self._merger is None)
            runs = ([self.base] if self.base is not None else []) + self._runs
        if flushed and self._merger is not None:  # a thread gathering them waits no more
            self._wake.set()
        return runs

    def index_eagerly(self) -> None:
        """Index every commit from now on, by the merging thread (a promoted replica)."""
        self.deferred = False
        self._wake.set()

    def _index_outside(self) -> bool:
        """Index the fresh commits outside the lock: commits go on meanwhile (a deferred
        delta's backlog may be large); dropped if a fold or another flush took them first."""
        with self._lock:
            fresh, folds = list(self._fresh), self._folds
        run = build_run(fresh, self._compiled) if fresh else None
        with self._lock:
            now = self._fresh[: len(fresh)]
            mine = len(now) == len(fresh) and all(a is b for a, b in zip(now, fresh, strict=True))
            if run is None or folds != self._folds or not mine:  # a fold or a flush took them
                return False
            self._fresh = self._fresh[len(fresh) :]
            self._runs.append(run)
            self.work += run.size
            return True

    def fold(self, version: int, base: Run, eids: tuple[np.ndarray, np.ndarray],
             out: tuple[np.ndarray, np.ndarray]) -> None:  # fmt: skip
        """Drop the committed pieces ``<= version``: compaction folded them into ``base``
        (and the base CSC); the rest are indexed again on the next read. Under the lock
        the merging thread takes its runs under: a merge in flight over the runs before
        the fold is not installed (:attr:`_folds` moved on)."""
        with self._lock:
            for v in [v for v in self.committed if v <= version]:
                del self.committed[v]
                self._updating.discard(v)
            self._lowest_committed = min(self.committed, default=0)
            self.floor, self.base, self.base_eids, self.base_out = version, base, eids, out
            self._runs, self._fresh = [], list(self.committed.values())
            self._folds += 1
            held = [*self.committed.values(), *(b for b, _ in self.pending.values())]
            self.nbytes = sum(2 * b.nbytes for b in held)
            self.taken_nodes.fold(version, base.nodes[0])
            self.taken_edges.fold(version, eids[0])
        if not self.deferred:
            self._wake.set()

    def warm(self, wait: bool = False, timeout: float | None = None) -> bool:
        """Have the merging thread load its compiled merge now, off the writes' path (a
        server with a log), not at the first commit; with ``wait``, return once it has
        or after ``timeout`` s (:data:`WARM_TIMEOUT_S`), whether it has. A server waits
        before it serves: a load still going on (~0.5 CPU-s) was charged to the first
        batches, 1–1.5 ms of CPU each over a 300-batch ingest (benchmarks/README.md,
        ingest42p); one that takes longer is warned of and goes on (reads index the
        commits meanwhile): a server must not hang at start."""
        self._wake.set()
        limit = WARM_TIMEOUT_S if timeout is None else timeout
        if not wait or self._merger is None or self._warmed.wait(limit):
            return self.warmed
        log.warning("live: the merging thread has not loaded its compiled merge (graphrun.store."
                    "live_kernels, numba) in %g s: serving without it", limit)  # fmt: skip
        return False

    @property
    def warmed(self) -> bool:
        """Whether the merging thread has loaded its compiled merge (or stopped)."""
        return self._warmed.is_set()

    def close(self) -> None:
        """Stop the merging thread (a delta made with ``background``)."""
        self._closed = True
        self._wake.set()
        if self._merger is not None:
            self._merger.join(30)

    def _merge_loop(self) -> None:
        """The merging thread: fresh commits into a run, then each merge the rule asks
        for, made outside the lock (reads go on over the runs before it) and swapped in.
        Background work (:func:`~graphrun.rpc.tuning.background`): reads do not wait for
        it, they look at more runs. Woken the first time (:meth:`warm`, or the first
        commit), it loads the compiled merge (:mod:`~graphrun.store.live_kernels`: numba,
        about 0.5 CPU-s) first; woken by :meth:`close` alone, it loads nothing (every
        store server closes its delta)."""
        background()
        try:
            self._loop()
        finally:  # stopped (or failed): no :meth:`warm` waits for it
            self._warmed.set()

    def _loop(self) -> None:
        loaded = False
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            if self._closed:  # woken by close: a store that took no write loads nothing
                break
            if not loaded:
                from graphrun.store.live_kernels import warm_up

                warm_up()
                self._compiled = loaded = True
                self._warmed.set()
            self._gather()
            while not self._closed:
                self._index_outside()  # then what came meanwhile, under the lock
                with self._lock:
                    self._flush(merge=False)
                    at = due([r.size for r in self._runs])
                    if at is None:
                        break
                    runs, folds = self._runs[at[0] : at[0] + at[1]], self._folds
                try:
                    merged = merge_runs(runs, self._compiled)
                except Exception:  # reads go on over more runs; the next commit tries again
                    log.exception("live: merging the delta's runs failed")
                    break
                with self._lock:  # runs only ever grow at the end while it merged
                    if self._folds != folds:  # a compaction folded them: index again
                        continue
                    i = next(i for i, r in enumerate(self._runs) if r is runs[0])
                    self._runs[i : i + len(runs)] = [merged]
                    self.work += merged.size

    def _gather(self) -> None:
        """Wait up to :data:`INDEX_WAIT_S` for :data:`INDEX_GROUP` fresh entries: indexed
        one commit at a time, each 5k-edge commit was a run, then merged 8 times over
        300 commits; grouped, the two smallest levels go (benchmarks/README.md, idx42)."""
        end = time.monotonic() + INDEX_WAIT_S
        while not self._closed and (left := end - time.monotonic()) > 0:
            with self._lock:
                if not self._fresh or sum(map(entries, self._fresh)) >= INDEX_GROUP:
                    return
            self._wake.wait(left)
            self._wake.clear()

    def _flush(self, merge: bool = True) -> None:
        if self._fresh:
            run = build_run(self._fresh, self._compiled)
            self.work += run.size
            self._fresh = []
            self._runs.append(run)
        while merge and (at := due([r.size for r in self._runs])) is not None:
            i, k = at
            run = merge_runs(self._runs[i : i + k], self._compiled)
            self.work += run.size
            self._runs[i : i + k] = [run]

    def _nodes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(found, ntype, orig, version)`` of each committed growth node (-1 if none)."""
        found = np.zeros(len(ids), dtype=bool)
        cols = [np.full(len(ids), -1, np.int64) for _ in range(3)]
        for r in self.runs:
            hit, pos = lookup_sorted(r.nodes[0], ids)
            found |= hit
            for col, vals in zip(cols, r.nodes[1:], strict=True):
                col[hit] = vals[pos[hit]]
        return found, cols[0], cols[1], cols[2]

    def _edges(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(found, etype)`` of each committed new edge (-1 if none)."""
        found = np.zeros(len(eids), dtype=bool)
        etype = np.full(len(eids), -1, np.int64)
        for r in self.runs if len(eids) else []:  # no eid asked: no run's eid index made
            by_eid = r.edges_by_eid()
            hit, pos = lookup_sorted(by_eid[0], eids)
            found |= hit
            etype[hit] = by_eid[1][pos[hit]]
        hit, pos = lookup_sorted(self.base_eids[0], eids)  # folded into the base CSC
        etype[hit] = self.base_eids[1][pos[hit]]
        return found | hit, etype

    # ---- reads

    def has_edges(self, eids: np.ndarray) -> np.ndarray:
        """Whether each edge id is a committed new edge (or one folded into the base)."""
        return self._edges(eids)[0]

    def node_types_of(self, ids: np.ndarray, extra: Batch | None = None) -> np.ndarray:
        """The ntype of each committed growth node (or new in ``extra``); -1 otherwise."""
        out = self._nodes(ids)[1].astype(np.int32)
        if extra is not None and len(extra.nodes):
            o = np.argsort(extra.nodes)
            hit, p = lookup_sorted(extra.nodes[o], ids)
            out[hit] = extra.ntypes[o][p[hit]]
        return out

    def edge_types_of(self, eids: np.ndarray, extra: Batch | None = None) -> np.ndarray:
        return self._edges(eids)[1].astype(np.int32)

    def nodes_at(self, ids: np.ndarray, version: int) -> np.ndarray:
        """Whether each growth id is a node visible at ``version``."""
        found, _, _, ver = self._nodes(ids)
        return found & (ver <= version)

    def nodes_upto(self, version: int, since: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, ntypes)`` of the growth nodes visible at ``version`` and added after
        ``since``, by id."""
        runs = self.runs
        at = [(r.nodes[3] <= version) & (r.nodes[3] > since) for r in runs]
        ids = concat([r.nodes[0][m] for r, m in zip(runs, at, strict=True)], np.int64)
        types = concat([r.nodes[1][m] for r, m in zip(runs, at, strict=True)], np.int32)
        o = np.argsort(ids, kind="stable")
        return ids[o], types[o].astype(np.int32)

    def orig_of(self, ids: np.ndarray) -> np.ndarray:
        """Original ids of committed growth nodes (-1 where unknown)."""
        return self._nodes(ids)[2]

    def in_edges(self, dst: np.ndarray, version: int) -> tuple[np.ndarray, np.ndarray]:
        """The new edges into each of ``dst`` visible at ``version`` (not deleted by then):
        ``(counts int64 [len(dst)], edges int64 [4, m]: src, dst, eid, etype)``, grouped
        by ``dst`` in its order."""
        seeds, found = [], []
        order = np.argsort(dst, kind="stable")  # sorted needles: a fraction of the misses
        in_order = dst[order]
        lo, hi = np.empty(len(dst), np.int64), np.empty(len(dst), np.int64)
        for r in self.runs:  # sorted by dst: only the seeds' runs are looked at
            e = r.edges
            lo[order] = np.searchsorted(e[1], in_order, side="left")
            hi[order] = np.searchsorted(e[1], in_order, side="right")
            pos = spans(lo, hi)
            seeds.append(np.repeat(np.arange(len(dst)), hi - lo))
            found.append(e[:, pos])
        seed = concat(seeds, np.int64)
        e = np.hstack([np.empty((5, 0), np.int64), *found])
        keep = (e[4] <= version) & ~self.deleted(e[2], version)
        seed, e = seed[keep], e[:4, keep]
        o = _by_seed_and_eid(seed, e[2])  # by edge id: the order compaction keeps
        return np.bincount(seed, minlength=len(dst)).astype(np.int64), e[:, o]

    def new_edges(self, version: int) -> np.ndarray:
        """int64 [4, m] (src, dst, eid, etype) of new edges visible at ``version``."""
        e = np.hstack([np.empty((5, 0), np.int64), *(r.edges for r in self.runs)])
        return e[:4, (e[4] <= version) & ~self.deleted(e[2], version)]

    def deleted(self, eids: np.ndarray, version: int) -> np.ndarray:
        """Whether each edge id is deleted at ``version``."""
        out = np.zeros(len(eids), dtype=bool)
        for r in self.runs:
            found, pos = lookup_sorted(r.deleted[0], eids)
            out |= found & (values_at(r.deleted[1], found, pos, 0) <= version)
        return out

    def deleted_at(self, version: int) -> np.ndarray:
        return concat([r.deleted[0][r.deleted[1] <= version] for r in self.runs], np.int64)

    def out_change(self, ids: np.ndarray, version: int, resolve: Resolver) -> np.ndarray:
        """How the delta at ``version`` changes the out-degree of each of ``ids`` on this
        partition: new edges leaving it minus deleted ones. ``resolve`` gives the sources
        of base edge ids (asked once per run, for its deletions). Only the ids' own
        entries are looked at, never the whole delta."""
        out = np.zeros(len(ids), np.int64)
        gone_eid = []
        for r in self.runs:
            by_src = r.edges_by_src()
            lo, hi = np.searchsorted(by_src[0], ids), np.searchsorted(by_src[0], ids, "right")
            seed = np.repeat(np.arange(len(ids)), hi - lo)
            keep = by_src[1][spans(lo, hi)] <= version
            out += np.bincount(seed[keep], minlength=len(ids))
            src, eff, eid = self._deleted_src(r, resolve)
            lo, hi = np.searchsorted(src, ids), np.searchsorted(src, ids, side="right")
            pos, seed = spans(lo, hi), np.repeat(np.arange(len(ids)), hi - lo)
            keep = eff[pos] <= version
            gone_eid.append(np.vstack([eid[pos[keep]], seed[keep]]))
        src, count = self.base_out  # new sources of edges folded into the base CSC
        lo, hi = np.searchsorted(src, ids), np.searchsorted(src, ids, "right")
        out[hi > lo] += count[lo[hi > lo]]
        gone = np.unique(np.hstack([np.empty((2, 0), np.int64), *gone_eid]), axis=1)
        out -= np.bincount(gone[1], minlength=len(ids))  # an edge deleted twice counts once
        return out

    def _deleted_src(self, r: Run, resolve: Resolver) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A run's deletions as ``(src, version counted from, eid)``, sorted by src."""
        if r.del_src is None:
            d_eid = r.deleted[0]
            src = np.full(len(d_eid), -1, np.int64)
            eff = r.deleted[1].copy()
            new = np.zeros(len(d_eid), dtype=bool)
            for other in self.runs:  # deleted new edges: their source and version here
                by_eid = other.edges_by_eid() if len(d_eid) else np.empty((4, 0), np.int64)
                hit, pos = lookup_sorted(by_eid[0], d_eid)
                src[hit], new[hit] = by_eid[2][pos[hit]], True
                eff[hit] = np.maximum(eff[hit], by_eid[3][pos[hit]])
            src[~new] = resolve(d_eid[~new])
            o = np.argsort(src, kind="stable")
            r.del_src = (src[o], eff[o], d_eid[o])
        return r.del_src

    def has_rows(self, key: str) -> bool:
        return any(key in r.rows for r in self.runs)

    def rows(self, key: str, ids: np.ndarray, version: int, out: np.ndarray) -> np.ndarray:
        """Write into ``out[i]`` the latest row of ``ids[i]`` written at a version
        ``<= version`` (a new item's row or an update); returns whether each was found."""
        best = np.full(len(ids), -1, np.int64)  # the version of the row written so far
        for r in self.runs:
            entry = r.rows.get(key)
            if entry is None:
                continue
            r_ids, r_ver, r_vals = entry
            pos = latest(r_ids, r_ver, ids, version)
            take = pos >= 0
            take[take] = r_ver[pos[take]] > best[take]
            out[take] = r_vals[pos[take]]
            best[take] = r_ver[pos[take]]
        return best >= 0
