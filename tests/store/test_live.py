"""The live delta on its own: pieces checked wholly, versions, reads at a version."""

import threading
import time

import numpy as np
import pytest

from graphrun.errors import ArgumentError, StoreError
from graphrun.store.live import (
    GROWTH_BLOCK,
    LiveDelta,
    Piece,
    Rows,
    block_owner_of,
    growth_ids,
    growth_row,
)
from graphrun.store.live_check import FeatureSpec, Schema, check_piece
from graphrun.store.live_index import (
    Taken,
    build_run,
    due,
    id_runs,
    run_bound,
    run_ids,
    stable_order,
)
from graphrun.store.live_seq import Blocks
from graphrun.testing.procs import fresh_python

N, E = 10, 20
FEAT = "node/_N/feat"


def schema(part=0):
    return Schema(
        part=part,
        num_nodes=N,
        num_edges=E,
        node_types=("_N",),
        edge_types=(("_N", "_E", "_N"),),
        owned_nodes=(0, 5),
        owned_edges=(0, 10),
        features={FEAT: FeatureSpec("node", 0, np.dtype("float32"), (4,), 0, 5)},
        base_node_type=lambda ids: np.zeros(len(ids), np.int32),
    )


def nodes_piece(version, ids, feat=None, **kw):
    ids = np.asarray(ids, np.int64)
    feat = np.full((len(ids), 4), version, np.float32) if feat is None else feat
    fields = {
        "new_nodes": Rows.of(ids),
        "node_types": Rows.of(np.zeros(len(ids), np.int32)),
        "node_orig": Rows.of(ids + 1000),
        "node_features": {FEAT: Rows.of(feat)},
    }
    return Piece(version=version, **{**fields, **kw})


def edges_rows(src, dst, eid):
    return Rows.of(np.asarray([src, dst, eid], np.int64))


def held(delta, piece, commit=True):
    b = check_piece(piece, schema(), delta)
    delta.hold(b, 0.0)
    if commit:
        delta.commit(piece.version)
    return b


def test_rows_round_trip_and_bad_bytes():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert (Rows.of(a).array("x") == a).all()
    with pytest.raises(ArgumentError, match="x: 4 bytes do not hold"):
        Rows("float32", (2, 3), b"1234").array("x")
    with pytest.raises(ArgumentError, match="x: dtype"):
        Rows("object", (1,), b"12345678").array("x")
    # a shape whose size overflows int64 (2**64 rows: 0 after wrapping) is no empty array
    with pytest.raises(ArgumentError, match="x: 0 bytes do not hold int64"):
        Rows("int64", (2**32, 2**32), b"").array("x")


def test_blocks_hand_out_runs_per_partition():
    b = Blocks(N, 2)
    assert b.allocate(1, 3) == [(N, 3)]
    assert b.allocate(0, 2) == [(N + GROWTH_BLOCK, 2)]
    runs = b.allocate(1, GROWTH_BLOCK)  # fills block 0, opens block 2
    assert runs == [(N + 3, GROWTH_BLOCK - 3), (N + 2 * GROWTH_BLOCK, 3)]
    owners = b.owner_array()
    assert owners.tolist() == [1, 0, 1]
    ids = run_ids(runs)
    assert (block_owner_of(ids, N, owners) == 1).all()
    assert block_owner_of(np.asarray([N + 3 * GROWTH_BLOCK]), N, owners).tolist() == [-1]
    rows = growth_row(ids, N, 5)
    assert (growth_ids(rows, N, 5) == ids).all()


def test_pending_is_invisible_until_committed_then_at_its_version():
    d = LiveDelta()
    p1 = nodes_piece(1, [N, N + 1], new_edges=edges_rows([N, 7], [1, N + 1], [E, E + 1]),
                     edge_types=Rows.of(np.zeros(2, np.int32)))  # fmt: skip
    held(d, p1, commit=False)
    assert not d.nodes_at(np.asarray([N]), 5).any()
    assert d.lowest() == 1 and d.undecided(3) == [1]
    assert d.commit(1)
    assert d.nodes_at(np.asarray([N, N + 1]), 1).all()
    assert not d.nodes_at(np.asarray([N]), 0).any()
    counts, e = d.in_edges(np.asarray([1, N + 1, 2]), 1)
    assert counts.tolist() == [1, 1, 0]
    assert e[0].tolist() == [N, 7] and e[2].tolist() == [E, E + 1]
    assert d.in_edges(np.asarray([1]), 0)[0].tolist() == [0]
    out = np.zeros((2, 4), np.float32)
    assert d.rows(FEAT, np.asarray([N, 3]), 1, out).tolist() == [True, False]
    assert out[0].tolist() == [1.0] * 4


