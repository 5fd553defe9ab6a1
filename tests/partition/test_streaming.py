"""Streaming placement of new nodes (LDG, Fennel) and the streamed-vs-scratch edge cut."""

from __future__ import annotations

import numpy as np
import pytest

from graphrun.errors import ArgumentError
from graphrun.graph.generate import GenParams, community
from graphrun.partition.streaming import (
    Neighbours,
    assign,
    capacity_for,
    fennel_alpha,
    measure_streamed,
)


def test_a_node_goes_where_most_of_its_neighbours_are():
    placed = Neighbours.from_pairs(
        np.array([0, 0, 0, 1, 1, 2]), np.array([2, 2, 1, 0, 3, 3]), n=4
    )  # node 3 has no placed neighbour
    sizes = np.array([10, 10, 10, 10])
    parts = assign(placed, sizes, capacity=20)
    assert parts.tolist() == [2, 0, 3, 1]  # 1: a tie, the lower index; 3: the smallest part
    assert sizes.tolist() == [10, 10, 10, 10]  # not changed
    lists = [np.array([2, 2, 1]), np.array([0, 3]), np.array([3]), np.array([], np.int64)]
    again = Neighbours.from_lists(lists)
    assert (again.indptr == placed.indptr).all() and (again.items == placed.items).all()


def test_capacity_is_a_hard_bound_and_the_penalty_prefers_room():
    placed = Neighbours.from_pairs(np.zeros(3, dtype=np.int64), np.array([0, 0, 1]), n=1)
    assert assign(placed, np.array([20, 0]), capacity=20).tolist() == [1]  # part 0 is full
    # two neighbours on an almost full part score 2 * 0.05 < one on an empty part
    assert assign(placed, np.array([19, 0]), capacity=20).tolist() == [1]
    assert assign(placed, np.array([5, 0]), capacity=20).tolist() == [0]


def test_earlier_nodes_of_the_batch_count_as_neighbours():
    n = 6  # a path 0-1-2-3-4-5 of new nodes; node 0 has a placed neighbour on part 2
    placed = Neighbours.from_pairs(np.array([0]), np.array([2]), n)
    i = np.arange(n - 1)
    within = Neighbours.from_pairs(np.r_[i, i + 1], np.r_[i + 1, i], n)
    parts = assign(placed, np.zeros(3, dtype=np.int64), capacity=10, within=within)
    assert parts.tolist() == [2] * n
    alone = assign(placed, np.zeros(3, dtype=np.int64), capacity=10)
    assert alone.tolist() == [2, 0, 1, 0, 1, 2]  # without them: the smallest part each time


def test_a_batch_that_cannot_fit_is_refused_and_bad_input_named():
    placed = Neighbours.empty(5)
    with pytest.raises(ArgumentError, match="room for 4 more, not the batch's 5"):
        assign(placed, np.array([8, 8]), capacity=10)
    with pytest.raises(ArgumentError, match=r"neighbour_parts: entries must be in \[0, 2\)"):
        assign(Neighbours.from_pairs(np.array([0]), np.array([2]), 5), np.zeros(2), 10)
    with pytest.raises(ArgumentError, match="within: not a CSR over the batch's 5 nodes"):
        assign(placed, np.zeros(2), 10, within=Neighbours.empty(4))
    with pytest.raises(ArgumentError, match="method: 'metis' is not one of ldg, fennel"):
        assign(placed, np.zeros(2), 10, method="metis")


def test_capacity_rule():
    assert capacity_for(np.array([100, 100, 100, 100]), 100, slack=0.05) == 132  # 1.05*500/4
    assert capacity_for(np.zeros(3, dtype=np.int64), 0) == 1
    with pytest.raises(ArgumentError, match="slack"):
        capacity_for(np.zeros(2), 1, slack=float("nan"))


@pytest.fixture(scope="module")
def graph():
    return community(GenParams(nodes=4000, avg_degree=10, classes=8, feat_dim=4, seed=3))


