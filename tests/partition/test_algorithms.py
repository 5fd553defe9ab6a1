"""METIS input, balance weights and the rebalancing pass, random assignment, quality."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from graphrun.errors import ArgumentError
from graphrun.partition import assign
from graphrun.partition.balance import (
    combined_weights,
    criteria,
    part_loads,
    random_assign,
    rebalance,
)
from graphrun.partition.metis import metis_assign, symmetric_csr
from graphrun.partition.quality import max_over_mean, measure
from graphrun.testing.graphs import community_graph


# one slice and block; many, a short last one, rows sorted in blocks of 16 keys
@pytest.mark.parametrize(("slice_", "block"), [(1 << 23, 1 << 24), (7, 16)])
def test_symmetric_csr_matches_scipy(
    slice_: int, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("graphrun.partition.metis.SLICE", slice_)
    monkeypatch.setattr("graphrun.partition.metis.BLOCK", block)
    rng = np.random.default_rng(0)
    n = 50
    src = rng.integers(0, n, 400)
    dst = rng.integers(0, n, 400)
    xadj, adj = symmetric_csr(src, dst, n)
    a = sp.coo_matrix((np.ones(len(src)), (src, dst)), shape=(n, n)).tocsr()
    s = (a + a.T).tocsr()
    s.setdiag(0)
    s.eliminate_zeros()
    s.sort_indices()
    assert xadj.tolist() == s.indptr.tolist()
    assert adj.tolist() == s.indices.tolist()


def test_symmetric_csr_empty_and_self_loops() -> None:
    xadj, adj = symmetric_csr(np.array([0, 1], np.int64), np.array([0, 1], np.int64), 3)
    assert xadj.tolist() == [0, 0, 0, 0] and len(adj) == 0


def test_metis_assign_is_seeded_and_checks_parts() -> None:
    g = community_graph(300, 3000, num_communities=3, seed=1)
    xadj, adj = symmetric_csr(g.src, g.dst, g.num_nodes)
    a = metis_assign(xadj, adj, 3, seed=7)
    b = metis_assign(xadj, adj, 3, seed=7)
    assert a.tolist() == b.tolist() and set(a.tolist()) == {0, 1, 2}
    with pytest.raises(ArgumentError, match="num_parts"):
        metis_assign(xadj, adj, 301)


def test_combined_weights_give_each_criterion_equal_total() -> None:
    train = np.array([1, 0, 0, 0, 1, 0, 0, 0], bool)
    deg = np.array([8, 0, 0, 0, 0, 0, 0, 0])
    crit = criteria(8, deg, train, True, True)
    assert crit.shape == (8, 3)
    w = combined_weights(crit)
    # node 0: 1 + 1*8/2 + 8*8/8 = 13 (times the scale); node 1: 1
    assert w[0] == 13 * w[1]


def test_rebalance_fixes_a_skewed_assignment() -> None:
    g = community_graph(1000, 8000, num_communities=4, seed=2)
    train = np.zeros(g.num_nodes, bool)
    train[:200] = True
    xadj, adj = symmetric_csr(g.src, g.dst, g.num_nodes)
    crit = criteria(g.num_nodes, np.bincount(g.dst, minlength=g.num_nodes), train, True, True)
    part = np.where(
        np.arange(g.num_nodes) < 150, 0, np.arange(g.num_nodes) % 4
    )  # part 0 hoards train
    before = part_loads(part, crit, 4)
    assert max_over_mean(before[:, 1]) > 1.5
    after = part_loads(rebalance(part, crit, xadj, adj, 4, tolerance=0.05), crit, 4)
    for k in range(3):
        assert max_over_mean(after[:, k]) <= 1.05 + 1e-9


@pytest.mark.parametrize("edges", [False, True])
def test_random_assign_balances(edges: bool) -> None:
    rng = np.random.default_rng(0)
    train = rng.random(1001) < 0.2
    deg = rng.zipf(2.5, 1001)
    part = random_assign(1001, 4, train_mask=train, in_degree=deg if edges else None, seed=3)
    nodes = np.bincount(part, minlength=4)
    assert nodes.max() - nodes.min() <= (2 if edges else 1)
    t = np.bincount(part[train], minlength=4)
    assert t.max() - t.min() <= 1
    if edges:
        loads = np.bincount(part, weights=deg, minlength=4)
        assert max_over_mean(loads) < 1.05


def test_assign_metis_balances_train_and_edges() -> None:
    g = community_graph(2000, 30000, num_communities=4, seed=4)
    part = assign(g, 4, "metis", balance_train=True, balance_edges=True, tolerance=0.05)
    q = measure(g, part, 4)
    assert q.node_balance <= 1.05 + 1e-9
    assert q.edge_balance <= 1.05 + 1e-9
    assert q.train_balance is not None and q.train_balance <= 1.05 + 1e-9
    rand = measure(g, assign(g, 4, "random"), 4)
    assert q.edge_cut < rand.edge_cut


def test_quality_counts() -> None:
    g = community_graph(10, 30, num_communities=2, seed=0)
    part = np.zeros(10, np.int64)
    part[5:] = 1
    q = measure(g, part, 2)
    cut = int(((g.src < 5) != (g.dst < 5)).sum())
    assert q.num_cut_edges == cut and q.edge_cut == pytest.approx(cut / 30)
    assert q.node_balance == 1.0


@pytest.mark.parametrize("tolerance", [-0.1, float("nan"), float("inf")])
def test_assign_rejects_a_bad_tolerance(tolerance: float) -> None:
    g = community_graph(50, 200, seed=0)
    with pytest.raises(ArgumentError, match="tolerance"):
        assign(g, 2, "random", tolerance=tolerance)


def test_parhip_file_is_what_kaminpar_reads(tmp_path) -> None:
    import kaminpar

    from graphrun.partition.kaminpar import write_parhip

    g = community_graph(300, 3000, num_communities=3, seed=1)
    xadj, adj = symmetric_csr(g.src, g.dst, g.num_nodes)
    weights = np.arange(1, g.num_nodes + 1)
    write_parhip(tmp_path / "g.parhip", xadj, adj, weights)
    kg = kaminpar.load_graph(str(tmp_path / "g.parhip"), kaminpar.GraphFileFormat.PARHIP)
    assert (kg.n(), kg.m()) == (g.num_nodes, len(adj))
    for u in (0, 7, g.num_nodes - 1):
        assert kg.degree(u) == xadj[u + 1] - xadj[u]
        assert sorted(v for v, _ in kg.neighbors(u)) == sorted(adj[xadj[u] : xadj[u + 1]].tolist())
        assert kg.node_weight(u) == u + 1


@pytest.mark.parametrize("partitioner", ["metis", "kaminpar"])
def test_partitioners_share_the_trivial_cases_and_the_parts_check(partitioner: str) -> None:
    from graphrun.partition.kaminpar import kaminpar_assign

    assign = metis_assign if partitioner == "metis" else kaminpar_assign
    g = community_graph(300, 3000, num_communities=3, seed=1)
    xadj, adj = symmetric_csr(g.src, g.dst, g.num_nodes)
    assert assign(xadj, adj, 1).tolist() == [0] * 300
    empty = np.zeros(1, dtype=np.int64)
    assert assign(empty, empty[:0], 1).dtype == np.int64
    for parts in (0, 301):
        with pytest.raises(ArgumentError, match=f"num_parts: {parts} is not in \\[1, 300\\]"):
            assign(xadj, adj, parts)


def test_kaminpar_cuts_about_as_well_as_metis() -> None:
    from graphrun.partition.kaminpar import kaminpar_assign

    g = community_graph(3000, 30000, num_communities=8, seed=2)
    xadj, adj = symmetric_csr(g.src, g.dst, g.num_nodes)
    k = kaminpar_assign(xadj, adj, 4, threads=2)
    m = metis_assign(xadj, adj, 4)
    cut_k, cut_m = measure(g, k, 4).edge_cut, measure(g, m, 4).edge_cut
    assert sorted(np.unique(k)) == [0, 1, 2, 3]
    assert max_over_mean(np.bincount(k, minlength=4)) <= 1.04  # KaMinPar's 3 % + rounding
    assert cut_k <= 1.25 * cut_m, (cut_k, cut_m)
    rnd = random_assign(g.num_nodes, 4, seed=0)
    assert cut_k < 0.5 * measure(g, rnd, 4).edge_cut


def test_kaminpar_balances_training_nodes_and_edges() -> None:
    g = community_graph(3000, 30000, num_communities=8, seed=3)
    part = assign(g, 2, "kaminpar", balance_train=True, balance_edges=True, threads=2)
    q = measure(g, part, 2)
    assert q.train_balance <= 1.05 + 1e-9 and q.edge_balance <= 1.05 + 1e-9