def test_updates_latest_wins_at_each_version_and_deletions():
    d = LiveDelta()
    for v in (1, 2):
        rows = np.full((1, 4), 10 * v, np.float32)
        held(d, Piece(version=v, updates={FEAT: (Rows.of(np.asarray([3])), Rows.of(rows))}))
    held(d, Piece(version=3, deleted_edges=Rows.of(np.asarray([4], np.int64))))
    out = np.zeros((1, 4), np.float32)
    for v, want in ((1, 10), (2, 20), (5, 20)):
        d.rows(FEAT, np.asarray([3]), v, out)
        assert out[0, 0] == want
    assert d.deleted(np.asarray([4, 5]), 3).tolist() == [True, False]
    assert not d.deleted(np.asarray([4]), 2).any()


def test_abort_drops_a_piece_and_its_bytes():
    d = LiveDelta()
    b = held(d, nodes_piece(1, [N]), commit=False)
    assert d.nbytes == 2 * b.nbytes
    assert d.abort(1)
    assert d.nbytes == 0 and d.lowest() == 0
    assert not d.taken_nodes.any_of(np.asarray([N]))


def test_the_lowest_version_held_follows_holds_commits_aborts_and_folds():
    """``lowest`` (published to co-located readers after every piece) over versions held
    and decided out of order (a pipelined writer's), given back, and folded."""
    d = LiveDelta()
    for v in (4, 2, 6):
        held(d, nodes_piece(v, [N + v]), commit=False)
    assert d.lowest() == 2
    assert d.commit(6) and d.commit(4) and d.lowest() == 2
    assert d.abort(2) and d.lowest() == 4  # the lowest committed
    held(d, nodes_piece(1, [N + 1]), commit=False)
    assert d.lowest() == 1
    assert d.commit(1) and d.lowest() == 1
    empty = (np.empty(0, np.int64), np.empty(0, np.int64))
    d.fold(4, build_run([d.committed[1], d.committed[4]]), empty, empty)
    assert d.lowest() == 6
    d.fold(6, build_run([d.committed[6]]), empty, empty)
    assert d.lowest() == 0 and not d.committed


@pytest.mark.parametrize(
    ("piece", "message"),
    [
        (lambda: nodes_piece(1, [3]), r"new_nodes\[0\] = 3 is out of range"),
        (lambda: nodes_piece(1, [N, N]), "new_nodes: ids repeat"),
        (lambda: nodes_piece(1, [N], feat=np.zeros((1, 4), np.float64)),
         r"node_features\['node/_N/feat'\]: got float64"),
        (lambda: nodes_piece(1, [N], feat=np.zeros((1, 3), np.float32)),
         r"expected float32 \(1, 4\)"),
        (lambda: Piece(version=1, new_nodes=Rows.of(np.asarray([N])),
                       node_types=Rows.of(np.zeros(1, np.int32)),
                       node_orig=Rows.of(np.asarray([1]))), "feature 'node/_N/feat' is missing"),
        (lambda: nodes_piece(1, [N], node_types=None), "need 1 each"),
        (lambda: Piece(version=1, new_edges=edges_rows([1], [7], [E]),
                       edge_types=Rows.of(np.zeros(1, np.int32))),
         r"dst\[0\] = 7 is not a node owned here"),
        (lambda: Piece(version=1, new_edges=edges_rows([1], [2], [5]),
                       edge_types=Rows.of(np.zeros(1, np.int32))), "eid"),
        (lambda: Piece(version=1, new_edges=edges_rows([1], [2], [E]),
                       edge_types=Rows.of(np.ones(1, np.int32))), r"edge_types\[0\] = 1"),
        (lambda: Piece(version=1, deleted_edges=Rows.of(np.asarray([15]))),
         r"deleted_edges\[0\] = 15 is not an edge owned here"),
        (lambda: Piece(version=1, updates={FEAT: (Rows.of(np.asarray([7])),
                                                  Rows.of(np.zeros((1, 4), np.float32)))}),
         r"ids\[0\] = 7 is not a row of it owned here"),
        (lambda: Piece(version=1, updates={"node/_N/nope": (Rows.of(np.asarray([1])),
                                                           Rows.of(np.zeros(1, np.float32)))}),
         "is not a feature of the graph"),
        (lambda: Piece(version=0), "version 0 is not > 0"),
    ],
)  # fmt: skip
def test_a_bad_piece_gets_one_error_and_nothing_is_kept(piece, message):
    d = LiveDelta()
    with pytest.raises(ArgumentError, match=message):
        held(d, piece())
    assert d.nbytes == 0 and not d.pending and not d.committed