def _stream(graph, parts, method="ldg", seed=0):
    """Every node streamed in a random order from empty partitions, one call."""
    from graphrun.partition.metis import symmetric_csr
    from graphrun.partition.streaming import stream_neighbours

    n = graph.num_nodes
    perm = np.random.default_rng(seed).permutation(n)
    xadj, adjncy = symmetric_csr(graph.src, graph.dst, n)
    placed, within = stream_neighbours(xadj, adjncy, perm, 0, np.zeros(0, dtype=np.int64))
    cap = capacity_for(np.zeros(parts, dtype=np.int64), n)
    alpha = fennel_alpha(n, len(adjncy) // 2, parts)
    out = np.empty(n, dtype=np.int64)
    out[perm] = assign(placed, np.zeros(parts), cap, within=within, method=method, alpha=alpha)
    return out, cap


@pytest.mark.parametrize("method", ["ldg", "fennel"])
def test_streaming_beats_random_placement_and_stays_balanced(graph, method):
    from graphrun.partition.balance import random_assign
    from graphrun.partition.quality import cut_edges

    part, cap = _stream(graph, 4, method)
    rnd = random_assign(graph.num_nodes, 4, seed=0)
    streamed = cut_edges(part, graph.src, graph.dst)
    random = cut_edges(rnd, graph.src, graph.dst)
    assert streamed < 0.7 * random
    assert np.bincount(part, minlength=4).max() <= cap == 1050
    again, _ = _stream(graph, 4, method)
    assert (again == part).all()  # deterministic


def test_streamed_cut_ratio_against_scratch(graph):
    full = measure_streamed(graph, 4, base_fraction=0.0)
    assert full.streamed_nodes == graph.num_nodes
    assert full.streamed_cut_ratio == full.streamed_cut / full.scratch_cut
    assert full.scratch_cut < full.streamed_cut < 0.7 * full.random_cut
    live = measure_streamed(graph, 4, base_fraction=0.5)  # a base partitioned, half streamed
    assert live.streamed_nodes == 2000
    assert live.streamed_cut_ratio < full.streamed_cut_ratio
    assert live.streamed_cut_ratio <= 1.3  # the target, for a store grown to twice its base
    assert live.node_balance <= 1.05 + 4 / graph.num_nodes
    assert measure_streamed(graph, 4, order="id", method="fennel").to_dict()["capacity"] == 1050


def test_measure_arguments_checked(graph):
    with pytest.raises(ArgumentError, match="order: 'degree'"):
        measure_streamed(graph, 4, order="degree")
    with pytest.raises(ArgumentError, match="base_fraction"):
        measure_streamed(graph, 4, base_fraction=1.0)
    with pytest.raises(ArgumentError, match="'ldg', 'parmetis' are not"):
        measure_streamed(graph, 4, scratch="parmetis")
    with pytest.raises(ArgumentError, match="parts"):
        measure_streamed(graph, 0)


def test_blocks_and_one_way_within_lists_place_the_same(graph, monkeypatch):
    from graphrun.partition import streaming

    whole, _ = _stream(graph, 3)
    monkeypatch.setattr(streaming, "BLOCK", 7)  # counts held for 7 nodes at a time
    small, _ = _stream(graph, 3)
    assert (small == whole).all()
    n = 6  # a path given only as "i lists i - 1": the same as both ways
    placed = Neighbours.from_pairs(np.array([0]), np.array([1]), n)
    i = np.arange(1, n)
    one_way = Neighbours.from_pairs(i, i - 1, n)
    both = Neighbours.from_pairs(np.r_[i, i - 1], np.r_[i - 1, i], n)
    zeros = np.zeros(3, dtype=np.int64)
    a = assign(placed, zeros, capacity=10, within=one_way)
    assert a.tolist() == assign(placed, zeros, capacity=10, within=both).tolist() == [1] * n
