"""Held-out edges for link prediction: a fixed, symmetric split, kept out of batches."""

from __future__ import annotations

import pytest
import torch

from graphrun.errors import ArgumentError
from graphrun.sampling.edgesplit import TEST, TRAIN, VAL, EdgeSplit, keep_edges, split_edges
from graphrun.sampling.mfg import SampledSubgraph


def test_the_split_is_symmetric_seeded_and_near_its_fractions() -> None:
    g = torch.Generator().manual_seed(0)
    src, dst = (
        torch.randint(0, 10**6, (200_000,), generator=g),
        torch.randint(0, 10**6, (200_000,), generator=g),
    )
    s = EdgeSplit(val=0.1, test=0.2, seed=3)
    split = s.of(src, dst)
    assert torch.equal(split, s.of(dst, src))  # both directions together
    frac = torch.bincount(split.long(), minlength=3).float() / split.numel()
    assert abs(frac[VAL] - 0.1) < 0.005 and abs(frac[TEST] - 0.2) < 0.005
    assert not torch.equal(split, EdgeSplit(0.1, 0.2, seed=4).of(src, dst))
    assert bool((EdgeSplit(0.0, 0.0).of(src, dst) == TRAIN).all())


def test_bad_fractions_are_refused() -> None:
    with pytest.raises(ArgumentError, match="val"):
        EdgeSplit(val=-0.1)
    with pytest.raises(ArgumentError, match="leaves no training edges"):
        EdgeSplit(val=0.5, test=0.5)


def test_held_out_positives_count_an_undirected_edge_once() -> None:
    src = torch.tensor([0, 1, 2, 3, 5])
    dst = torch.tensor([1, 0, 3, 2, 5])
    everything_val = EdgeSplit(val=0.999999, test=0.0)
    ids = split_edges(torch.arange(5), src, dst, everything_val, "val", num_nodes=6)
    assert ids.tolist() == [0, 2, 4]
    assert split_edges(torch.arange(5), src, dst, everything_val, "train", 6).numel() <= 1


def _two_layer_subgraph() -> SampledSubgraph:
    # seeds 0, 1; layer 1: 2->0, 1->0, 3->1; layer 2: 4->2, 0->3
    return SampledSubgraph(
        node=torch.tensor([10, 11, 12, 13, 14]),
        row=torch.tensor([2, 1, 3, 4, 0]),
        col=torch.tensor([0, 0, 1, 2, 3]),
        edge=torch.tensor([7, 8, 9, 10, 11]),
        edge_type=None,
        batch_size=2,
        num_sampled_nodes=[2, 2, 1],
        num_sampled_edges=[3, 2],
    )


def test_keep_edges_keeps_each_layer_s_remaining_edges() -> None:
    sub = keep_edges(_two_layer_subgraph(), torch.tensor([True, False, True, False, True]))
    assert sub.num_sampled_edges == [2, 1]
    assert sub.edge.tolist() == [7, 9, 11] and sub.node.numel() == 5


def test_exclude_drops_the_target_edge_in_both_directions() -> None:
    sub = _two_layer_subgraph()
    none_held = EdgeSplit(0.0, 0.0)
    # positive target 10 <-> 11: the sampled edge 11 -> 10 (row 1, col 0) goes
    out = none_held.exclude(sub, torch.tensor([10]), torch.tensor([11]), num_nodes=100)
    assert out.edge.tolist() == [7, 9, 10, 11] and out.num_sampled_edges == [2, 2]
    # and every held-out edge goes
    all_held = EdgeSplit(0.999999, 0.0)
    assert all_held.exclude(sub, torch.tensor([0]), torch.tensor([1]), 100).edge.numel() == 0