def test_new_edges_of_a_two_type_graph_have_their_ends_types_checked():
    """Base ids of two types (even: a, odd: b) and one edge type a -> b: the check
    looks the ends' types up (a one-type graph skips it: every end has the type)."""
    two = Schema(part=0, num_nodes=N, num_edges=E, node_types=("a", "b"),
                 edge_types=(("a", "r", "b"),), owned_nodes=(0, 5), owned_edges=(0, 10),
                 features={}, base_node_type=lambda ids: (ids % 2).astype(np.int32))  # fmt: skip
    d = LiveDelta()

    def piece(src, dst):
        return Piece(version=1, new_edges=edges_rows([src], [dst], [E]),
                     edge_types=Rows.of(np.zeros(1, np.int32)))  # fmt: skip

    assert check_piece(piece(2, 3), two, d).edges.shape == (3, 1)
    with pytest.raises(ArgumentError, match=r"dst\[0\] = 4 has node type 'a'"):
        check_piece(piece(2, 4), two, d)
    with pytest.raises(ArgumentError, match=r"src\[0\] = 1 has node type 'b'"):
        check_piece(piece(1, 3), two, d)
    with pytest.raises(ArgumentError, match=r"dst\[0\] = 7 is not a node owned here"):
        check_piece(piece(2, 7), two, d)


def test_new_edge_needs_its_new_destination_in_the_piece_or_committed():
    d = LiveDelta()
    edge = {"new_edges": edges_rows([1], [N], [E]), "edge_types": Rows.of(np.zeros(1, np.int32))}
    with pytest.raises(ArgumentError, match=r"dst\[0\]"):
        held(d, Piece(version=1, **edge))
    held(d, nodes_piece(1, [N]))
    held(d, Piece(version=2, **edge))
    assert d.in_edges(np.asarray([N]), 2)[0].tolist() == [1]


def test_an_id_held_pending_or_committed_is_taken_and_an_aborted_ones_is_free():
    d = LiveDelta()
    held(d, nodes_piece(1, [N, N + 1]), commit=False)
    held(d, _edge_piece(2, [1], [2], [E + 3]))
    for piece, message in (
        (nodes_piece(3, [N + 2, N + 1]), "new_nodes: an id is taken"),
        (_edge_piece(3, [1, 1], [2, 2], [E + 4, E + 3]), "edge id is taken"),
    ):
        with pytest.raises(ArgumentError, match=message):
            held(d, piece)
    assert d.abort(1)
    held(d, nodes_piece(3, [N + 2, N + 1]))


def test_a_fold_joins_the_taken_runs_that_touch():
    """Pieces of a growth block take runs one after the other; folded, they are one run
    (each ``add`` copies the runs: unjoined, they grew by a run or two a piece forever)."""
    t = Taken()
    for v in range(1, 9):
        t.add(np.arange(N + 10 * v, N + 10 * (v + 1)), v)  # [N + 10, N + 90): touching
    t.add(np.arange(N + 200, N + 210), 9)
    t.fold(7, np.empty(0, np.int64))
    assert t.runs.tolist() == [[N + 10, N + 80, N + 200], [N + 80, N + 90, N + 210],
                               [0, 8, 9]]  # fmt: skip
    assert t.any_of(np.asarray([N + 79])) and not t.any_of(np.asarray([N + 95]))
    t.fold(9, np.empty(0, np.int64))
    assert t.runs.tolist() == [[N + 10, N + 200], [N + 90, N + 210], [0, 0]]


