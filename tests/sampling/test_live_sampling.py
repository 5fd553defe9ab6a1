"""Sampling through a live delta (graphrun/sampling/live.py) picks what sampling the
merged CSC picks, without gathering the seeds' base in-edges."""

from __future__ import annotations

import numpy as np
import pytest

from graphrun.errors import ArgumentError
from graphrun.sampling.csc import CSCGraph
from graphrun.sampling.live import find_edges, in_degrees, merged_csc, sample_one_hop
from graphrun.store.live import Batch, LiveDelta

N = 200  # base nodes; growth ids from here
E = 10_000  # growth edge ids from here


def _graph(rng: np.random.Generator) -> CSCGraph:
    deg = rng.integers(0, 6, N)
    deg[rng.choice(N, 5, replace=False)] = 300  # hubs
    indptr = np.concatenate([[0], np.cumsum(deg)])
    m = int(indptr[-1])
    return CSCGraph(indptr, rng.integers(0, N, m), rng.permutation(m))


def _delta(rng: np.random.Generator, deleted: bool) -> LiveDelta:
    """Five commits (five runs before any merge): new nodes, new edges into base and new
    nodes, and, with ``deleted``, base and new edges deleted."""
    d, e, empty = LiveDelta(), E, np.empty(0, np.int64)
    for v in range(1, 6):
        nodes = np.arange(N + 10 * (v - 1), N + 10 * v)
        m = int(rng.integers(20, 200))
        dst = np.where(rng.random(m) < 0.7, rng.integers(0, N, m), rng.choice(nodes, m))
        edges = np.vstack([rng.integers(0, N + 10 * v, m), dst, e + np.arange(m)])
        gone = np.array([v, e - 1]) if deleted and v > 1 else empty
        e += m
        d.hold(Batch(v, nodes, np.zeros(10, np.int32), nodes + 5000, edges,
                     np.zeros(m, np.int32), gone, {}, {}), 0.0)  # fmt: skip
        d.commit(v)
    return d


@pytest.mark.parametrize("deleted", [False, True])
@pytest.mark.parametrize("replace", [False, True])
def test_sampling_through_the_delta_picks_what_the_merged_csc_picks(deleted, replace):
    rng = np.random.default_rng(int(deleted) * 2 + int(replace))
    g, d = _graph(rng), _delta(rng, deleted)
    for v in range(1, 6):
        nodes = np.concatenate([np.arange(N), np.arange(N, N + 10 * v)])
        for k in (1, 3, 10):
            seeds = rng.choice(nodes, 64)
            got = sample_one_hop(g, d, v, seeds, [k], replace=replace, seed=v * k)
            merged = merged_csc(g, d, v, seeds)
            want = merged.sample_one_hop(np.arange(64), [k], replace=replace, seed=v * k)
            for a, b in ((got.src, want.src), (got.eid, want.eid),
                         (got.seed_index, want.seed_index)):  # fmt: skip
                assert a.tolist() == b.tolist(), (v, k)
            assert got.etype is None and len(got) > 0


def test_find_edges_reads_base_and_new_edges_at_a_version():
    """``(src, dst)`` of base and new edge ids at each version; an edge deleted by then,
    or added after it, is refused by name (graph_find_edges knew base edges only)."""
    rng = np.random.default_rng(11)
    g, d = _graph(rng), _delta(rng, deleted=True)
    rows = np.repeat(np.arange(N), np.diff(g.indptr))
    for v in range(1, 6):
        new = d.new_edges(v)
        live = ~d.deleted(g.eids, v)
        eids = np.concatenate([g.eids[live][::7], new[2]])
        src, dst = find_edges(g, d, v, eids)
        want_src = np.concatenate([g.indices[live][::7], new[0]])
        want_dst = np.concatenate([rows[live][::7], new[1]])
        assert src.tolist() == want_src.tolist() and dst.tolist() == want_dst.tolist()
        gone = g.eids[~live]
        later = np.setdiff1d(d.new_edges(5)[2], new[2])
        for bad in [gone[:1], later[:1]]:
            if len(bad):
                with pytest.raises(ArgumentError, match=f"eids\\[1\\] = {bad[0]} is not an edge"):
                    find_edges(g, d, v, np.concatenate([eids[:1], bad]))


