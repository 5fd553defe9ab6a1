"""The read index of a partition's live delta (:class:`graphrun.store.live.LiveDelta`):
committed pieces as a short list of sorted runs, merged log-structured (:class:`Run`).

No torch here: the store imports none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

# ---- a checked piece ------------------------------------------------------------------


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
    older is not larger than the newer, so ``log2(commits)`` runs at most are read and
    every entry is merged ``log2(commits)`` times in all (amortised per commit: the batch
    times a logarithm, never the whole delta). Every array is sorted by its key, then by
    version; a merge concatenates two runs' sorted arrays and sorts them stably, which
    for two sorted runs in version order (commits in version order, the usual case) is a
    linear merge (timsort), not a sort (:func:`_order`)."""

    batches: list[Batch]
    size: int  # index entries: nodes, edges, deletions, rows
    first: int  # the lowest and the highest version in it
    last: int
    nodes: np.ndarray  # int64 [4, n]: growth node id, ntype, orig id, version; by id
    edges: np.ndarray  # int64 [5, m]: src, dst, eid, etype, version; by dst
    by_eid: np.ndarray  # int64 [4, m]: eid, etype, src, version; by eid
    by_src: np.ndarray  # int64 [2, m]: src, version; by src
    deleted: np.ndarray  # int64 [2, d]: deleted eid, the version that deleted it; by eid
    # key -> (ids, versions, rows) by id: new items' rows and updates
    rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    # the deleted edges' sources, sorted, with the version from which each counts (the
    # later of the deletion and the edge's own): filled on the first out-degree read
    del_src: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


def _entries(b: Batch) -> int:
    return (
        len(b.nodes) + len(b.etypes) + len(b.deleted) + sum(len(i) for i, _ in b.updates.values())
    )


def _order(key: np.ndarray, ver: np.ndarray, in_version_order: bool) -> np.ndarray:
    """The order by (key, version) of entries that come in version order (a stable sort
    by the key alone: linear for sorted runs) or not (both keys)."""
    return np.argsort(key, kind="stable") if in_version_order else np.lexsort((ver, key))


def _sorted(cols: np.ndarray, key: int, ver: int, in_version_order: bool) -> np.ndarray:
    return cols[:, _order(cols[key], cols[ver], in_version_order)]


def _hcat(parts: list[np.ndarray], rows: int) -> np.ndarray:
    return np.hstack([np.empty((rows, 0), np.int64), *parts])


def _make_run(
    batches: list[Batch],
    cols: tuple[np.ndarray, ...],
    rows: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]],
    in_version_order: bool,
) -> Run:
    """A run of ``batches`` from their unsorted (or run-wise sorted) columns."""
    nodes, edges, by_eid, by_src, deleted = cols
    versions = [b.version for b in batches]
    run = Run(
        batches, sum(_entries(b) for b in batches), min(versions), max(versions),
        _sorted(nodes, 0, 3, in_version_order), _sorted(edges, 1, 4, in_version_order),
        by_eid[:, np.argsort(by_eid[0], kind="stable")],  # edge ids are unique
        _sorted(by_src, 0, 1, in_version_order), _sorted(deleted, 0, 1, in_version_order),
    )  # fmt: skip
    for key, (i, v, r) in rows.items():
        ids, vers = np.concatenate(i), np.concatenate(v)
        o = _order(ids, vers, in_version_order)
        run.rows[key] = (ids[o], vers[o], np.concatenate(r)[o])
    return run


def build_run(batches: list[Batch]) -> Run:
    """A run of freshly committed batches (taken in version order)."""
    batches = sorted(batches, key=lambda b: b.version)

    def ver(b: Batch, n: int) -> np.ndarray:
        return np.full((1, n), b.version, dtype=np.int64)

    nodes = _hcat([np.vstack([b.nodes, b.ntypes, b.orig, ver(b, len(b.nodes))[0]])
                   for b in batches], 4)  # fmt: skip
    edges = _hcat([np.vstack([b.edges, b.etypes[None], ver(b, len(b.etypes))])
                   for b in batches], 5)  # fmt: skip
    deleted = _hcat([np.vstack([b.deleted, ver(b, len(b.deleted))[0]]) for b in batches], 2)
    rows: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]] = {}
    for b in batches:
        for key, (ids, vals) in (*b.new_rows.items(), *b.updates.items()):
            i, v, r = rows.setdefault(key, ([], [], []))
            i.append(ids)
            v.append(ver(b, len(ids))[0])
            r.append(vals)
    cols = (nodes, edges, edges[[2, 3, 0, 4]], edges[[0, 4]], deleted)
    return _make_run(batches, cols, rows, True)


def merge_runs(older: Run, newer: Run) -> Run:
    """One run of two: their sorted arrays merged (linear when in version order)."""
    rows: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]] = {}
    for r in (older, newer):
        for key, (ids, vers, vals) in r.rows.items():
            i, v, x = rows.setdefault(key, ([], [], []))
            i.append(ids)
            v.append(vers)
            x.append(vals)
    cols = tuple(
        np.hstack([a, b])
        for a, b in zip(
            (older.nodes, older.edges, older.by_eid, older.by_src, older.deleted),
            (newer.nodes, newer.edges, newer.by_eid, newer.by_src, newer.deleted),
            strict=True,
        )
    )
    return _make_run(older.batches + newer.batches, cols, rows, older.last < newer.first)


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