def test_taken_runs_answer_as_the_set_of_their_ids():
    """Runs of ids held per version (the sequencer's runs, or ids in any order), some
    given back, some folded (kept whatever is given back after): every question
    answered as a set of ids would."""
    rng = np.random.default_rng(0)
    t, by_version = Taken(), {}
    for v in range(1, 200):
        if rng.random() < 0.5:
            ids = np.arange(s := int(rng.integers(0, 900)), s + int(rng.integers(1, 40)))
        else:
            ids = rng.choice(1000, int(rng.integers(1, 30)), replace=False)
        held_ids = set().union(*by_version.values()) if by_version else set()
        assert t.any_of(ids) == bool(held_ids & set(ids.tolist()))
        if not t.any_of(ids):
            t.add(ids, v)
            by_version[v] = set(ids.tolist())
        droppable = [k for k in by_version if k]  # folded ones (0) are never given back
        if v % 5 == 0 and droppable:
            gone = int(rng.choice(droppable))
            t.drop(gone)
            by_version.pop(gone)
        if v == 100:
            t.fold(100, np.empty(0, np.int64))
            by_version = {0: set().union(*by_version.values())}
    everything = set().union(*by_version.values())
    for i in range(1000):
        assert t.any_of(np.asarray([i])) == (i in everything)
    s, e = id_runs(np.asarray([7, 3, 4, 5, 9, 8]))
    assert s.tolist() == [3, 7] and e.tolist() == [6, 10]


def test_a_delta_loading_a_compacted_base_takes_its_ids():
    t = Taken()
    t.fold(5, np.asarray([N, N + 1, N + 2, N + 7]))
    assert t.any_of(np.asarray([N + 7])) and not t.any_of(np.asarray([N + 3, N + 6]))


def test_the_delta_bound_refuses_and_slows():
    d = LiveDelta(max_bytes=400)
    b = check_piece(nodes_piece(1, [N, N + 1]), schema(), d)
    d.hold(b, 0.0)
    assert d.nbytes == 2 * b.nbytes and d.slowed() == (d.nbytes > 300)
    big = check_piece(nodes_piece(2, list(range(N + 2, N + 12))), schema(), d)
    with pytest.raises(StoreError, match="over its bound"):
        d.hold(big, 0.0)
    assert 2 not in d.pending


def _edge_piece(version, src, dst, eid, **kw):
    return Piece(
        version=version,
        new_edges=edges_rows(src, dst, eid),
        edge_types=Rows.of(np.zeros(len(eid), np.int32)),
        **kw,
    )


def test_a_commit_indexes_its_batch_not_the_whole_delta():
    """The read index's work (entries sorted) per commit is the batch times a logarithm:
    256 commits of 50 edges sort each entry at most log2(256) + 1 times, where rebuilding
    the index on the first read after every commit sorted 50 * 256 * 257 / 2 entries."""
    d, batch, commits = LiveDelta(), 50, 256
    rng = np.random.default_rng(0)
    for v in range(1, commits + 1):
        eid = E + (v - 1) * batch + np.arange(batch)
        held(d, _edge_piece(v, rng.integers(0, N, batch), rng.integers(0, 5, batch), eid))
        assert d.in_edges(np.asarray([0, 1]), v)[0].sum() > 0 or v == 1
    assert d.work <= batch * commits * (np.log2(commits) + 1)
    assert len(d.runs) <= np.log2(commits) + 1
    assert d.in_edges(np.arange(5), commits)[0].sum() == batch * commits


def brute_out_change(pieces, v):
    """New edges leaving each base node at ``v`` minus its deleted ones (a base edge
    ``e`` leaves ``e % N``), from the pieces themselves."""
    new, gone = {}, set()
    for p in pieces:
        if p.version <= v:
            src, _, eid = p.new_edges.array("e")
            new.update(zip(eid.tolist(), src.tolist(), strict=True))
            gone.update(p.deleted_edges.array("d").tolist())
    out = np.zeros(N, np.int64)
    for e, s in new.items():
        out[s] += e not in gone
    for e in gone:
        out[e % N] -= e < E
    return out


