"""The feature path to the device, run with the CPU transfer (same staging, slot reuse,
prefetch and cache logic as on a GPU); the CUDA variants are marked ``cuda``."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from torch_geometric.data import Data

from graphrun.distributed.devicefeed import (
    ALIGN,
    CpuTransfer,
    DeviceFeed,
    Prefetcher,
    Slot,
    transfer_for,
)
from graphrun.distributed.gpucache import (
    budget_bytes,
    build_cache,
    fits_whole,
    hot_rows,
)
from graphrun.errors import ArgumentError, GraphrunError

FEAT = torch.arange(50 * 3, dtype=torch.float32).view(50, 3)


def _batch(n_id: list[int], with_x: bool = True) -> SimpleNamespace:
    ids = torch.tensor(n_id)
    data = Data(edge_index=torch.tensor([[1, 2], [0, 0]]), n_id=ids, y=ids % 7, num_nodes=len(n_id))
    if with_x:
        data.x = FEAT[ids]
    data.batch_size = 1
    return SimpleNamespace(data=data, seeds=1)


def test_slot_packs_aligned_and_grows() -> None:
    slot = Slot(CpuTransfer())
    offs = slot.reserve([10, 300, 1])
    assert offs == [0, ALIGN, 3 * ALIGN]
    assert slot.buffer is not None and slot.buffer.numel() >= 3 * ALIGN + 1
    assert slot.grown == 1
    slot.reserve([5])
    assert slot.grown == 1  # fits: reused
    slot.reserve([10 * ALIGN])
    assert slot.grown == 2


def test_feed_moves_every_tensor_and_keeps_values() -> None:
    feed = DeviceFeed(CpuTransfer(), slots=2)
    b = _batch([4, 9, 2])
    src = {k: v.clone() for k, v in b.data.items() if isinstance(v, torch.Tensor)}
    data, event, tensors = feed.stage(b.data)
    feed.ready(event, tensors)
    for k, v in src.items():
        assert torch.equal(data[k], v), k
    assert feed.stats.batches == 1 and feed.stats.h2d_bytes > 0
    # the slot's buffer is reused by the next batches: what was moved stays intact
    x0 = data.x.clone()
    for ids in ([1, 2, 3], [7, 8, 9]):
        feed.stage(_batch(ids).data)
    assert torch.equal(data.x, x0)


def test_prefetcher_yields_in_order_and_counts_waits() -> None:
    feed = DeviceFeed(CpuTransfer(), slots=3)
    batches = [_batch([i, i + 1]) for i in range(10)]
    got = list(Prefetcher(iter(batches), feed, depth=2))
    assert [int(b.data.n_id[0]) for b in got] == list(range(10))
    assert all(torch.equal(b.data.x, FEAT[b.data.n_id]) for b in got)
    assert feed.stats.batches == 10


def test_prefetcher_stages_ahead_of_the_consumer() -> None:
    """The thread has the next batch staged while the trainer still holds the current."""
    feed = DeviceFeed(CpuTransfer(), slots=4)
    staged = threading.Event()

    def source():
        yield _batch([0])
        yield _batch([1])
        staged.set()
        yield _batch([2])

    it = Prefetcher(source(), feed, depth=2)
    next(it)  # batch 0 in the trainer's hands
    assert staged.wait(5.0)  # batch 1 was staged and batch 2 requested meanwhile
    assert [int(b.data.n_id[0]) for b in it] == [1, 2]


def test_prefetcher_raises_the_loader_error_in_the_trainer() -> None:
    def source():
        yield _batch([0])
        raise ValueError("sampler died")

    it = Prefetcher(source(), DeviceFeed(CpuTransfer()), depth=1)
    next(it)
    with pytest.raises(ValueError, match="sampler died"):
        next(it)


def test_prefetcher_close_stops_the_thread() -> None:
    def endless():
        i = 0
        while True:
            yield _batch([i % 50])
            i += 1

    it = Prefetcher(endless(), DeviceFeed(CpuTransfer()), depth=2)
    next(it)
    it.close()
    assert not it.thread.is_alive()


def test_hot_rows_budget_and_ties() -> None:
    scores = torch.tensor([5, 0, 9, 5, 1, 9])
    assert hot_rows(scores, budget=3 * 8, row_bytes=8).tolist() == [0, 2, 5]  # 9, 9, then 5@0
    assert hot_rows(scores, budget=100 * 8, row_bytes=8).tolist() == [0, 2, 3, 4, 5]  # no 0s
    assert hot_rows(scores, budget=7, row_bytes=8).numel() == 0
    with pytest.raises(ArgumentError):
        hot_rows(scores, 8, 0)


def test_budget_and_whole_table() -> None:
    assert budget_bytes(None, 1000) == 250
    assert budget_bytes(1, 10 << 20) == 1 << 20
    assert budget_bytes(100, 1 << 20) == 1 << 20  # never more than is free
    with pytest.raises(ArgumentError):
        budget_bytes(-1, 100)
    assert fits_whole(50, 12, 600) and not fits_whole(50, 12, 599)


def test_cache_split_and_assemble() -> None:
    ids = torch.tensor([2, 9, 30])
    cache = build_cache(FEAT, ids, 50, torch.device("cpu"), chunk=2)
    assert torch.equal(cache.rows, FEAT[ids])
    n_id = torch.tensor([9, 1, 30, 4])
    plan = cache.split(n_id)
    assert plan.hit_pos.tolist() == [0, 2] and plan.miss_pos.tolist() == [1, 3]
    x = cache.assemble(4, plan.hit_pos, plan.hit_slot, plan.miss_pos, FEAT[n_id][plan.miss_pos])
    assert torch.equal(x, FEAT[n_id])


def test_feed_with_cache_copies_only_misses() -> None:
    cache = build_cache(FEAT, torch.tensor([1, 2, 3]), 50, torch.device("cpu"))
    plain, cached = DeviceFeed(CpuTransfer()), DeviceFeed(CpuTransfer(), cache=cache)
    n_id = [1, 2, 3, 40]
    a, _, _ = plain.stage(_batch(n_id).data)
    b, _, _ = cached.stage(_batch(n_id).data)
    assert torch.equal(b.x, FEAT[torch.tensor(n_id)]) and torch.equal(a.x, b.x)
    assert cached.stats.hit_rate == pytest.approx(0.75)
    # x went over for one row instead of four (the positions are small int64s)
    assert cached.stats.h2d_bytes < plain.stats.h2d_bytes + 4 * 8


def test_feed_whole_table_needs_no_features_from_the_loader() -> None:
    cache = build_cache(FEAT, torch.arange(50), 50, torch.device("cpu"))
    assert cache.whole
    feed = DeviceFeed(CpuTransfer(), cache=cache)
    data, _, _ = feed.stage(_batch([5, 6], with_x=False).data)
    assert torch.equal(data.x, FEAT[5:7])
    partial = DeviceFeed(
        CpuTransfer(), cache=build_cache(FEAT, torch.tensor([5]), 50, cache.rows.device)
    )
    with pytest.raises(GraphrunError, match="lacks"):
        partial.stage(_batch([5, 6], with_x=False).data)


def test_transfer_for_cpu() -> None:
    assert isinstance(transfer_for(torch.device("cpu")), CpuTransfer)


@pytest.mark.cuda
def test_cuda_feed_overlaps_and_matches() -> None:
    dev = torch.device("cuda", 0)
    cache = build_cache(FEAT, torch.tensor([1, 2]), 50, dev)
    feed = DeviceFeed(transfer_for(dev), slots=3, cache=cache)
    batches = [_batch([i % 50, (i + 1) % 50, 2]) for i in range(20)]
    for b in Prefetcher(iter(batches), feed, depth=2):
        assert b.data.x.is_cuda and b.data.edge_index.is_cuda
        assert torch.equal(b.data.x.cpu(), FEAT[b.data.n_id.cpu()])
    assert feed.slots[0].buffer is not None and feed.slots[0].buffer.is_pinned()
