import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from graphrun.errors import ArgumentError
from graphrun.sampling import CSCGraph, make_generator, make_rng, sample_segments
from graphrun.testing.graphs import random_graph


def star(deg: int) -> np.ndarray:
    return np.array([0, deg], dtype=np.int64)


@pytest.mark.parametrize("replace", [False, True])
def test_sampled_edges_exist_and_fanout_respected(replace: bool) -> None:
    g = random_graph()
    csc = CSCGraph.from_graph(g)
    seeds = np.arange(g.num_nodes)
    out = csc.sample_one_hop(seeds, [5], replace=replace, seed=1)
    dst = seeds[out.seed_index]
    # every sampled edge is a real edge with the right id
    assert (g.src[out.eid] == out.src).all()
    assert (g.dst[out.eid] == dst).all()
    counts = np.bincount(out.seed_index, minlength=g.num_nodes)
    deg = g.in_degrees()
    expect = np.where(deg > 0, 5, 0) if replace else np.minimum(deg, 5)
    assert np.array_equal(counts, expect)
    if not replace:  # no edge twice for a seed
        assert len(np.unique(out.eid)) == len(out.eid)


def test_small_rows_take_every_edge() -> None:
    g = random_graph()
    csc = CSCGraph.from_graph(g)
    out = csc.sample_one_hop(np.arange(g.num_nodes), [10_000], seed=0)
    assert sorted(out.eid.tolist()) == list(range(g.num_edges))


@pytest.mark.parametrize("row1", [6, 2])
def test_mixed_rows_are_grouped_in_order(row1: int) -> None:
    # rows 0 and 2 draw 3 of their 10 edges; rows 1 and 3 take all of theirs: row 1 has
    # more edges than a drawn row keeps (6: the listing branch) or fewer (2: the table)
    indptr = np.array([0, 10, 10 + row1, 20 + row1, 22 + row1])
    k = np.array([3, 2**31 - 1, 3, 2**31 - 1])
    picks = sample_segments(indptr, np.arange(4), k, rng=make_rng(5))
    assert picks.which.tolist() == [0] * 3 + [1] * row1 + [2] * 3 + [3] * 2
    pos = picks.pos.tolist()
    assert pos[3 : 3 + row1] == list(range(10, 10 + row1))
    assert pos[-2:] == [20 + row1, 21 + row1]
    for lo, got in ((0, pos[:3]), (10 + row1, pos[3 + row1 : 6 + row1])):
        assert len(set(got)) == 3 and all(lo <= p < lo + 10 for p in got)


def test_deterministic_under_a_seed() -> None:
    csc = CSCGraph.from_graph(random_graph())
    seeds = np.arange(50)
    a = csc.sample_one_hop(seeds, [3], seed=7)
    b = csc.sample_one_hop(seeds, [3], seed=7)
    c = csc.sample_one_hop(seeds, [3], seed=8)
    assert np.array_equal(a.eid, b.eid)
    assert not np.array_equal(a.eid, c.eid)


@pytest.mark.parametrize("replace", [False, True])
def test_uniformity_chi_square(replace: bool) -> None:
    deg, k, trials = 20, 5, 4000
    rows = np.zeros(trials, dtype=np.int64)  # the same row sampled `trials` times
    picks = sample_segments(star(deg), rows, k, replace=replace, rng=make_rng(123))
    assert len(picks) == trials * k
    counts = np.bincount(picks.pos, minlength=deg)
    p = stats.chisquare(counts).pvalue
    assert p > 1e-3, counts
    if not replace:  # all 5-subsets equally likely → every pair equally likely too
        pos = picks.pos.reshape(trials, k)
        assert (np.diff(np.sort(pos, 1), axis=1) > 0).all()


def test_uniformity_detects_bias() -> None:
    # the test above can fail: a biased picker (always the first k) is rejected
    counts = np.zeros(20)
    counts[:5] = 4000
    assert stats.chisquare(counts).pvalue < 1e-3


def test_weighted_sampling_follows_weights() -> None:
    deg, trials = 4, 20000
    w = np.array([0.0, 1.0, 2.0, 5.0])
    rows = np.zeros(trials, dtype=np.int64)
    picks = sample_segments(star(deg), rows, 1, weights=w, replace=True, rng=make_rng(0))
    counts = np.bincount(picks.pos, minlength=deg)
    assert counts[0] == 0
    p = stats.chisquare(counts[1:], f_exp=trials * np.array([1, 2, 5]) / 8).pvalue
    assert p > 1e-3, counts
    picks = sample_segments(star(deg), rows[:2000], 2, weights=w, rng=make_rng(0))
    pos = picks.pos.reshape(2000, 2)
    assert (pos != 0).all() and (pos[:, 0] != pos[:, 1]).all()  # weight 0 never, no repeats
    counts = np.bincount(picks.pos, minlength=deg)
    assert counts[3] > counts[2] > counts[1]