@pytest.mark.parametrize("swapped", [False, True], ids=["in-version-order", "swapped"])
def test_reads_over_merged_runs_match_one_index_of_everything(swapped):
    """Runs merged after each commit read as one index of everything; also when each two
    versions commit in the opposite order (a merge then sorts by version too: an edge
    deleted at two versions is deleted from the lower one)."""
    rng = np.random.default_rng(1)
    pieces, eid_next, starts = [], E, [E]
    for v in range(1, 41):
        m = int(rng.integers(1, 30))
        eid = eid_next + np.arange(m)
        eid_next += m
        starts.append(eid_next)
        gone = rng.choice(np.arange(E, starts[-3]) if v > 3 else np.arange(10), 2, False)
        ids = rng.choice(5, 2, replace=False)
        rows = np.full((2, 4), v, np.float32)
        update = {FEAT: (Rows.of(ids.astype(np.int64)), Rows.of(rows))}
        src, dst = rng.integers(0, N, m), rng.integers(0, 5, m)
        gone = Rows.of(gone.astype(np.int64))
        pieces.append(_edge_piece(v, src, dst, eid, deleted_edges=gone, updates=update))
    runs, one = LiveDelta(), LiveDelta()
    for p in pieces:
        one.hold(held(runs, p, commit=False), 0.0)
        if swapped and p.version % 2:
            continue  # committed after the next one
        for v in (p.version, p.version - 1) if swapped else (p.version,):
            runs.commit(v)
            runs.in_edges(np.asarray([0]), v)  # a read after each commit: many runs
    for p in pieces:
        one.commit(p.version)  # all before a read: one run
    assert len(runs.runs) > 1 and len(one.runs) == 1

    def src_of(eids):
        return eids % N

    dst, everything = np.arange(5), np.arange(N)
    for v in (0, 3, 17, 40):
        a, b = runs.in_edges(dst, v), one.in_edges(dst, v)
        assert a[0].tolist() == b[0].tolist()
        key = lambda e: sorted(map(tuple, e.T.tolist()))  # noqa: E731
        assert key(a[1]) == key(b[1])
        probe = np.arange(E + eid_next)
        assert (runs.deleted(probe, v) == one.deleted(probe, v)).all()
        change = runs.out_change(everything, v, src_of)
        assert (change == one.out_change(everything, v, src_of)).all()
        assert change.tolist() == brute_out_change(pieces, v).tolist()
        out_a, out_b = np.zeros((5, 4), np.float32), np.zeros((5, 4), np.float32)
        assert (runs.rows(FEAT, dst, v, out_a) == one.rows(FEAT, dst, v, out_b)).all()
        assert (out_a == out_b).all()


