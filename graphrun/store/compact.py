"""Compaction of a live partition (issue 42, item 5): the delta folded into the base.

Every main server compacts its own partition in the background. A compaction folds the
committed pieces up to a version ``C`` into a new base:

- the CSC of the base nodes with their new in-edges (after their base in-edges, by
  edge id) and without the edges deleted at ``C``; halo rows as they were;
- the **growth** at version 0 (:attr:`LiveDelta.base <graphrun.store.live.LiveDelta>`):
  the new nodes owned here with their type and original id, the new edges into them, and
  one row per id and feature — a new node's or edge's row, an updated base row — the
  latest at ``C``. A growth id keeps its local row ``part_rows + (id - N)``
  (:func:`~graphrun.store.live.growth_row`): clients route it as before;
- with ``--live-dir``, the partition directory's ``part-K.c<C>`` and its pointer
  (:mod:`graphrun.partition.compacted`: the base rows' files with the updates applied,
  the growth as files), then the write-ahead log truncated below ``C + 1``.

The new base is built in a thread (numpy sorts release the GIL) from the delta's read
index, into new shared-memory segments; the server's loop swaps it in between two
requests (:func:`tick`): the structure arrays, the delta's folded versions dropped, the
old segments unlinked. A read at a version ``>= C`` sees the same graph before and
after (the merged CSC of a seed lists base in-edges, then new ones by edge id: the order
the folded CSC keeps). A read below ``C`` is refused after it (``view``): ``C`` never
passes the lowest version a session reads at (its pin: the ``v`` of its reads and
heartbeats, :attr:`LivePart.pins <graphrun.store.live_ops.LivePart>`), the head (asked
of the sequencer: every version ``<= C`` is decided, so no piece at or below it can
still be on its way here except an aborted one, refused) or a pending piece.

**When.** Past :data:`COMPACT_SHARE` of the delta's bound, or once the oldest unfolded
commit is :data:`COMPACT_AGE_S` old and the delta holds :data:`COMPACT_MIN_BYTES`, or
when asked (``live_compact``). Past 3/4 of the bound ``live_prepare`` answers
``retry_after`` until a compaction frees the delta: writers are slowed, never dropped.

The sequencer's state (partition 0's primary) is written to its log as one snapshot
record when the fold is swapped in, before the log is truncated
(:mod:`graphrun.store.live_log`): versions, growth blocks and original ids survive.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from graphrun.errors import ArgumentError, GraphrunError, StoreError
from graphrun.names import TensorKey
from graphrun.partition import compacted
from graphrun.rpc.tuning import background
from graphrun.store import live_ops, live_stale
from graphrun.store.live import GROWTH_BLOCK, LiveDelta
from graphrun.store.live_index import Batch, Run, build_run, concat
from graphrun.store.live_log import frozen, snapshot
from graphrun.store.live_seq import Sequencer
from graphrun.store.registry import Registry, Request, Response
from graphrun.store.state import GRAPH_JOB, Segment, ServerState

log = logging.getLogger("graphrun.store")

KEY = "graphrun.compact"
COMPACT_SHARE = 0.5  # a compaction starts past this share of LIVE_DELTA_MAX_BYTES
COMPACT_AGE_S = 60.0  # ... or when the oldest unfolded commit is this old
COMPACT_MIN_BYTES = 1 << 20  # ... and the delta holds this much (a trickle waits)
COMPACT_RETRY_S = 2.0  # a compaction that folded nothing is tried again after this
SWAP_WAIT_S = 60.0  # a built fold not swapped in by then (the loop is stuck) is dropped
_E5 = np.empty((5, 0), np.int64)


@dataclass
class Fold:
    """A new base, built off the loop."""

    version: int
    structure: dict[str, np.ndarray]  # indptr, indices, eids[, etypes] in new segments
    segments: dict[str, Segment]
    base: Run
    eids: tuple[np.ndarray, np.ndarray]
    out: tuple[np.ndarray, np.ndarray]
    rows: dict[str, tuple[np.ndarray, np.ndarray]]  # key -> (ids, latest rows at version)


class Stats(msgspec.Struct):
    """What ``live_compact`` answers: the last compaction and the longest pause."""

    compactions: int = 0
    version: int = 0  # the folded version (the floor)
    build_s: float = 0.0  # the last compaction: fold, segments, directory
    pause_s: float = 0.0  # ... the time the loop stood still to swap it in
    max_pause_s: float = 0.0
    truncated: int = 0  # log records dropped by the last compaction
    running: bool = False
    error: str = ""
    delta_bytes: int = 0  # the delta's size when asked


@dataclass
class Compactor:
    """One main server's compaction: at most one running."""

    partition_dir: Path | None  # write part-K.c<C> here (a durable store: the partition
    # directory, or a replica's own beside its log) or None
    stats: Stats = field(default_factory=Stats)
    forced: bool = False
    since: float | None = None  # when the delta last became non-empty
    thread: threading.Thread | None = None
    built: Fold | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    swapped: threading.Event = field(default_factory=threading.Event)
    closing: bool = False  # the server stops: a built fold is not swapped in
    sequencer: Sequencer | None = None  # partition 0's state at the swap, to log
    next_try: float = 0.0  # after a compaction that folded nothing (pins, the head)
    started: int = 0  # compactions done when the running one started
    lock: threading.Lock = field(default_factory=threading.Lock)  # who takes ``built``

    def take(self) -> Fold | None:
        """The built fold, once: to swap it in (the loop) or to drop it (the thread)."""
        with self.lock:
            f, self.built = self.built, None
            return f

    def due(self, delta: LiveDelta, now: float) -> bool:
        if not delta.committed:
            return False
        if self.forced:
            return True
        if now < self.next_try:
            return False
        if delta.nbytes >= COMPACT_SHARE * delta.max_bytes:
            return True
        old = self.since is not None and now - self.since >= COMPACT_AGE_S
        return old and delta.nbytes >= COMPACT_MIN_BYTES