def test_a_deleted_edge_that_compaction_folded_into_the_base_is_gone():
    """An edge compaction folded into the base CSC (the delta lists it in ``base_eids``)
    and deleted after: neither sampled nor counted in the in-degree (the fast path took
    it for a new edge, not a base one, and sampled it)."""
    rng = np.random.default_rng(7)
    g = _graph(rng)
    hub = int(np.argmax(np.diff(g.indptr)))
    folded = g.eids[g.indptr[hub] : g.indptr[hub] + 3]  # three of the hub's in-edges
    d, empty = LiveDelta(), np.empty(0, np.int64)
    d.base_eids = (np.sort(folded), np.zeros(3, np.int64))  # as a fold leaves it
    gone = folded[:2]
    d.hold(Batch(1, empty, np.empty(0, np.int32), empty, np.empty((3, 0), np.int64),
                 np.empty(0, np.int32), gone, {}, {}), 0.0)  # fmt: skip
    d.commit(1)
    seeds = np.array([hub, 0, 1], np.int64)
    got = sample_one_hop(g, d, 1, seeds, [1000], replace=False, seed=1)  # every in-edge
    assert not np.isin(gone, got.eid).any()
    assert np.isin(folded[2:], got.eid).all()
    want = np.diff(merged_csc(g, d, 1, seeds).indptr)
    assert in_degrees(g, d, 1, seeds).tolist() == want.tolist()
    assert want[0] == g.indptr[hub + 1] - g.indptr[hub] - 2


def _ingest(rng: np.random.Generator, order: list[int], big: int) -> LiveDelta:
    """Commits of new edges into base and new nodes, held in version order (edge ids
    grow with the version, as the sequencer hands them out) and committed in ``order``,
    the index read after each (a run each, merged as the rule asks); version ``big``
    has 5,000 edges, more than all the others."""
    d, empty = LiveDelta(), np.empty(0, np.int64)
    for v in range(1, len(order) + 1):
        nodes = np.arange(N + 10 * (v - 1), N + 10 * v)
        m = 5000 if v == big else int(rng.integers(50, 300))
        dst = np.where(rng.random(m) < 0.8, rng.integers(0, N, m), rng.choice(nodes, m))
        edges = np.vstack([rng.integers(0, N, m), dst, E + 10_000 * v + np.arange(m)])
        d.hold(Batch(v, nodes, np.zeros(10, np.int32), nodes + 5000, edges,
                     np.zeros(m, np.int32), empty, {}, {}), 0.0)  # fmt: skip
    for v in order:
        d.commit(v)
        _ = d.runs
    return d


@pytest.mark.parametrize("in_order", [True, False])
def test_new_edges_read_in_place_at_every_version(monkeypatch, in_order):
    """The seeds' new edges read from the runs in place (:class:`NewEdges`: merged runs,
    a big run's destination index, a run holding versions above the read's) pick what
    the merged CSC picks at every version; a commit out of version order leaves the
    runs' edge ids out of order (version 2's big run before version 1's), and the
    edges are gathered whole instead, alike."""
    from graphrun.sampling.live import NewEdges
    from graphrun.store import live_index

    monkeypatch.setattr(live_index, "DENSE_MIN", 256)  # big runs (>= N edges too) get it
    rng = np.random.default_rng(11)
    order = list(range(1, 13)) if in_order else [2, 1, *range(3, 13)]
    g, d = _graph(rng), _ingest(rng, order, big=2)
    rows = (g.row_start, g.row_start + g.num_rows)
    assert 1 < len(d.runs) < 12 and any(r.by_dst is None for r in d.runs)
    for v in range(1, 13):
        nodes = np.concatenate([np.arange(N), np.arange(N, N + 10 * v)])
        seeds = rng.choice(nodes, 300)
        assert (NewEdges.of(d, v, seeds, rows) is not None) == in_order
        for k in (2, 50):
            got = sample_one_hop(g, d, v, seeds, [k], replace=False, seed=v + k)
            want = merged_csc(g, d, v, seeds).sample_one_hop(
                np.arange(len(seeds)), [k], replace=False, seed=v + k
            )
            assert got.src.tolist() == want.src.tolist(), (v, k)
            assert got.eid.tolist() == want.eid.tolist(), (v, k)
            assert got.seed_index.tolist() == want.seed_index.tolist(), (v, k)
    if in_order:  # the big runs were read through their destination index
        assert any(r.by_dst is not None for r in d.runs)