def test_a_merging_thread_keeps_reads_whole_and_the_runs_few(monkeypatch):
    """With ``background`` the runs are merged by the delta's thread, off the read path:
    a read after each commit sees exactly what one index of everything sees, and the
    thread merges them to the rule's rest (each run over twice the next). The thread sorts
    and merges with the compiled kernels once it has loaded them, whatever the size
    (these few entries); the delta without a thread with numpy's (below
    ``COMPILED_MIN``): the reads compare the two."""
    from graphrun.store import live_kernels

    # in a CI run's clean checkout (numba's cache cold) the background thread, niced
    # among three busy workers, did not finish the merges within the 60 s (8 runs left)
    _foreground_merges(monkeypatch)
    calls = []
    merge, sort = live_kernels.merge_two, live_kernels.sort_columns

    def counted(kernel):
        def call(*a):
            calls.append(a[0].shape[1] > 1)  # warm_up's 1 + 1 entries aside
            return kernel(*a)

        return call

    monkeypatch.setattr(live_kernels, "merge_two", counted(merge))
    monkeypatch.setattr(live_kernels, "sort_columns", counted(sort))
    rng = np.random.default_rng(2)
    d, one = LiveDelta(background=True), LiveDelta()
    key = lambda e: sorted(map(tuple, e.T.tolist()))  # noqa: E731
    dst = np.arange(5)
    try:
        for v in range(1, 65):
            m = int(rng.integers(1, 40))
            eid = E + 40 * (v - 1) + np.arange(m)
            p = _edge_piece(v, rng.integers(0, N, m), rng.integers(0, 5, m), eid)
            one.hold(held(d, p), 0.0)
            one.commit(v)
            a, b = d.in_edges(dst, v), one.in_edges(dst, v)
            assert a[0].tolist() == b[0].tolist() and key(a[1]) == key(b[1])
        # the thread merges on until the rule's rest: each run over twice the next, at
        # most floor(log2(entries)) + 1 runs however far the thread lagged behind the
        # reads' runs (the rule before rested at strictly decreasing sizes: a CI run's
        # wait for 7 runs timed out at 8; tests/store/test_live_rule.py)
        sizes = lambda: [r.size for r in d.runs]  # noqa: E731
        deadline = time.monotonic() + 60
        while due(sizes()) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert due(sizes()) is None and sum(sizes()) == sum(r.size for r in one.runs)
        assert len(sizes()) <= run_bound(sum(sizes()))
        for v in (1, 30, 64):
            assert key(d.in_edges(dst, v)[1]) == key(one.in_edges(dst, v)[1])
    finally:
        d.close()
    assert any(calls)


def test_the_merging_thread_merges_a_pair_before_the_last_two(monkeypatch):
    """Reads flush fresh commits into runs while the thread merges an older pair: the
    runs can come to sizes 5, 20, 1, where only the first two break the rule. The thread
    looked at the last two alone and left them (64 commits kept 14 runs on a loaded
    box); it merges any pair out of the rule."""
    _foreground_merges(monkeypatch)
    plain = LiveDelta()
    batches = [held(plain, _edge_piece(v, [1] * m, [2] * m, E + 100 * v + np.arange(m)))
               for v, m in ((1, 5), (2, 20), (3, 1))]  # fmt: skip
    d = LiveDelta(background=True)
    try:
        with d._lock:
            d._runs = [build_run([b]) for b in batches]
            d.committed = {b.version: b for b in batches}
        d._wake.set()
        deadline = time.monotonic() + 10
        while len(d.runs) > 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [r.size for r in d.runs] == [25, 1]
        assert d.in_edges(np.asarray([2]), 3)[0].tolist() == [26]
    finally:
        d.close()


def test_a_delta_closed_without_a_write_loads_no_compiled_merge():
    """``close`` wakes the merging thread to end it: it ended after loading the merge
    (numba, 0.5 CPU-s and a compile where no cache is) in every store server, writes or
    none, and ``close`` waited for that. In a fresh process (the thread given time to
    wait for its first wake, as a server's has): numba is not imported."""
    code = (
        "import sys, time; from graphrun.store.live import LiveDelta\n"
        "d = LiveDelta(background=True); time.sleep(0.3); d.close()\n"
        "assert not d._merger.is_alive()\n"
        "print(sorted(m for m in ('numba', 'graphrun.store.live_kernels') if m in sys.modules))"
    )
    assert fresh_python(code).strip() == "[]"


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize(
    ("na", "nb"), [(0, 0), (0, 3), (3, 0), (1, 1), (500, 300), (257, 64), (64, 1000)]
)
def test_the_compiled_merge_is_the_stable_merge_of_two_runs(na, nb, order):
    """``merge_two`` (the merging thread's pass) equals a stable sort of both runs' keys
    in turn: every row follows its key, and among equal keys the first run's entries
    come first, in their order (the versions stay ascending); for runs of either
    layout (a merged run is C-ordered, one sorted by numpy Fortran-ordered: each has
    its own compiled signature)."""
    from graphrun.store.live_kernels import merge_two

    rng = np.random.default_rng(na * 1000 + nb)

    def run(n, version):
        cols = np.vstack([rng.integers(0, 20, (2, n)), np.arange(n), np.full(n, version)])
        return np.asarray(cols[:, np.argsort(cols[1], kind="stable")], order=order)

    a, b = run(na, 1), run(nb, 2)
    both = np.concatenate([a, b], axis=1)
    want = both[:, np.argsort(both[1], kind="stable")]
    out = np.empty_like(both)
    merge_two(a, b, 1, out)
    assert out.tolist() == want.tolist()


