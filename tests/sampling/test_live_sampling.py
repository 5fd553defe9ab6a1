"""Sampling through a live delta (graphrun/sampling/live.py) picks what sampling the
merged CSC picks, without gathering the seeds' base in-edges."""

from __future__ import annotations

import numpy as np
import pytest

from graphrun.errors import ArgumentError
from graphrun.partition.book import PartitionBook
from graphrun.sampling.csc import CSCGraph
from graphrun.sampling.live import (
    EdgeWeights,
    edge_types,
    find_edges,
    in_degrees,
    merged_csc,
    sample_one_hop,
)
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


def test_edge_types_answers_a_new_edges_type_from_its_batch_at_a_version():
    """Each edge id's type at a version (``graph_edge_types``, what a following client
    knows of a new edge by its id alone): a base edge's from the CSC, a new one's the type
    its batch gave it; an edge added after the version, or deleted by it, is refused as
    find_edges refuses it."""
    rng = np.random.default_rng(5)
    plain = _graph(rng)
    g = CSCGraph(plain.indptr, plain.indices, plain.eids,
                 etypes=rng.integers(0, 3, plain.num_edges), num_etypes=3)  # fmt: skip
    assert g.etypes is not None
    of_base = dict(zip(g.eids.tolist(), g.etypes.tolist(), strict=True))
    d, empty, none = LiveDelta(), np.empty(0, np.int64), np.empty(0, np.int32)
    new = E + np.arange(4)
    edges = np.vstack([[1, 2, 3, 4], [0, 1, 2, 3], new])
    types = np.asarray([2, 0, 1, 2], np.int32)
    d.hold(Batch(1, empty, none, empty, edges[:, :2], types[:2], empty, {}, {}), 0.0)
    d.commit(1)
    d.hold(Batch(2, empty, none, empty, edges[:, 2:], types[2:], new[:1], {}, {}), 0.0)
    d.commit(2)
    base = g.eids[::37]
    want = [of_base[e] for e in base.tolist()]
    assert edge_types(g, d, 1, np.concatenate([base, new[:2]])).tolist() == [*want, 2, 0]
    assert edge_types(g, d, 2, new[1:]).tolist() == [0, 1, 2]
    for v, bad in [(1, new[2]), (2, new[0])]:  # added after v; deleted at 2
        with pytest.raises(ArgumentError, match=f"eids\\[1\\] = {bad} is not an edge"):
            edge_types(g, d, v, np.asarray([base[0], bad]))
    with pytest.raises(ArgumentError, match=f"eids\\[0\\] = {new[0]} is not an edge"):
        g.edge_types(new[:1])  # the CSC alone: base edges only


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


# ---- weighted sampling through the delta

W_KEY = "edge/_N:_E:_N/w"


def _book() -> PartitionBook:
    """One partition of ``N`` base nodes and ``E`` base edge ids (growth ids above)."""
    return PartitionBook.from_config({
        "num_parts": 1, "node_types": ["_N"], "edge_types": [["_N", "_E", "_N"]],
        "node_offsets": [0, N], "edge_offsets": [0, E], "node_ranges": {"_N": [0, N]},
        "edge_ranges": {"_N:_E:_N": [0, E]},
    })  # fmt: skip


Writes = list[tuple[int, dict[int, float], np.ndarray]]  # version, {eid: weight}, deleted


