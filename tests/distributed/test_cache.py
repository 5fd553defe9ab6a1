"""The remote-feature cache: the same batches, fewer bytes over the network."""

import numpy as np
import pytest
import torch

from graphrun.distributed import DistGraph, DistNodeDataLoader, initialize, plan_feature_cache
from graphrun.distributed import cache as cache_module
from graphrun.distributed.cache import CachedRows
from graphrun.errors import ArgumentError
from tests.distributed.test_loader import check_batch

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("dense", [True, False])
def test_cached_rows_find_their_slots(monkeypatch, dense) -> None:
    if not dense:
        monkeypatch.setattr(cache_module, "DENSE_LIMIT", 0)
    ids = np.array([3, 7, 8, 20])
    rows = np.arange(8, dtype=np.float32).reshape(4, 2)
    c = CachedRows(ids, rows, 30)
    assert (c._map is not None) == dense
    np.testing.assert_array_equal(c.slots(np.array([8, 0, 20, 3, 29, 7])), [2, -1, 3, 0, -1, 1])
    empty = CachedRows(np.empty(0, np.int64), np.empty((0, 2), np.float32), 30)
    np.testing.assert_array_equal(empty.slots(np.array([1, 2])), [-1, -1])


def test_a_feature_cache_gives_the_same_batches_with_fewer_bytes_pulled(served) -> None:
    fanouts = [3, 2]
    # use_shm=False: both partitions are remote to this client, so every node may be cached
    with initialize(served.servers, heartbeat_interval=0, use_shm=False) as ctx:
        dg = DistGraph(ctx)
        ids = torch.arange(0, 120)
        row = 8 * 4 + 8  # feat (8 float32) + label (int64)
        plan = plan_feature_cache(dg, ids, fanouts, batch_size=10, budget_bytes=50 * row)
        assert 0 < plan.num_rows <= 50 and list(plan.ids) == ["_N"]
        assert np.all(np.diff(plan.ids["_N"]) > 0)
        kw = {"batch_size": 10, "shuffle": True, "seed": 2}
        plain = DistNodeDataLoader(dg, ids, fanouts, **kw)
        cached = DistNodeDataLoader(dg, ids, fanouts, cache=plan, **kw)
        pulled = {"plain": 0, "cached": 0}
        served_by_cache = 0
        for a, b in zip(plain, cached, strict=True):
            check_batch(served, b, fanouts)  # every row against the original graph
            assert torch.equal(a.n_id, b.n_id) and torch.equal(a.x, b.x)
            assert torch.equal(a.y, b.y)
            pulled["plain"] += sum(plain.last_cost.feature_bytes.values())
            pulled["cached"] += sum(cached.last_cost.feature_bytes.values())
            served_by_cache += cached.last_cost.cache_bytes
        assert served_by_cache > 0
        assert pulled["cached"] + served_by_cache == pulled["plain"]
        # a sampler worker process materialises the same plan and builds the same batches
        with DistNodeDataLoader(dg, ids, fanouts, cache=plan, num_workers=1, **kw) as pooled:
            for a, b in zip(DistNodeDataLoader(dg, ids, fanouts, **kw), pooled, strict=True):
                assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
                assert pooled.last_cost.cache_bytes > 0 or len(b.n_id) == 0


def test_nothing_is_cached_without_a_budget_or_remote_partitions(served) -> None:
    with initialize(served.servers, heartbeat_interval=0) as ctx:  # both co-located
        dg = DistGraph(ctx)
        assert ctx.client.local_parts == [0, 1]
        ids = torch.arange(0, 40)
        plan = plan_feature_cache(dg, ids, [3], batch_size=10, budget_bytes=1 << 20)
        assert plan.num_rows == 0
        loader = DistNodeDataLoader(dg, ids, [3], batch_size=10, cache=plan)
        assert loader.spec.cache is None
    with initialize(served.servers, heartbeat_interval=0, use_shm=False) as ctx:
        plan = plan_feature_cache(DistGraph(ctx), ids, [3], batch_size=10, budget_bytes=0)
        assert plan.num_rows == 0


class _Reaches:
    """A sampler whose every batch reaches the same nodes (what ``plan_cache`` reads)."""

    def __init__(self, nodes: list[int]) -> None:
        self.node = torch.tensor(nodes)

    def sample(self, batch, generator=None):
        return self


