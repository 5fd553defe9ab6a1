"""The read index of a partition's live delta (:class:`graphrun.store.live.LiveDelta`):
committed pieces as a short list of sorted runs, merged log-structured (:class:`Run`).

No torch here: the store imports none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import numpy.typing as npt

# ---- a checked piece ------------------------------------------------------------------

IdRuns = tuple[np.ndarray, np.ndarray]  # sorted [start, end) runs of ids (:func:`id_runs`)


@dataclass
class Batch:
    """A checked piece as arrays (see :class:`graphrun.store.live.Piece`)."""

    version: int
    nodes: np.ndarray
    ntypes: np.ndarray
    orig: np.ndarray
    edges: np.ndarray  # int64 [3, m]
    etypes: np.ndarray
    deleted: np.ndarray
    new_rows: dict[str, tuple[np.ndarray, np.ndarray]]  # key -> (new ids, their rows)
    updates: dict[str, tuple[np.ndarray, np.ndarray]]  # key -> (ids, new rows)
    # the :func:`id_runs` of ``nodes`` and of the edge ids (``check_piece``'s, which
    # asked whether they are taken; ``LiveDelta.hold`` takes them), or None: found there
    taken: tuple[IdRuns, IdRuns] | None = None

    @property
    def nbytes(self) -> int:
        arrays = [self.nodes, self.ntypes, self.orig, self.edges, self.etypes, self.deleted]
        arrays += [a for d in (self.new_rows, self.updates) for pair in d.values() for a in pair]
        return sum(int(a.nbytes) for a in arrays)


def lookup_sorted(sorted_ids: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(found, position)`` of each id in a sorted array."""
    if len(sorted_ids) == 0:
        return np.zeros(len(ids), dtype=bool), np.zeros(len(ids), dtype=np.int64)
    pos = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return sorted_ids[pos] == ids, pos


def values_at(values: np.ndarray, found: np.ndarray, pos: np.ndarray, fill: int) -> np.ndarray:
    """``values[pos]`` where found, ``fill`` elsewhere (``values`` may be empty)."""
    if len(values) == 0:
        return np.full(len(pos), fill, dtype=np.int64)
    return np.where(found, values[pos], fill)