def _weighted(rng: np.random.Generator) -> tuple[CSCGraph, LiveDelta, EdgeWeights, Writes]:
    """A graph whose hub gets new in-edges over three versions, each edge with a weight
    (a third of them 0); version 2 deletes base in-edges of the hub and one new edge,
    version 3 updates base weights (one to 0, a zero one to 5). Returns the writes as
    made, version 0 the base weights of the hub's in-edges."""
    g = _graph(rng)
    base_w = rng.exponential(1.0, E)
    base_w[rng.random(E) < 0.3] = 0.0
    hub = int(np.argmax(np.diff(g.indptr)))
    hub_in = g.eids[g.indptr[hub] : g.indptr[hub + 1]]
    d, e, empty = LiveDelta(), E, np.empty(0, np.int64)
    writes: Writes = [(0, dict(zip(hub_in.tolist(), base_w[hub_in].tolist(), strict=True)), empty)]
    for v in (1, 2, 3):
        m = 40
        edges = np.vstack([rng.integers(0, N, m), np.full(m, hub), e + np.arange(m)])
        w = rng.exponential(3.0, m)
        w[rng.random(m) < 0.3] = 0.0
        gone = np.concatenate([hub_in[:5], [E]]) if v == 2 else empty
        ups = {}
        if v == 3:
            kept = hub_in[5:]  # not deleted at 2
            pos, zero = kept[base_w[kept] > 0][-1], kept[base_w[kept] == 0][0]
            ups = {W_KEY: (np.array([pos, zero]), np.array([0.0, 5.0]))}
        d.hold(Batch(v, empty, np.empty(0, np.int32), empty, edges, np.zeros(m, np.int32),
                     gone, {W_KEY: (edges[2], w)}, ups), 0.0)  # fmt: skip
        d.commit(v)
        written = dict(zip(edges[2].tolist(), w.tolist(), strict=True))
        for i, val in zip(*(a.tolist() for a in ups.get(W_KEY, (empty, empty))), strict=True):
            written[i] = val
        writes.append((v, written, gone))
        e += m
    weights = EdgeWeights("w", _book(), 0, lambda key, rows: base_w[rows])
    return g, d, weights, writes


def _expected(writes: Writes, v: int) -> dict[int, float]:
    """``{eid: weight}`` of the hub's in-edges at ``v``, from the writes as made."""
    want: dict[int, float] = {}
    for ve, written, gone in writes:
        if ve <= v:
            want.update(written)
            for eid in gone.tolist():
                want.pop(eid)
    return want


@pytest.mark.parametrize("replace", [False, True])
def test_weighted_draws_through_the_delta_follow_the_weights_at_the_version(replace):
    """Each of a seed's edges at the version is drawn in proportion to its weight (a
    new edge's from its row, a base edge's from the base tensor or its update); weight-0
    and deleted edges never (40,000 single draws, against the exact probabilities)."""
    rng = np.random.default_rng(3)
    g, d, weights, writes = _weighted(rng)
    hub = int(np.argmax(np.diff(g.indptr)))
    for v in (1, 2, 3):
        want = _expected(writes, v)
        eids = np.array(sorted(want))
        p = np.array([want[k] for k in eids.tolist()]) / sum(want.values())
        seeds = np.full(4000, hub, np.int64)
        got = np.concatenate([
            sample_one_hop(g, d, v, seeds, [1], replace=replace, seed=100 * v + s,
                           weights=weights).eid
            for s in range(10)
        ])  # fmt: skip
        assert len(got) == 40_000
        assert np.isin(got, eids[p > 0]).all(), "a deleted or weight-0 edge was drawn"
        freq = np.bincount(np.searchsorted(eids, got), minlength=len(eids)) / len(got)
        assert 0.5 * np.abs(freq - p).sum() < 0.05, v  # total variation
        new = eids >= E
        assert abs(freq[new].sum() - p[new].sum()) < 0.015, v


def test_weighted_draws_of_many_take_every_positive_edge_once_without_replacement():
    rng = np.random.default_rng(4)
    g, d, weights, writes = _weighted(rng)
    hub = int(np.argmax(np.diff(g.indptr)))
    seeds = np.array([hub, 0, 1], np.int64)
    got = sample_one_hop(g, d, 3, seeds, [10_000], replace=False, seed=1, weights=weights)
    want = _expected(writes, 3)
    mine = got.eid[got.seed_index == 0]
    assert sorted(mine.tolist()) == sorted(k for k, w in want.items() if w > 0)
    merged = merged_csc(g, d, 3, seeds, weights)  # the same picks as its frozen CSC
    same = merged.sample_one_hop(np.arange(3), [3], weighted=True, seed=9)
    again = sample_one_hop(g, d, 3, seeds, [3], replace=False, seed=9, weights=weights)
    assert same.eid.tolist() == again.eid.tolist()


def test_a_new_edge_without_its_weight_row_is_refused_by_name():
    rng = np.random.default_rng(5)
    g, d, weights, writes = _weighted(rng)
    hub = int(np.argmax(np.diff(g.indptr)))
    other = EdgeWeights("other", _book(), 0, lambda key, rows: np.ones(len(rows)))
    with pytest.raises(ArgumentError, match=f"weight: edge {E} has no row of 'other'"):
        sample_one_hop(g, d, 1, np.array([hub]), [2], replace=False, seed=0, weights=other)
    assert weights.of(d, 1, np.array([E + 1]), None)[0] == writes[1][1][E + 1]
