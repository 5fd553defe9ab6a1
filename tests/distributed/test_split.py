import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrun.distributed.split import edge_split, node_split, split_even, trainer_partitions
from graphrun.errors import ArgumentError
from graphrun.testing.store import range_book as book


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=4),
    world=st.integers(1, 6),
    density=st.floats(0, 1),
    mode=st.sampled_from(["pad", "trim"]),
    batch=st.integers(1, 7),
)
def test_equal_batch_counts_and_coverage(sizes, world, density, mode, batch) -> None:
    b = book(sizes)
    n = b.num_nodes
    mask = np.random.default_rng(n + world).random(n) < density
    parts = [node_split(mask, b, r, world, mode=mode) for r in range(world)]
    counts = {len(p) for p in parts}
    assert len(counts) == 1  # the same number of ids, so of mini-batches, on every trainer
    assert len({-(-len(p) // batch) for p in parts}) == 1
    ids = set(np.flatnonzero(mask).tolist())
    got = set(torch.cat(parts).tolist())
    assert got <= ids
    if mode == "pad":
        assert got == ids  # nothing lost
    else:
        assert len(ids) - len(got) < world


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=4),
    world=st.integers(1, 6),
    density=st.floats(0, 1),
)
def test_cover_gives_every_id_to_exactly_one_trainer(sizes, world, density) -> None:
    b = book(sizes)
    mask = np.random.default_rng(b.num_nodes + world).random(b.num_nodes) < density
    parts = [node_split(mask, b, r, world, mode="cover") for r in range(world)]
    got = torch.cat(parts)
    assert sorted(got.tolist()) == np.flatnonzero(mask).tolist()
    assert max(len(p) for p in parts) == -(-int(mask.sum()) // world)


def test_prefers_local_ids() -> None:
    b = book([10, 10])
    mask = np.ones(20, dtype=bool)
    a, c = (node_split(mask, b, r, 2) for r in range(2))
    assert a.tolist() == list(range(10)) and c.tolist() == list(range(10, 20))
    # unbalanced: partition 0 has 10 training ids, partition 1 only 4 -> 7 each
    mask = np.zeros(20, dtype=bool)
    mask[:12] = True
    mask[10:14] = True
    a, c = (node_split(mask, b, r, 2) for r in range(2))
    assert len(a) == len(c) == 7
    assert set(a.tolist()) <= set(range(10))
    assert set(range(10, 14)) <= set(c.tolist())


def test_more_trainers_than_partitions_and_pad_repeats() -> None:
    b = book([5, 0, 2])
    assert trainer_partitions(4, 3) == [0, 0, 1, 2]
    parts = [node_split(np.ones(7, dtype=bool), b, r, 4) for r in range(4)]
    assert [len(p) for p in parts] == [2, 2, 2, 2]
    assert set(torch.cat(parts).tolist()) == set(range(7))
    again = [node_split(np.ones(7, dtype=bool), b, r, 4) for r in range(4)]
    assert all(torch.equal(x, y) for x, y in zip(parts, again, strict=True))  # deterministic


def test_edge_split_and_bad_input() -> None:
    b = book([3, 3])
    assert edge_split(torch.tensor([0, 4, 5]), b, 1, 2).tolist() == [4, 5]
    with pytest.raises(ArgumentError, match="rank"):
        node_split(np.ones(6, bool), b, 2, 2)
    with pytest.raises(ArgumentError, match=r"nodes\[0\] = 6 is out of range|out of range"):
        node_split(np.array([6]), b, 0, 1)
    with pytest.raises(ArgumentError, match="mode"):
        split_even(np.arange(3), np.zeros(3, np.int64), 1, 1, [0], "nope")  # type: ignore[arg-type]