def concat(parts: list[np.ndarray], dtype: npt.DTypeLike) -> np.ndarray:
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
class Run:
    """Committed pieces as sorted arrays: one run of the delta's read index.

    The index is a short list of runs (a log-structured merge): a commit adds a run of
    its own piece, sorted in time linear in the piece, and two runs are merged when the
    older is not over twice the newer (:func:`due`), so at rest ``log2(entries) + 1``
    runs at most are read and every entry is merged about ``log2(commits)`` times in all
    (amortised per commit: the batch times a logarithm, never the whole delta). Every
    array is sorted by its key, then by version. Runs in version order (each one's
    versions all below the next one's: commits in version order, the usual case) merge
    without a full sort (:func:`_merge`)."""

    batches: list[Batch]
    size: int  # index entries: nodes, edges, deletions, rows
    first: int  # the lowest and the highest version in it
    last: int
    nodes: np.ndarray  # int64 [4, n]: growth node id, ntype, orig id, version; by id
    edges: np.ndarray  # int64 [5, m]: src, dst, eid, etype, version; by dst
    deleted: np.ndarray  # int64 [2, d]: deleted eid, the version that deleted it; by eid
    # key -> (ids, versions, rows) by id: new items' rows and updates
    rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    # made on the first out-degree or out-edge read (no sampling needs them): the new
    # edges by src (int64 [3, m]: src, version, position in ``edges``), and the deleted
    # edges' sources, sorted, with the version from which each counts (the later of the
    # deletion and the edge's own)
    by_src: np.ndarray | None = None
    del_src: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    # the new edges by edge id (int64 [5, m]: eid, etype, src, version, dst), made on the
    # first look-up of an edge id (a deletion, an edge feature's update): an ingest of
    # new edges alone never pays for it, and a merge keeps it once either run has it
    by_eid: np.ndarray | None = None
    # the lowest and the highest new edge id in it, and whether each destination's
    # edges come in edge-id order (the order a read of its in-edges gives them): then
    # a sampler reads a seed's new edges straight from the runs (sampling/live.py)
    eid_range: tuple[int, int] = (0, -1)
    eid_sorted: bool = False
    # a big run's edges by destination row, made on the first read that asks
    # (:meth:`dst_spans`): ``((first, end), indptr)`` over a partition's base rows
    by_dst: tuple[tuple[int, int], np.ndarray] | None = None

    def edges_by_eid(self) -> np.ndarray:
        by_eid = self.by_eid
        if by_eid is None:
            by_eid = self.edges[[2, 3, 0, 4, 1]]
            by_eid = self.by_eid = by_eid[:, np.argsort(by_eid[0], kind="stable")]
        return by_eid

    def dst_spans(self, dst: np.ndarray, rows: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """``[lo, hi)`` of each of ``dst`` in :attr:`edges` (searched faster sorted). A
        run of :data:`DENSE_MIN` edges or more, and at least as many as ``rows`` (the
        partition's base rows, ``[first, end)``), finds the destinations among them
        in an index of the rows made once (:attr:`by_dst`): two binary searches of a
        second hop's 10k seeds in 2M edges took 5 ms of CPU, mostly cache misses."""
        d = self.edges[1]
        if len(d) < DENSE_MIN or rows[1] - rows[0] > len(d):  # the index: at most 8 B an edge
            return np.searchsorted(d, dst, "left"), np.searchsorted(d, dst, "right")
        if self.by_dst is None or self.by_dst[0] != rows:
            i0, i1 = np.searchsorted(d, rows)
            indptr = np.empty(rows[1] - rows[0] + 1, np.int64)
            indptr[0] = i0
            np.cumsum(np.bincount(d[i0:i1] - rows[0], minlength=rows[1] - rows[0]),
                      out=indptr[1:])  # fmt: skip
            indptr[1:] += i0
            self.by_dst = (rows, indptr)
        indptr = self.by_dst[1]
        inside = (dst >= rows[0]) & (dst < rows[1])
        lo, hi = np.empty((2, len(dst)), np.int64)
        at = dst[inside] - rows[0]
        lo[inside], hi[inside] = indptr[at], indptr[at + 1]
        grown = dst[~inside]  # new nodes' rows: few
        lo[~inside], hi[~inside] = (
            np.searchsorted(d, grown, "left"),
            np.searchsorted(d, grown, "right"),
        )
        return lo, hi

    def edges_by_src(self) -> np.ndarray:
        if self.by_src is None:
            o = np.argsort(self.edges[0], kind="stable")
            self.by_src = np.vstack([self.edges[[0, 4]][:, o], o])
        return self.by_src


#: the fewest edges of a run whose destinations' spans are indexed (:meth:`Run.dst_spans`)
DENSE_MIN = 1 << 16


def entries(b: Batch) -> int:
    """A batch's index entries: nodes, edges, deletions, rows updated."""
    return (
        len(b.nodes) + len(b.etypes) + len(b.deleted) + sum(len(i) for i, _ in b.updates.values())
    )


def _sorted(cols: np.ndarray, key: int, compiled: bool = False) -> np.ndarray:
    """Columns in version order, by (row ``key``, version): the order of a stable sort
    of the key (one sort, where a ``lexsort`` of both is two). ``compiled`` (the merging
    thread has loaded :mod:`~graphrun.store.live_kernels`): one compiled radix sort
    that writes each row in order (:func:`~graphrun.store.live_kernels.sort_columns`),
    for non-negative keys."""
    if compiled and cols.shape[1] > 1 and int(cols[key].min()) >= 0:
        from graphrun.store.live_kernels import sort_columns

        out = np.empty_like(cols)
        sort_columns(cols, key, out)
        return out
    return cols[:, stable_order(cols[key])]


def stable_order(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of int64 keys. Non-negative keys that leave
    room for a position are sorted as ``(key, position)`` packed into one int64 (all
    distinct: an unstable sort gives the stable order) at half the CPU of numpy's
    stable sort of int64 (a timsort): 114 against 221 µs for a 5,000-edge commit's keys
    (benchmarks/README.md, issue 42, ingest round 7)."""
    n = len(keys)
    bits = max(n - 1, 1).bit_length()
    if n < 2 or int(keys.min()) < 0 or int(keys.max()) >= 1 << (62 - bits):
        return np.argsort(keys, kind="stable")
    packed = (keys.astype(np.int64) << bits) | np.arange(n, dtype=np.int64)
    packed.sort()
    return packed & ((1 << bits) - 1)


def _table(batches: list[Batch], cols: Callable[[Batch], list[np.ndarray]]) -> np.ndarray:
    """int64 ``[len(cols(b)) + 1, n]``: the batches' columns side by side and each one's
    version in the last row, written into one array (no stack made per batch)."""
    parts = [cols(b) for b in batches]
    sizes = [len(c[0]) for c in parts]
    out = np.empty((len(parts[0]) + 1 if parts else 1, sum(sizes)), np.int64)
    at = 0
    for b, c, n in zip(batches, parts, sizes, strict=True):
        for r, a in enumerate(c if n else ()):
            out[r, at : at + n] = a
        out[-1, at : at + n] = b.version
        at += n
    return out


def _run(
    batches: list[Batch], nodes: np.ndarray, edges: np.ndarray, deleted: np.ndarray,
    eids: tuple[tuple[int, int], bool] | None = None,
) -> Run:  # fmt: skip
    """A run of these sorted arrays; ``eids``: its :attr:`Run.eid_range` and
    :attr:`Run.eid_sorted` where known (a merge's), else found here (linear)."""
    versions = [b.version for b in batches]
    size = sum(entries(b) for b in batches)
    span, ordered = _eid_order(edges) if eids is None else eids
    return Run(batches, size, min(versions), max(versions), nodes, edges, deleted,
               eid_range=span, eid_sorted=ordered)  # fmt: skip


def _eid_order(edges: np.ndarray) -> tuple[tuple[int, int], bool]:
    """``(lowest, highest)`` edge id of edges sorted by destination, and whether every
    destination's edges are in edge-id order."""
    if edges.shape[1] == 0:
        return (0, -1), True
    dst, eid = edges[1], edges[2]
    ordered = bool(((dst[1:] != dst[:-1]) | (eid[1:] > eid[:-1])).all())
    return (int(eid.min()), int(eid.max())), ordered


def eids_in_order(runs: list[Run]) -> bool:
    """Whether each destination's new edges, read run after run in this order, come in
    edge-id order: every run in order within itself, and each run's edge ids above the
    runs' before it (a partition's edge ids grow with the version: the sequencer's
    growth blocks, handed out in version order)."""
    last = -1
    for r in runs:
        if r.edges.shape[1] == 0:
            continue
        if not r.eid_sorted or r.eid_range[0] <= last:
            return False
        last = r.eid_range[1]
    return True


def build_run(batches: list[Batch], compiled: bool = False) -> Run:
    """A run of ``batches`` (fresh commits; or two runs out of version order), sorted
    (``compiled``: by the compiled kernels, loaded already: :func:`_sorted`)."""
    batches = sorted(batches, key=lambda b: b.version)

    def ver(b: Batch, n: int) -> np.ndarray:
        return np.full((1, n), b.version, dtype=np.int64)

    nodes = _table(batches, lambda b: [b.nodes, b.ntypes, b.orig])
    edges = _table(batches, lambda b: [*b.edges, b.etypes])
    deleted = _table(batches, lambda b: [b.deleted])
    run = _run(batches, _sorted(nodes, 0, compiled), _sorted(edges, 1, compiled),
               _sorted(deleted, 0, compiled))  # fmt: skip
    rows: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]] = {}
    for b in batches:
        for key, (ids, vals) in (*b.new_rows.items(), *b.updates.items()):
            i, v, r = rows.setdefault(key, ([], [], []))
            i.append(ids)
            v.append(ver(b, len(ids))[0])
            r.append(vals)
    for key, (i, v, r) in rows.items():
        ids, vers = np.concatenate(i), np.concatenate(v)
        o = np.argsort(ids, kind="stable")  # in version order: then by version
        run.rows[key] = (ids[o], vers[o], np.concatenate(r)[o])
    return run


def due(sizes: list[int]) -> tuple[int, int] | None:
    """The runs to merge next, as ``(first, count)``, or None: the last run that is not
    over twice the next one (a run of no entries counts as one), with it. At rest each
    run is over twice the next, so ``k`` runs hold over ``2 ** (k - 1)`` entries: at
    most ``floor(log2(entries)) + 1`` runs (:func:`run_bound`), whatever the commits'
    sizes. (The rule before, a run not larger than the next, rested at strictly
    decreasing sizes: commits of 1-40 entries left 8-12 runs of 64 commits, and
    ``sqrt(2 * entries)`` at worst.) Any adjacent pair, not only the last two: runs
    flushed by reads while the thread merged an older pair can leave a pair before
    them out of the rule. (A 4-way rule, four runs of one size tier at a time, writes
    each entry half as often but measured no cheaper in a store's merging thread and
    leaves more runs for reads: benchmarks/README.md, issue 42 round 4.)"""
    for i in range(len(sizes) - 2, -1, -1):
        if sizes[i] <= 2 * max(sizes[i + 1], 1):
            return i, 2
    return None


def run_bound(entries: int) -> int:
    """The most runs :func:`due` rests at for a delta of ``entries`` index entries."""
    return max(entries, 1).bit_length()


#: the fewest entries of a merge that the compiled pass makes (:func:`_merge`): below it
#: numpy's sort is as quick to within a fraction of a millisecond (2 x 32k entries: 0.9
#: against 0.6 ms). The merging thread loads the compiled merge when first woken (at a
#: server's start where it has a log, before it serves: benchmarks/README.md, issue 42,
#: ingest42p), so a delta that takes no write never imports numba
COMPILED_MIN = 1 << 16


def _merge(parts: list[np.ndarray], key: int, compiled: bool = False) -> np.ndarray:
    """Arrays' columns, each sorted by row ``key`` then version and the versions of each
    below the next one's, as one array sorted so. Two int64 arrays (a merge the rule
    asks for) of :data:`COMPILED_MIN` entries or more, or of any size where
    ``compiled`` (the kernels are loaded: 112 against 147 µs for two 5,000-edge runs):
    one compiled pass (:func:`~graphrun.store.live_kernels.merge_two`).
    Otherwise a stable sort of the keys of all in turn (numpy's is a timsort for int64:
    sorted runs merge in time ``n log(runs)``, the earlier run's first among equal
    keys), then each row gathered."""
    if (len(parts) == 2 and all(p.dtype == np.int64 for p in parts)
            and (compiled or parts[0].shape[1] + parts[1].shape[1] >= COMPILED_MIN)):  # fmt: skip
        from graphrun.store.live_kernels import merge_two

        a, b = parts
        out = np.empty((a.shape[0], a.shape[1] + b.shape[1]), np.int64)
        merge_two(a, b, key, out)
        return out
    row = np.concatenate([p[key] for p in parts])  # the keys, then each row in turn
    order = np.argsort(row, kind="stable")
    out = np.empty((parts[0].shape[0], len(order)), parts[0].dtype)
    for r in range(out.shape[0]):
        np.concatenate([p[r] for p in parts], out=row).take(order, out=out[r])
    return out


def _merge_rows(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One key's ``(ids, versions, rows)`` of runs in version order, as one sorted by
    (id, version): a stable sort of the ids (see :func:`_merge`)."""
    if len(parts) == 1:
        return parts[0]
    order = np.argsort(np.concatenate([p[0] for p in parts]), kind="stable")
    ids, vers, vals = (np.concatenate([p[j] for p in parts])[order] for j in range(3))
    return ids, vers, vals


def merge_runs(runs: list[Run], compiled: bool = False) -> Run:
    """One run of adjacent runs: their sorted arrays merged (sorted again only when out
    of version order); ``compiled``: as :func:`build_run`'s."""
    batches = [b for r in runs for b in r.batches]
    if any(a.last >= b.first for a, b in pairwise(runs)):
        return build_run(batches, compiled)
    ranges = [r.eid_range for r in runs if r.edges.shape[1]]
    eids = (  # in version order, each run's ids above the last's: still in order
        (min(a for a, _ in ranges), max(b for _, b in ranges)) if ranges else (0, -1),
        eids_in_order(runs),
    )
    nodes, edges, deleted = (
        _merge([getattr(r, a) for r in runs], key, compiled)
        for a, key in (("nodes", 0), ("edges", 1), ("deleted", 0))
    )
    run = _run(batches, nodes, edges, deleted, eids)
    if any(r.by_eid is not None for r in runs):
        run.by_eid = _merge([r.edges_by_eid() for r in runs], 0, compiled)
    keys = dict.fromkeys(k for r in runs for k in r.rows)
    run.rows = {k: _merge_rows([r.rows[k] for r in runs if k in r.rows]) for k in keys}
    return run


def latest(r_ids: np.ndarray, r_ver: np.ndarray, ids: np.ndarray, version: int) -> np.ndarray:
    """Per id, the position of its latest entry at a version ``<= version`` in a run
    sorted by (id, version); -1 where none."""
    pos = np.searchsorted(r_ids, ids, side="right") - 1
    live = pos >= 0
    live[live] = r_ids[pos[live]] == ids[live]
    pos[~live] = -1
    late = np.flatnonzero(live & (r_ver[np.maximum(pos, 0)] > version))
    while len(late):  # step back over later versions of the same id (rare: updates)
        pos[late] -= 1
        p = pos[late]
        gone = (p < 0) | (r_ids[np.maximum(p, 0)] != ids[late])
        pos[late[gone]] = -1
        late = late[~gone]
        late = late[r_ver[pos[late]] > version]
    return pos


# ---- ids taken -------------------------------------------------------------------------


def id_runs(ids: np.ndarray) -> IdRuns:
    """Distinct ids as sorted ``[start, end)`` runs of consecutive ids."""
    step = np.diff(ids)
    if len(ids) > 1 and not bool((step > 0).all()):
        ids = np.unique(ids)
        step = np.diff(ids)
    if len(ids) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    cut = np.flatnonzero(step != 1) + 1
    starts = ids[np.concatenate([[0], cut])]
    ends = ids[np.concatenate([cut - 1, [len(ids) - 1]])] + 1
    return starts.astype(np.int64), ends.astype(np.int64)


def run_ids(
    runs: Sequence[Sequence[int]] | np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """The ids of ``[(start, count), ...]`` runs, in order (into ``out``, int64, when
    given): :func:`id_runs` the other way. A range a run where they are few (the
    sequencer's one or two a partition: half the CPU of a repeat), else one pass (a
    piece may name a run an id)."""
    r = np.asarray(runs, np.int64).reshape(-1, 2)
    counts = r[:, 1]
    n = int(counts.sum())
    out = np.empty(n, np.int64) if out is None else out
    if len(r) <= 16:
        at = 0
        for start, count in r.tolist():
            out[at : at + count] = np.arange(start, start + count)
            at += count
    else:
        first = np.cumsum(counts) - counts  # each run's first position
        np.add(np.arange(n), np.repeat(r[:, 0] - first, counts), out=out)
    return out


class Taken:
    """Growth ids a delta holds (pending, committed or folded), as sorted disjoint
    ``[start, end)`` runs, each with the version that holds it (0: folded). The
    sequencer hands ids out in runs, so a piece's new ids are a few runs: whether one is
    taken is a lookup of those runs (:meth:`any_of`), not of each id in every run of the
    read index."""

    def __init__(self) -> None:
        self.runs = np.empty((3, 0), np.int64)  # start, end, version; by start

    def any_of(self, ids: np.ndarray, runs: IdRuns | None = None) -> bool:
        """Whether any of ``ids`` is taken (``runs``: their :func:`id_runs`, if known)."""
        if len(ids) == 0 or self.runs.shape[1] == 0:
            return False
        s, e = id_runs(ids) if runs is None else runs
        i = np.searchsorted(self.runs[0], e, side="left") - 1
        return bool(((i >= 0) & (self.runs[1][np.maximum(i, 0)] > s)).any())

    def add(self, ids: np.ndarray, version: int, runs: IdRuns | None = None) -> None:
        """Take ``ids`` (none of them taken: :meth:`any_of` said so) for ``version``."""
        if len(ids) == 0:
            return
        s, e = id_runs(ids) if runs is None else runs
        new = np.empty((3, len(s)), np.int64)
        new[0], new[1], new[2] = s, e, version
        r = self.runs
        lo, hi = np.searchsorted(r[0], [s[0], s[-1]])
        if lo == hi:  # one slot for them all (the sequencer hands ids out in order: the end)
            self.runs = np.concatenate([r[:, :lo], new, r[:, lo:]], axis=1)
        else:  # runs of another version fall between them
            self.runs = np.insert(r, np.searchsorted(r[0], s), new, axis=1)

    def drop(self, version: int) -> None:
        """Give back the ids ``version`` took (an aborted piece)."""
        self.runs = self.runs[:, self.runs[2] != version]

    def fold(self, version: int, folded: np.ndarray) -> None:
        """A compaction folded the versions ``<= version`` into the base: their runs stay
        taken (version 0), joined where they touch (each piece adds a run or two: not
        joined, a store ingesting for hours made every ``add`` copy hundreds of
        thousands of runs). Nothing held (a server loading its compacted base at
        start): the base's growth ids ``folded`` are taken."""
        if self.runs.shape[1] == 0:
            s, e = id_runs(folded)
            self.runs = np.vstack([s, e, np.zeros(len(s), np.int64)])
            return
        r = self.runs
        r[2, r[2] <= version] = 0
        join = (r[2, 1:] == 0) & (r[2, :-1] == 0) & (r[0, 1:] == r[1, :-1])  # onto the last
        if join.any():
            first = np.flatnonzero(np.concatenate([[True], ~join]))
            last = np.concatenate([first[1:] - 1, [r.shape[1] - 1]])
            self.runs = np.vstack([r[0, first], r[1, last], r[2, first]])