def test_weighted_rows_without_edges() -> None:
    # rows of degree 0 (or only weight-0 edges) get nothing, with and without replacement
    indptr = np.array([0, 0, 2, 2])
    w = np.array([0.0, 0.0])
    for replace in (False, True):
        picks = sample_segments(
            indptr, np.arange(3), 2, weights=w, replace=replace, rng=make_rng(0)
        )
        assert len(picks) == 0
        empty = sample_segments(
            indptr[:2], np.array([0]), 2, weights=w[:0], replace=replace, rng=make_rng(0)
        )
        assert len(empty) == 0


def test_weighted_from_graph_feature() -> None:
    g = random_graph()
    csc = CSCGraph.from_graph(g, weight="w")
    out = csc.sample_one_hop(np.arange(g.num_nodes), [3], weighted=True, seed=0)
    assert (g.src[out.eid] == out.src).all()
    with pytest.raises(ArgumentError, match="weight"):
        CSCGraph.from_graph(g, weight="nope")


def test_seeds_out_of_range() -> None:
    csc = CSCGraph.from_graph(random_graph(num_nodes=10, num_edges=20))
    with pytest.raises(ArgumentError, match=r"seeds\[1\] = 10 is out of range"):
        csc.sample_one_hop(np.array([0, 10]), [2], seed=0)
    with pytest.raises(ArgumentError, match="seeds"):
        csc.sample_one_hop(np.array([-1]), [2], seed=0)
    with pytest.raises(ArgumentError, match="integer"):
        csc.sample_one_hop(np.array([0.5]), [2], seed=0)
    with pytest.raises(ArgumentError, match="generator"):
        make_generator("x")  # type: ignore[arg-type]


