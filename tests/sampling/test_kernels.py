import numpy as np
import pytest
import torch
from scipy import stats

from graphrun.errors import ArgumentError
from graphrun.sampling import CSCGraph, make_generator, sample_segments
from graphrun.testing.graphs import random_graph


def star(deg: int) -> torch.Tensor:
    return torch.tensor([0, deg], dtype=torch.long)


def edge_set(g):
    return set(zip(g.src.tolist(), g.dst.tolist(), strict=True))


@pytest.mark.parametrize("replace", [False, True])
def test_sampled_edges_exist_and_fanout_respected(replace: bool) -> None:
    g = random_graph()
    csc = CSCGraph.from_graph(g)
    seeds = torch.arange(g.num_nodes)
    out = csc.sample_one_hop(seeds, torch.tensor([5]), replace=replace, generator=make_generator(1))
    dst = seeds[out.seed_index]
    # every sampled edge is a real edge with the right id
    assert (torch.from_numpy(g.src)[out.eid] == out.src).all()
    assert (torch.from_numpy(g.dst)[out.eid] == dst).all()
    counts = torch.bincount(out.seed_index, minlength=g.num_nodes)
    deg = torch.from_numpy(g.in_degrees())
    expect = torch.where(deg > 0, 5, 0) if replace else torch.minimum(deg, torch.tensor(5))
    assert torch.equal(counts, expect)
    if not replace:  # no edge twice for a seed
        assert torch.unique(out.eid).numel() == out.eid.numel()


def test_small_rows_take_every_edge() -> None:
    g = random_graph()
    csc = CSCGraph.from_graph(g)
    seeds = torch.arange(g.num_nodes)
    out = csc.sample_one_hop(seeds, torch.tensor([10_000]), generator=make_generator(0))
    assert sorted(out.eid.tolist()) == list(range(g.num_edges))


@pytest.mark.parametrize("row1", [6, 2])
def test_mixed_rows_are_grouped_in_order(row1: int) -> None:
    # rows 0 and 2 draw 3 of their 10 edges; rows 1 and 3 take all of theirs: row 1 has
    # more edges than a drawn row keeps (6: the listing branch) or fewer (2: the table)
    indptr = torch.tensor([0, 10, 10 + row1, 20 + row1, 22 + row1])
    k = torch.tensor([3, 2**31 - 1, 3, 2**31 - 1])
    picks = sample_segments(indptr, torch.arange(4), k, generator=make_generator(5))
    assert picks.which.tolist() == [0] * 3 + [1] * row1 + [2] * 3 + [3] * 2
    pos = picks.pos.tolist()
    assert pos[3 : 3 + row1] == list(range(10, 10 + row1))
    assert pos[-2:] == [20 + row1, 21 + row1]
    for lo, got in ((0, pos[:3]), (10 + row1, pos[3 + row1 : 6 + row1])):
        assert len(set(got)) == 3 and all(lo <= p < lo + 10 for p in got)


def test_deterministic_under_a_seed() -> None:
    csc = CSCGraph.from_graph(random_graph())
    seeds = torch.arange(50)
    a = csc.sample_one_hop(seeds, torch.tensor([3]), generator=make_generator(7))
    b = csc.sample_one_hop(seeds, torch.tensor([3]), generator=make_generator(7))
    c = csc.sample_one_hop(seeds, torch.tensor([3]), generator=make_generator(8))
    assert torch.equal(a.eid, b.eid)
    assert not torch.equal(a.eid, c.eid)
    rng = np.random.default_rng(3)
    d = csc.sample_one_hop(seeds, torch.tensor([3]), generator=make_generator(rng))
    e = csc.sample_one_hop(
        seeds, torch.tensor([3]), generator=make_generator(np.random.default_rng(3))
    )
    assert torch.equal(d.eid, e.eid)


@pytest.mark.parametrize("replace", [False, True])
def test_uniformity_chi_square(replace: bool) -> None:
    deg, k, trials = 20, 5, 4000
    indptr = star(deg)
    rows = torch.zeros(trials, dtype=torch.long)  # the same row sampled `trials` times
    picks = sample_segments(indptr, rows, k, replace=replace, generator=make_generator(123))
    assert len(picks) == trials * k
    counts = torch.bincount(picks.pos, minlength=deg).numpy()
    p = stats.chisquare(counts).pvalue
    assert p > 1e-3, counts
    if not replace:  # all 5-subsets equally likely → every pair equally likely too
        pos = picks.pos.view(trials, k)
        assert (pos.sort(1).values.diff(1) > 0).all()


def test_uniformity_detects_bias() -> None:
    # the test above can fail: a biased picker (always the first k) is rejected
    counts = np.zeros(20)
    counts[:5] = 4000
    assert stats.chisquare(counts).pvalue < 1e-3


def test_weighted_sampling_follows_weights() -> None:
    deg, trials = 4, 20000
    w = torch.tensor([0.0, 1.0, 2.0, 5.0], dtype=torch.float64)
    rows = torch.zeros(trials, dtype=torch.long)
    gen = make_generator(0)
    picks = sample_segments(star(deg), rows, 1, weights=w, replace=True, generator=gen)
    counts = torch.bincount(picks.pos, minlength=deg).numpy()
    assert counts[0] == 0
    p = stats.chisquare(counts[1:], f_exp=trials * np.array([1, 2, 5]) / 8).pvalue
    assert p > 1e-3, counts
    picks = sample_segments(star(deg), rows[:2000], 2, weights=w, generator=make_generator(0))
    pos = picks.pos.view(2000, 2)
    assert (pos != 0).all() and (pos[:, 0] != pos[:, 1]).all()  # weight 0 never, no repeats
    counts = torch.bincount(picks.pos, minlength=deg)
    assert counts[3] > counts[2] > counts[1]


def test_weighted_from_graph_feature() -> None:
    g = random_graph()
    csc = CSCGraph.from_graph(g, weight="w")
    out = csc.sample_one_hop(
        torch.arange(g.num_nodes), torch.tensor([3]), weighted=True, generator=make_generator(0)
    )
    assert (torch.from_numpy(g.src)[out.eid] == out.src).all()
    with pytest.raises(ArgumentError, match="weight"):
        CSCGraph.from_graph(g, weight="nope")


def test_seeds_out_of_range() -> None:
    csc = CSCGraph.from_graph(random_graph(num_nodes=10, num_edges=20))
    with pytest.raises(ArgumentError, match=r"seeds\[1\] = 10 is out of range"):
        csc.sample_one_hop(torch.tensor([0, 10]), torch.tensor([2]), generator=make_generator(0))
    with pytest.raises(ArgumentError, match="seeds"):
        csc.sample_one_hop(torch.tensor([-1]), torch.tensor([2]), generator=make_generator(0))
    with pytest.raises(ArgumentError, match="generator"):
        make_generator("x")  # type: ignore[arg-type]