# ---- the fold (pure arrays)


def _latest_rows(runs: list[Run], version: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per feature, the latest row at ``version`` of every id written (by id)."""
    out: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]] = {}
    for r in runs:
        for key, (ids, ver, vals) in r.rows.items():
            keep = ver <= version
            i, v, x = out.setdefault(key, ([], [], []))
            i.append(ids[keep])
            v.append(ver[keep])
            x.append(vals[keep])
    rows = {}
    for key, (i, v, x) in out.items():
        ids, ver, vals = np.concatenate(i), np.concatenate(v), np.concatenate(x)
        o = np.lexsort((ver, ids))
        last = np.r_[ids[o][1:] != ids[o][:-1], True] if len(o) else np.empty(0, bool)
        if last.any():
            rows[key] = (ids[o][last], vals[o][last])
    return rows


def fold_csc(
    structure: dict[str, np.ndarray], owned: tuple[int, int], new: np.ndarray, gone: np.ndarray
) -> dict[str, np.ndarray]:
    """The base CSC with ``new`` (int64 [4, m]: src, dst, eid, etype into base nodes, by
    eid) appended to their rows and the edges ``gone`` (sorted eids) removed."""
    indptr, indices, eids = structure["indptr"], structure["indices"], structure["eids"]
    etypes = structure.get("etypes")
    inner = owned[1] - owned[0]
    end = int(indptr[inner])
    row = np.repeat(np.arange(inner, dtype=np.int64), np.diff(indptr[: inner + 1]))
    keep = ~np.isin(eids[:end], gone, assume_unique=False)
    rows = np.concatenate([row[keep], new[1] - owned[0]])
    order = np.argsort(rows, kind="stable")  # a row: its kept edges, then the new by eid
    counts = np.bincount(rows, minlength=inner).astype(np.int64)
    n_in = len(rows)
    out = {
        "indptr": np.concatenate([[0], np.cumsum(counts), indptr[inner + 1 :] - end + n_in]),
        "indices": np.concatenate([indices[:end][keep], new[0]])[order],
        "eids": np.concatenate([eids[:end][keep], new[2]])[order],
    }
    out["indices"] = np.concatenate([out["indices"], indices[end:]])
    out["eids"] = np.concatenate([out["eids"], eids[end:]])
    if etypes is not None:
        et = np.concatenate([etypes[:end][keep], new[3].astype(etypes.dtype)])[order]
        out["etypes"] = np.concatenate([et, etypes[end:]])
    out["indptr"] = out["indptr"].astype(np.int64)
    return out


def base_tables(
    structure: dict[str, np.ndarray], owned: tuple[int, int], num_nodes: int, num_edges: int
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``(eids, out)`` of a folded CSC: the (sorted eid, etype) of its new edges and the
    (sorted growth source, count) of its edges from new nodes (LiveDelta.base_eids/out)."""
    end = int(structure["indptr"][owned[1] - owned[0]])
    eids, src = structure["eids"][:end], structure["indices"][:end]
    et = structure.get("etypes")
    new = np.flatnonzero(eids >= num_edges)
    o = np.argsort(eids[new], kind="stable")
    types = et[:end][new][o].astype(np.int64) if et is not None else np.zeros(len(new), np.int64)
    gsrc, count = np.unique(src[src >= num_nodes], return_counts=True)
    return (eids[new][o].astype(np.int64), types), (gsrc.astype(np.int64), count.astype(np.int64))


def growth_run(
    nodes: np.ndarray, types: np.ndarray, orig: np.ndarray, edges: np.ndarray,
    rows: dict[str, tuple[np.ndarray, np.ndarray]],
) -> Run:  # fmt: skip
    """The folded growth as the delta's version-0 run."""
    batch = Batch(0, nodes, types.astype(np.int32), orig, edges[:3], edges[3].astype(np.int32),
                  np.empty(0, np.int64), dict(rows), {})  # fmt: skip
    return build_run([batch])


def fold(
    runs: list[Run],
    version: int,
    structure: dict[str, np.ndarray],
    owned: tuple[int, int],
    num_nodes: int,
    num_edges: int,
) -> tuple[dict[str, np.ndarray], Run, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """``(new CSC arrays, growth run, latest rows)`` of the delta's ``runs`` at ``version``."""
    gone = np.unique(concat([r.deleted[0][r.deleted[1] <= version] for r in runs], np.int64))
    e = np.hstack([_E5, *(r.edges[:, r.edges[4] <= version] for r in runs)])
    e = e[:, ~np.isin(e[2], gone)]
    e = e[:, np.argsort(e[2], kind="stable")]
    into_base = (e[1] >= owned[0]) & (e[1] < owned[1])
    csc = fold_csc(structure, owned, e[[0, 1, 2, 3]][:, into_base], gone)
    seen = [(r.nodes[3] <= version) for r in runs]
    nodes = concat([r.nodes[0][s] for r, s in zip(runs, seen, strict=True)], np.int64)
    types = concat([r.nodes[1][s] for r, s in zip(runs, seen, strict=True)], np.int32)
    orig = concat([r.nodes[2][s] for r, s in zip(runs, seen, strict=True)], np.int64)
    rows = _latest_rows(runs, version)
    return csc, growth_run(nodes, types, orig, e[:4, ~into_base], rows), rows


# ---- the directory


def _current_dir(state: ServerState) -> Path:
    """The directory the server's base came from (its files: the fold's unchanged ones)."""
    assert state.base_root is not None  # a main server's, set when it loaded
    return compacted.current_dir(state.base_root, state.part,
                                 state.config["parts"][state.part]["dir"])  # fmt: skip


def write_dir(state: ServerState, live: live_ops.LivePart, root: Path, f: Fold) -> None:
    """``part-K.c<C>`` of the fold and its pointer in ``root`` (the partition directory,
    or a replica's own: :mod:`graphrun.partition.compacted`); the server's base comes
    from there after it."""
    src = _current_dir(state)
    files = {"nodes.npy": src / "nodes.npy"}
    arrays: dict[str, np.ndarray] = dict(f.structure)
    arrays = {f"{k}.npy": v for k, v in arrays.items()}
    names: dict[str, str] = {}
    for job, name in list(state.tensors):
        key, spec = TensorKey.parse(name), live.schema.features.get(name)
        if job != GRAPH_JOB or key is None or spec is None:
            continue
        rel = f"{key.kind}/{key.type}/{key.name}.npy"
        ids, vals = f.rows.get(name, (np.empty(0, np.int64), None))
        first = live.schema.num_nodes if key.kind == "node" else live.schema.num_edges
        base = ids < first
        if base.any() and vals is not None:
            arr = np.array(np.load(src / rel, mmap_mode="r"))
            arr[ids[base] - spec.lo] = vals[base]
            arrays[rel] = arr
        else:
            files[rel] = src / rel
        if (~base).any() and vals is not None:
            i = str(len(names))
            names[i] = name
            arrays[f"growth/rows/{i}.ids.npy"] = ids[~base]
            arrays[f"growth/rows/{i}.npy"] = vals[~base]
    b = f.base
    arrays["growth/nodes.npy"], arrays["growth/types.npy"] = b.nodes[0], b.nodes[1].astype(np.int32)
    arrays["growth/orig.npy"], arrays["growth/edges.npy"] = b.nodes[2], b.edges[:4]
    compacted.write(root, state.part, f.version, arrays, files, names)
    state.base_root = root


def restore(state: ServerState, delta: LiveDelta) -> None:
    """Install the partition's compacted growth (if it was compacted) before the log is
    replayed: the base CSC was loaded from the compacted directory already."""
    got = compacted.read(state.base_root, state.part) if state.base_root else None
    if got is None:
        return
    d, man = got

    def load(rel: str) -> np.ndarray:
        return np.asarray(np.load(d / rel))

    rows = {
        key: (load(f"growth/rows/{i}.ids.npy"), load(f"growth/rows/{i}.npy"))
        for i, key in man.rows.items()
    }
    edges = load("growth/edges.npy").reshape(4, -1)
    run = growth_run(load("growth/nodes.npy"), load("growth/types.npy"),
                     load("growth/orig.npy"), edges, rows)  # fmt: skip
    book = state.book
    eids, out = base_tables(state.structure, book.owned_nodes(state.part), book.num_nodes,
                            book.num_edges)  # fmt: skip
    delta.fold(man.live_version, run, eids, out)
    live_stale.of(state).floor = man.live_version  # its files hold the updates: no rows
    log.info("live: partition %d loaded compacted at version %d (%d new nodes, %d new "
             "edges into them)", state.part, man.live_version, run.nodes.shape[1],
             run.edges.shape[1])  # fmt: skip


def seed_sequencer(state: ServerState, seq: Sequencer, root: Path) -> None:
    """A sequencer that logged nothing (a new store, or a new ``--live-dir``) on a
    compacted directory: its versions, growth blocks and original ids from every
    partition's compacted directory (new ids come from fresh blocks)."""
    if seq.next_version != 1:
        return
    book, top = state.book, 0
    nodes: list[tuple[int, np.ndarray]] = []
    edges: list[tuple[int, np.ndarray]] = []
    orig: list[np.ndarray] = []
    for p in range(book.num_parts):
        where = state.base_root if p == state.part and state.base_root else root
        ptr = compacted.read_pointer(where, p)  # its files are checked by its own server
        if ptr is None:
            continue
        d, top = where / ptr.dir, max(top, ptr.live_version)
        ids = np.load(d / "growth/nodes.npy")
        nodes.append((p, ids))
        orig.append(np.load(d / "growth/orig.npy"))
        eids = np.load(d / "eids.npy", mmap_mode="r")
        grown = np.load(d / "growth/edges.npy").reshape(4, -1)[2]
        edges.append((p, np.concatenate([eids[eids >= book.num_edges], grown])))
    if not top:
        return
    for blocks, owned in ((seq.nodes, nodes), (seq.edges, edges)):
        for p, ids in owned:
            for b in np.unique((ids - blocks.base) // GROWTH_BLOCK).tolist():
                blocks.owners += [-1] * (b + 1 - len(blocks.owners))
                blocks.owners[b] = p
        blocks.open = {}  # every block closed: new ids come from new blocks
    ids = np.concatenate([i for _, i in nodes])
    seq.orig = dict(zip(np.concatenate(orig).tolist(), ids.tolist(), strict=True))
    seq.next_version, seq.head = top + 1, top
    log.info("live: the sequencer starts at version %d from the compacted directories "
             "(%d new nodes)", top, len(ids))  # fmt: skip


# ---- on the server


def _head(live: live_ops.LivePart) -> int:
    """The sequencer's head (asked from the compaction thread, on a client of its own:
    the server's loop uses the link's)."""
    if live.seq is not None:
        return live.seq.head
    link = live.seq_link
    if not link.address:
        raise StoreError("compaction: the sequencer's address is not known yet")
    from graphrun.rpc.transport import RpcClient

    with RpcClient(link.address, keys=link.keys, timeout=link.timeout) as c:
        head = c.call("live_head", {}).body.get("head")
    if not isinstance(head, int):
        raise StoreError("compaction: live_head answered no head")
    return head


def _build(comp: Compactor, state: ServerState, live: live_ops.LivePart, pin: int) -> None:
    """The thread: choose C, fold, write, wait for the swap, truncate the log; as
    background work (:func:`~graphrun.rpc.tuning.background`: the loop's reads first)."""
    background()
    t0 = time.perf_counter()
    made: list[str] = []  # new segments, unlinked unless swapped in
    segments = state.segments
    assert segments is not None  # a main server's
    try:
        bound = min(pin, _head(live))
        pending = list(live.delta.pending)
        if pending:
            bound = min(bound, min(pending) - 1)
        versions = [v for v in list(live.delta.committed) if v <= bound]
        if not versions:
            return
        version = max(versions)
        owned, book = live.schema.owned_nodes, state.book
        csc, base, rows = fold(live.delta.runs, version, dict(state.structure), owned,
                               book.num_nodes, book.num_edges)  # fmt: skip
        eids, out = base_tables(csc, owned, book.num_nodes, book.num_edges)
        arrays, segs = {}, {}
        for name, arr in csc.items():
            seg, arrays[name] = segments.copy_in(arr)
            made.append(seg)
            segs[name] = Segment(seg, str(arr.dtype), tuple(arr.shape))
        f = Fold(version, arrays, segs, base, eids, out, rows)
        durable = comp.partition_dir is not None and live.log is not None
        if comp.partition_dir is not None:
            try:
                write_dir(state, live, comp.partition_dir, f)
            except (GraphrunError, OSError) as exc:  # folded in memory all the same
                durable, comp.stats.error = False, f"compaction: {exc} (the log is kept)"
                log.warning("%s", comp.stats.error)
        comp.stats.build_s = round(time.perf_counter() - t0, 4)
        comp.built = f
        comp.ready.set()
        waited = comp.swapped.wait(SWAP_WAIT_S) and not comp.closing
        if not waited and comp.take() is not None:  # dropped: its segments go
            raise StoreError(f"compaction: the fold at {version} was not swapped in")
        made = []  # swapped in: the server owns its segments now
        seq, comp.sequencer = comp.sequencer, None
        if durable and live.log is not None:
            if seq is not None:
                snapshot(live.log, seq)
            comp.stats.truncated = live.log.wal.truncate_before(version + 1)
    except (GraphrunError, OSError, ValueError) as exc:
        comp.stats.error = f"compaction: {exc}"
        log.warning("%s", comp.stats.error)
    finally:
        for name in made:
            segments.unlink(name)


def _swap(state: ServerState, live: live_ops.LivePart, comp: Compactor, f: Fold) -> None:
    """Between two requests: the new base in, the folded versions out."""
    t0 = time.perf_counter()
    old = [state.structure_segments[k] for k in f.segments if k in state.structure_segments]
    state.structure.update(f.structure)
    state.structure_segments.update(f.segments)
    live.delta.fold(f.version, f.base, f.eids, f.out)
    _ = live.delta.runs  # the unfolded pieces indexed again: part of the pause
    live_stale.note_fold(state, live.schema, f.rows, f.version)  # before it is published
    live_ops.publish(state, live)
    if live.seq is not None and live.log is not None:
        comp.sequencer = frozen(live.seq)  # logged by the thread, before it truncates
    assert state.segments is not None
    for seg in old:
        state.segments.unlink(seg.segment)
    pause = time.perf_counter() - t0
    s = comp.stats
    s.compactions, s.version, s.pause_s = s.compactions + 1, f.version, round(pause, 4)
    s.max_pause_s = max(s.max_pause_s, s.pause_s)
    comp.since = None
    log.info("live: partition %d compacted at version %d (built in %.3f s, swapped in "
             "%.4f s)", state.part, f.version, s.build_s, pause)  # fmt: skip


def min_pin(state: ServerState, live: live_ops.LivePart) -> int:
    """The lowest version a live session of this server reads at (sessions gone are
    forgotten); a large number when none does."""
    for s in [s for s in live.pins if s not in state.sessions]:
        del live.pins[s]
    return min(live.pins.values(), default=1 << 62)


def tick(state: ServerState, now: float) -> None:
    """The server loop's: swap a built fold in, or start a compaction when due."""
    live = state.extension_data.get(live_ops.KEY)
    comp = state.extension_data.get(KEY)
    if not isinstance(live, live_ops.LivePart) or not isinstance(comp, Compactor):
        return
    if comp.since is None and live.delta.committed:
        comp.since = now
    if comp.thread is not None:
        f = comp.take() if comp.ready.is_set() and not comp.swapped.is_set() else None
        if f is not None:
            _swap(state, live, comp, f)
            comp.swapped.set()
        if comp.thread.is_alive():
            return
        comp.thread = None
        comp.stats.running = False
        if comp.stats.compactions == comp.started:  # nothing folded: not every tick
            comp.next_try = now + COMPACT_RETRY_S
    if comp.due(live.delta, now):
        comp.started = comp.stats.compactions
        comp.forced = False
        comp.stats.running, comp.stats.error = True, ""
        comp.ready.clear()
        comp.swapped.clear()
        pin = min_pin(state, live)
        comp.thread = threading.Thread(target=_build, args=(comp, state, live, pin),
                                       name="graphrun-compact", daemon=True)  # fmt: skip
        comp.thread.start()


def attach(state: ServerState, partition_dir: Path | None) -> Compactor:
    comp = Compactor(partition_dir)
    state.extension_data[KEY] = comp
    return comp


def close(state: ServerState) -> None:
    live_stale.stopped(state)
    comp = state.extension_data.pop(KEY, None)
    if isinstance(comp, Compactor) and comp.thread is not None:
        comp.closing = True
        comp.swapped.set()  # the thread ends without truncating the log
        comp.thread.join(timeout=SWAP_WAIT_S)


class CompactBody(msgspec.Struct, frozen=True):
    start: bool = False


def live_compact(state: ServerState, req: Request) -> Response:
    """``start``: compact now (if anything is committed); answers the :class:`Stats`."""
    comp = state.extension_data.get(KEY)
    live = live_ops.live_of(state, req.op)
    if not isinstance(comp, Compactor):
        raise ArgumentError(f"{req.op}: this server does not compact")
    if req.args(CompactBody).start:
        comp.forced = True
        tick(state, time.monotonic())
    comp.stats.delta_bytes = live.delta.nbytes
    return Response(msgspec.to_builtins(comp.stats))


def register(registry: Registry) -> None:
    registry.add("live_compact", live_compact, needs_session=False)
    live_stale.register(registry)