def test_one_hop_sampling_imports_no_torch() -> None:
    # a store server samples with these modules alone: importing torch there cost each
    # server a second of CPU at start-up (the job's time to its first step)
    code = (
        "import sys, graphrun.sampling.server, graphrun.cli.serve\n"
        "print(sorted(m for m in ('torch', 'torch_geometric') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def floyd_reference(n: np.ndarray, k: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Floyd's algorithm row by row, consuming the generator as the vectorised kernel
    does (round ``i``: one uniform per row, every row): int64, a Python set per row."""
    kmax = int(k.max())
    out = np.full((len(n), kmax), -1, dtype=np.int64)
    picked: list[set[int]] = [set() for _ in n]
    for i in range(kmax):
        u = rng.random(len(n))
        for r in range(len(n)):
            j = int(n[r] - k[r]) + i
            t = int(u[r] * (j + 1))
            t = j if t in picked[r] else t
            if i < k[r]:
                out[r, i] = t
                picked[r].add(t)
    return out


@pytest.mark.parametrize("ragged", [False, True])
def test_floyd_matches_the_row_by_row_reference(ragged: bool) -> None:
    from graphrun.sampling.kernels import _floyd

    gen = np.random.default_rng(3)
    for trial in range(30):
        n = gen.integers(1, 400, 60)
        k = np.minimum(n, gen.integers(1, 26, 60) if ragged else 25)
        got = _floyd(n, k, np.random.default_rng(trial))
        want = floyd_reference(n, k, np.random.default_rng(trial))
        assert np.array_equal(got, want), trial
        assert all(len(set(row[row >= 0])) == int(c) for row, c in zip(got, k, strict=True))


def picks_reference(
    indptr: np.ndarray, rows: np.ndarray, k: np.ndarray, rng: np.random.Generator
) -> tuple[list[int], list[int]]:
    """``(which, pos)`` row by row: all edges of a row with ``degree <= k`` in order, else
    Floyd on the rows that draw (the vectorised kernel's use of the generator)."""
    deg = indptr[rows + 1] - indptr[rows]
    draw = np.flatnonzero(deg > k)
    chosen = floyd_reference(deg[draw], k[draw], rng) if len(draw) else None
    which: list[int] = []
    pos: list[int] = []
    d = 0
    for i, r in enumerate(rows):
        if deg[i] <= k[i]:
            got = list(range(int(deg[i])))
        else:
            assert chosen is not None
            got = [int(v) for v in chosen[d, : k[i]]]
            d += 1
        which += [i] * len(got)
        pos += [int(indptr[r]) + v for v in got]
    return which, pos


@pytest.mark.parametrize("ragged", [False, True])
def test_uniform_picks_match_the_row_by_row_reference(ragged: bool) -> None:
    from graphrun.sampling.kernels import uniform_picks

    gen = np.random.default_rng(3)
    for trial in range(30):
        deg = gen.integers(0, 120, 80)
        indptr = np.concatenate([[0], np.cumsum(deg)])
        rows = gen.permutation(80)[:60]  # a subset, out of order
        k = gen.integers(0, 26, 60) if ragged else np.full(60, 25)
        indices = gen.integers(0, 10**9, int(indptr[-1]))
        eids = gen.permutation(int(indptr[-1]))
        which, pos, _ = uniform_picks(indptr, rows, k, np.random.default_rng(trial))
        want_which, want_pos = picks_reference(indptr, rows, k, np.random.default_rng(trial))
        assert which.tolist() == want_which and pos.tolist() == want_pos, trial
        which2, src, eid = uniform_picks(
            indptr, rows, k, np.random.default_rng(trial), (indices, eids)
        )
        assert np.array_equal(which2, which)
        assert np.array_equal(src, indices[pos]) and np.array_equal(eid, eids[pos])


@pytest.mark.parametrize(
    "case", ["all_draw", "some_whole", "zero_degree", "ragged", "listing", "duplicates"]
)
def test_numpy_uniform_picks_match_the_row_by_row_reference(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vectorised kernel's table (every row drawing: no mask; rows taking all their
    edges, rows of degree 0 or below the fanout: masked), its listing branch (a row
    taking more edges than the drawn rows keep) and duplicate rows, against the
    row-by-row reference on the same generator."""
    monkeypatch.delenv("GRAPHRUN_COMPILED", raising=False)
    gen = np.random.default_rng(4)
    for trial in range(20):
        lo = {"all_draw": 11, "zero_degree": 0}.get(case, 1)
        deg = gen.integers(lo, 60, 90)
        if case == "zero_degree":
            deg[::3] = 0
        indptr = np.concatenate([[0], np.cumsum(deg)])
        dup = case == "duplicates"  # seeds repeated, in any order
        rows = gen.integers(0, 90, 70) if dup else gen.permutation(90)[:70]
        k = np.full(70, 10)
        if case == "ragged":
            k = gen.integers(0, 12, 70)
        elif case == "listing":
            k[::7] = 2**31 - 1  # every edge: more than a drawn row keeps
        got = sample_segments(indptr, rows, k, rng=np.random.default_rng(trial))
        want_which, want_pos = picks_reference(indptr, rows, k, np.random.default_rng(trial))
        assert got.which.tolist() == want_which and got.pos.tolist() == want_pos, trial


def test_relabeler_map_dense_and_sorted_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The three ways new ids are found (mark and scan, unique over a map, sorted keys)
    give the same local ids, in order of arrival and by global id within a hop."""
    import torch

    from graphrun.sampling import mfg

    gen = np.random.default_rng(0)
    seeds = torch.from_numpy(gen.choice(5000, 50, replace=False))
    hops = [torch.from_numpy(gen.integers(0, 5000, m)) for m in (400, 3000, 20)]

    def run() -> list[np.ndarray]:
        r = mfg.Relabeler(5000)
        r.start(seeds)
        out = []
        for h in hops:
            local, new = r.add(h)
            out.append(np.concatenate([local.numpy(), new.numpy()]))
        out.append(r.nodes().numpy())
        return out

    dense = run()  # 3000 and 400 candidates: the mark scan; 20: unique over the map
    monkeypatch.setattr(mfg, "DENSE_FACTOR", 0)
    by_map = run()
    monkeypatch.setattr(mfg, "MAP_LIMIT", 10)
    by_sort = run()
    nodes = dense[-1]
    assert len(np.unique(nodes)) == len(nodes) and np.array_equal(nodes[:50], seeds.numpy())
    for a, b, c in zip(dense, by_map, by_sort, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)


def relabel_reference(
    seeds: list[int], hops: list[list[int]], order: str = "id"
) -> list[list[int]]:
    """Per hop, the local ids then the new global ids (by id, or in order of first
    occurrence); finally every node: a dict, row by row."""
    local_of = {g: i for i, g in enumerate(seeds)}
    out = []
    for h in hops:
        unseen = [g for g in h if g not in local_of]
        new = sorted(set(unseen)) if order == "id" else list(dict.fromkeys(unseen))
        base = len(local_of)
        local_of.update((g, base + j) for j, g in enumerate(new))
        out.append([local_of[g] for g in h] + new)
    return [*out, list(local_of)]


@pytest.mark.parametrize("order", ["id", "first"])
@pytest.mark.parametrize("dense", [0, 64, 10**9])
@pytest.mark.parametrize("sort_keys", [False, True])
@pytest.mark.parametrize("compiled", ["", "1"])
def test_relabeler_matches_the_reference(
    monkeypatch: pytest.MonkeyPatch, dense: int, sort_keys: bool, compiled: str, order: str
) -> None:
    """Batch after batch on one relabeler (its map and marks are reused), every path:
    scanned marks (dense), sorted candidates, sorted keys (ids past MAP_LIMIT), in numpy
    and compiled (GRAPHRUN_COMPILED=1); new ids by global id or in order of first sight."""
    import torch

    from graphrun.sampling import mfg

    monkeypatch.setenv("GRAPHRUN_COMPILED", compiled)
    monkeypatch.setattr(mfg, "DENSE_FACTOR", dense)
    if sort_keys:
        monkeypatch.setattr(mfg, "MAP_LIMIT", 10)
    gen = np.random.default_rng(1)
    r = mfg.Relabeler(3000, order)
    for _ in range(12):
        seeds = gen.choice(3000, int(gen.integers(1, 60)), replace=False)
        hops = [gen.integers(0, 3000, int(gen.integers(0, 2000))) for _ in range(3)]
        r.start(torch.from_numpy(seeds))
        got = []
        for h in hops:
            local, new = r.add(torch.from_numpy(h))
            got.append(local.tolist() + new.tolist())
        got.append(r.nodes().tolist())
        r.reset()
        assert got == relabel_reference(seeds.tolist(), [h.tolist() for h in hops], order)


def test_a_relabeler_order_other_than_id_or_first_is_refused() -> None:
    from graphrun.sampling import mfg

    with pytest.raises(ArgumentError, match="order: 'sorted' is not 'id' or 'first'"):
        mfg.Relabeler(10, "sorted")


def test_kernels_compile_where_numba_cannot_cache() -> None:
    # a read-only image (the job's pods run as a user who can write neither beside the
    # source nor a home cache): numba finds no place for its cache and raised at import
    code = (
        "from numba.core import caching\n"
        "caching.CacheImpl._locator_classes = []  # no writable place anywhere\n"
        "import numpy as np\n"
        "from graphrun.sampling import CSCGraph\n"
        "from graphrun.testing.graphs import random_graph\n"
        "from graphrun.store.routing import take_into\n"
        "out = CSCGraph.from_graph(random_graph()).sample_one_hop(np.arange(20), [3], seed=1)\n"
        "rows = np.zeros((100, 2))\n"
        "take_into(rows, np.arange(99, 0, -3), np.ones((50, 2)), np.arange(33))\n"
        "print(len(out) > 0, rows.sum())\n"
    )
    env = {**os.environ, "GRAPHRUN_COMPILED": "1"}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.split() == ["True", "66.0"]


def test_the_compiled_kernels_give_the_numpy_kernels_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphrun.testing.graphs import random_hetero_graph

    for g in (random_graph(), random_hetero_graph()):
        csc = CSCGraph.from_graph(g)
        fan = [3] * len(g.edge_types)
        got = {}
        for flag in ("", "1"):
            monkeypatch.setenv("GRAPHRUN_COMPILED", flag)
            hops = [csc.sample_one_hop(np.arange(g.num_nodes), fan, seed=s) for s in range(5)]
            got[flag] = [np.concatenate([h.src, h.seed_index, h.eid]) for h in hops]
        assert all(np.array_equal(a, b) for a, b in zip(got[""], got["1"], strict=True))


def test_numba_is_not_loaded_unless_asked() -> None:
    # numba and its first kernels add ~135 MiB to a process: a store server or a trainer
    # on a 1.5 GB host has none to spare (the store's fuzz test holds its memory flat)
    code = (
        "import sys, numpy as np, torch\n"
        "from graphrun.sampling import CSCGraph, mfg\n"
        "from graphrun.testing.graphs import random_graph\n"
        "from graphrun.store.routing import take_into\n"
        "CSCGraph.from_graph(random_graph()).sample_one_hop(np.arange(20), [3], seed=1)\n"
        "r = mfg.Relabeler(1000); r.start(torch.arange(5)); r.add(torch.arange(900))\n"
        "take_into(np.zeros((100, 2)), np.arange(99, 0, -3), np.ones((50, 2)), np.arange(33))\n"
        "print('numba' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GRAPHRUN_COMPILED"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