def _foreground_merges(monkeypatch) -> None:
    """The merging thread at the test's priority and the kernels compiled first: niced
    among busy workers, its first index (numba's load, ~0.5 CPU-s) took 21 s under six
    busy loops on 2 cores (a test's 30 s wait failed at load 18)."""
    from graphrun.store import live as live_mod
    from graphrun.store import live_kernels

    monkeypatch.setattr(live_mod, "background", lambda: True)
    live_kernels.warm_up()


def test_a_fold_drops_the_merge_in_flight_over_what_it_folded(monkeypatch):
    """Compaction's swap (``fold``) while the delta's thread merges two runs it folds:
    the merge is not installed over the folded base, and the thread goes on merging the
    commits after it (it neither dies nor indexes a folded piece)."""
    from graphrun.store import live as live_mod
    from graphrun.store.live_index import build_run

    _foreground_merges(monkeypatch)
    started, go, real = threading.Event(), threading.Event(), live_mod.merge_runs

    def slow(runs, compiled=False):
        started.set()
        go.wait(30)
        return real(runs, compiled)

    monkeypatch.setattr(live_mod, "merge_runs", slow)
    d = LiveDelta(background=True)
    try:
        for v in (1, 2):
            held(d, _edge_piece(v, np.array([0]), np.array([1]), np.array([E + v])))
            deadline = time.monotonic() + 30
            while d.work < v and time.monotonic() < deadline:  # a run of its own (the
                time.sleep(0.001)  # thread took both commits in one run at times)
        assert started.wait(30)  # merging runs of versions 1 and 2, outside the lock
        base = build_run([d.committed[1], d.committed[2]])
        empty = (np.empty(0, np.int64), np.empty(0, np.int64))
        d.fold(2, base, empty, empty)
        go.set()
        for v in (3, 4):
            held(d, _edge_piece(v, np.array([0]), np.array([1]), np.array([E + v])))
        deadline = time.monotonic() + 30
        while len(d.runs) > 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        runs = d.runs
        assert runs[0] is base and len(runs) == 2  # the base, then 3 and 4 merged
        assert sorted(runs[1].edges[4].tolist()) == [3, 4]
        assert d.in_edges(np.array([1]), 4)[0].tolist() == [4]
    finally:
        go.set()
        d.close()


def test_in_edges_order_packed_or_not_is_by_seed_then_edge_id():
    """The packed sort of (seed, eid) orders as a lexsort does, and falls back to one
    where the pair does not fit 62 bits (a wide range of edge ids, many seeds)."""
    from graphrun.store.live import _by_seed_and_eid

    rng = np.random.default_rng(3)
    for eid_lo, eid_span, seeds in ((E, 1000, 50), (2**40, 2**30, 40_000), (0, 2**61, 3)):
        pairs = {
            (int(s), int(eid_lo + e))
            for s, e in zip(
                rng.integers(0, seeds, 3000), rng.integers(0, eid_span, 3000), strict=True
            )
        }
        seed, eid = (np.asarray(x, np.int64) for x in zip(*pairs, strict=True))
        got = _by_seed_and_eid(seed, eid)
        assert got.tolist() == np.lexsort((eid, seed)).tolist()
    assert _by_seed_and_eid(np.empty(0, np.int64), np.empty(0, np.int64)).tolist() == []


@pytest.mark.parametrize(
    "keys",
    [
        np.array([5, 3, 5, 0, 3, 5, 1], np.int64),  # ties: first come first
        np.random.default_rng(3).integers(0, 40, 5000),  # packed
        np.array([2, -1, 2, -1], np.int64),  # negative: the stable sort itself
        np.array([1 << 60, 7, 1 << 60, 0], np.int64),  # no room for a position
        np.array([4], np.int64),
        np.empty(0, np.int64),
    ],
)
def test_stable_order_is_the_stable_argsort(keys):
    """A fresh commit's run is sorted by (key, version): ties keep their order."""
    assert (stable_order(keys) == np.argsort(keys, kind="stable")).all()