def test_the_halo_fills_what_the_probes_leave_of_the_budget() -> None:
    from graphrun.distributed.cache import plan_cache
    from tests.partition.test_book import make_book

    book = make_book(2, [[10, 10]], [[5, 5]])  # partition 0 local: nodes 10..19 are remote
    seeds = torch.arange(0, 10)
    probed = _Reaches([1, 12, 15])  # remote 12 and 15 are reached by every probe
    halo = np.zeros(20, np.int64)
    halo[[18, 11, 13]] = [9, 5, 1]  # edges into partition 0
    plan = lambda budget, h: plan_cache(probed, book, [0], seeds, 5, budget, {"n0": 4}, halo=h)  # noqa: E731
    assert plan(4 * 20, None).ids["n0"].tolist() == [12, 15]  # the probes' nodes only
    assert plan(4 * 4, halo).ids["n0"].tolist() == [11, 12, 15, 18]  # then halo 18, 11
    assert plan(4 * 5, halo).ids["n0"].tolist() == [11, 12, 13, 15, 18]
    assert plan(4 * 20, halo).ids["n0"].tolist() == list(range(10, 20))  # all remote rows
    assert plan(4 * 2, halo).ids["n0"].tolist() == [12, 15]  # the probed come first


def test_bf16_rows_map_the_block_and_the_cache_to_one_table() -> None:
    from graphrun.distributed.features import Bf16Rows

    block = np.linspace(-3, 3, 40, dtype=np.float32).reshape(10, 4) / 7  # ids 10..19
    cached = CachedRows(np.array([2, 25]), np.float32([[1 / 3] * 4, [-1e-3] * 4]), 30)
    half = Bf16Rows(0, 10, block, cached)
    ids = np.array([25, 10, 19, 3, 2, 20, 12])
    slot = half.slots(ids)
    np.testing.assert_array_equal(slot, [11, 0, 9, -1, 10, -1, 2])
    want = torch.from_numpy(np.concatenate([block, cached.rows])).to(torch.bfloat16)
    assert half.table.dtype == torch.bfloat16 and torch.equal(half.table, want)
    assert half.row_bytes == 8
    np.testing.assert_array_equal(
        Bf16Rows(0, 10, block, None).slots(ids), [-1, 0, 9, -1, -1, -1, 2]
    )


@pytest.mark.parametrize("shm", [True, False])
def test_bf16_batches_are_the_fp32_rows_converted(served, shm) -> None:
    """``x_bf16``: the rows of ``x.to(torch.bfloat16)``, the same batches otherwise; with
    co-located partitions the rows read in place move in bf16 (fewer bytes counted),
    without them (and with the cache) every row is pulled and converted."""
    fanouts, ids = [3, 2], torch.arange(0, 120)
    kw = {"batch_size": 10, "shuffle": True, "seed": 2}
    with initialize(served.servers, heartbeat_interval=0, use_shm=shm) as ctx:
        dg = DistGraph(ctx)
        plan = plan_feature_cache(dg, ids, fanouts, batch_size=10, budget_bytes=1 << 20)
        assert (plan.num_rows > 0) != shm
        plain = DistNodeDataLoader(dg, ids, fanouts, cache=plan, **kw)
        half = DistNodeDataLoader(dg, ids, fanouts, cache=plan, x_bf16=True, **kw)
        moved = {"plain": 0, "half": 0}
        for a, b in zip(plain, half, strict=True):
            assert a.x.dtype == torch.float32 and b.x.dtype == torch.bfloat16
            assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
            assert torch.equal(a.x.to(torch.bfloat16), b.x) and torch.equal(a.y, b.y)
            for name, loader in (("plain", plain), ("half", half)):
                cost = loader.last_cost
                moved[name] += sum(cost.feature_bytes.values()) + cost.cache_bytes
        assert (moved["half"] < moved["plain"]) == shm
        with pytest.raises(ArgumentError, match=r"^x_bf16: expected True or False, got 'yes'$"):
            DistNodeDataLoader(dg, ids, fanouts, x_bf16="yes", **kw)
        with DistNodeDataLoader(dg, ids, fanouts, x_bf16=True, num_workers=1, **kw) as pooled:
            for a, b in zip(DistNodeDataLoader(dg, ids, fanouts, **kw), pooled, strict=True):
                assert torch.equal(a.x.to(torch.bfloat16), b.x)
