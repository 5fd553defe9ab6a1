"""A job that follows a live graph trains on nodes that arrived during it (issue 42)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.nn import GraphSAGE

from graphrun.distributed import DistGraph, DistNodeDataLoader, initialize
from graphrun.distributed.writer import GraphWriter
from graphrun.errors import ArgumentError
from graphrun.partition import load_id_mapping
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.server import ServerConfig
from graphrun.testing.store import make_partition_dir, store_threads

pytestmark = pytest.mark.integration

NEW = 10**9 + np.arange(6)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return make_partition_dir(tmp_path_factory.mktemp("follow") / "parts", 2)[1]


def write_new_nodes(addresses, parts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Six new labelled training nodes, each with edges from base nodes of both partitions
    (placed on both: LDG breaks the ties to the smaller); their graph ids too."""
    feat = np.arange(6 * 8, dtype=np.float32).reshape(6, 8) + 1000
    label = np.arange(6, dtype=np.int64) % 4
    orig = load_id_mapping(parts).orig_nids
    with KVClient(ClientConfig(addresses, job="writer", timeout=20)) as c:
        w = GraphWriter(c)
        flags = {m: np.full(6, m == "train_mask") for m in ("train_mask", "val_mask", "test_mask")}
        w.add_nodes("_N", NEW, {"feat": feat, **flags}, label=label)
        src = np.repeat(orig[[3, 500]], 6)
        w.add_edges("_E", src, np.tile(NEW, 2), orig=True)
        w.commit()
        ids = w.lookup(NEW)
    return feat, label, ids


@pytest.mark.parametrize("follow", ["epoch", "head", "pinned"])
def test_new_labelled_nodes_join_the_seeds_at_the_next_epoch(parts, follow):
    cfg = ServerConfig(parts, 0, extensions=("graphrun.sampling.server:register",))
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
            dg = DistGraph(ctx, follow=follow)
            assert dg.version == 0
            train = dg.mask_ids("train_mask")
            loader = DistNodeDataLoader(dg, train, [4, 4], batch_size=64, shuffle=True,
                                        live_seeds="train_mask")  # fmt: skip
            first = torch.cat([b.n_id[: b.batch_size] for b in loader])
            assert sorted(first.tolist()) == sorted(train.tolist())
            feat, label, ids = write_new_nodes(addresses, parts)
            model = GraphSAGE(8, 16, num_layers=2, out_channels=16)  # more than the labels
            seen = []
            for b in loader:  # the next epoch
                seeds = b.n_id[: b.batch_size]
                new = seeds >= dg.num_nodes()
                seen += seeds[new].tolist()
                if new.any():
                    k = [ids.tolist().index(i) for i in seeds[new].tolist()]
                    assert b.x[: b.batch_size][new].numpy().tolist() == feat[k].tolist()
                    assert b.y[: b.batch_size][new].numpy().tolist() == label[k].tolist()
                    out = model(b.x, b.edge_index)[: b.batch_size]
                    loss = torch.nn.functional.cross_entropy(out, b.y[: b.batch_size])
                    loss.backward()
                    assert torch.isfinite(loss)
                    # their in-edges from the base nodes were sampled too
                    dst = b.edge_index[1][: b.num_sampled_edges[0]]
                    assert set(torch.nonzero(new).squeeze(1).tolist()) <= set(dst.tolist())
            if follow == "pinned":
                assert seen == [] and dg.version == 0
            else:
                assert len(seen) == 6 and dg.version == 1


def test_follow_is_checked(parts):
    cfg = ServerConfig(parts, 0, extensions=("graphrun.sampling.server:register",))
    with store_threads(cfg, 2) as threads:
        ctx = initialize([t.address for t in threads], rank=0, world_size=1, heartbeat_interval=0)
        with ctx, pytest.raises(ArgumentError, match="follow: 'always' is not one of"):
            DistGraph(ctx, follow="always")


def update_row(addresses, node: int) -> np.ndarray:
    """Overwrite base node ``node``'s features (a version of its own); the new row."""
    row = np.full((1, 8), -7.0, np.float32)
    with KVClient(ClientConfig(addresses, job="writer", timeout=20)) as c:
        w = GraphWriter(c)
        w.update_features("_N", "feat", [node], row)
        w.commit()
    return row[0]


def same_batches(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.num_sampled_edges == b.num_sampled_edges
        for key in ("n_id", "edge_index", "x", "y"):
            assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
@pytest.mark.parametrize("follow", ["epoch", "head", "pinned"])
def test_sampler_workers_read_each_batch_at_the_trainers_version(parts, follow):
    """Loader workers (num_workers > 0) sample and pull every batch at the version the
    trainer chose for it: the new nodes join at the next epoch (not pinned), an updated
    row is read at the version, and the batches are those the trainer builds itself."""
    cfg = ServerConfig(parts, 0, extensions=("graphrun.sampling.server:register",))
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
            dg = DistGraph(ctx, follow=follow)
            train = dg.mask_ids("train_mask")
            kw = {"batch_size": 64, "shuffle": True, "live_seeds": "train_mask", "seed": 3}
            with DistNodeDataLoader(dg, train, [4, 4], num_workers=2, **kw) as loader:
                first = list(loader)
                assert int(max(b.n_id[: b.batch_size].max() for b in first)) < dg.num_nodes()
                feat, _, ids = write_new_nodes(addresses, parts)
                row = update_row(addresses, int(train[0]))
                loader.set_epoch(1)
                got = list(loader)
            inline = DistNodeDataLoader(dg, train, [4, 4], **kw)
            inline.set_epoch(1)
            same_batches(got, list(inline))
            seeds = torch.cat([b.n_id[: b.batch_size] for b in got])
            x = torch.cat([b.x[: b.batch_size] for b in got])
            at = int(torch.nonzero(seeds == train[0])[0])
            if follow == "pinned":
                assert int((seeds >= dg.num_nodes()).sum()) == 0 and dg.version == 0
                assert x[at].tolist() != row.tolist()
            else:
                new = seeds >= dg.num_nodes()
                assert sorted(seeds[new].tolist()) == sorted(ids.tolist())
                assert sorted(x[new][:, 0].tolist()) == sorted(feat[:, 0].tolist())
                assert x[at].tolist() == row.tolist() and dg.version == 2


@pytest.mark.parametrize("num_workers", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_a_cached_row_updated_by_a_writer_is_read_fresh_after_the_version_moves(parts, num_workers):
    """The feature cache stays on while following: at the next epoch's version the rows
    a writer updated are read again (graph_changes), the others still served cached."""
    from graphrun.distributed import plan_feature_cache

    cfg = ServerConfig(parts, 0, extensions=("graphrun.sampling.server:register",))
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        # use_shm=False: both partitions are remote to this client, so rows are cached
        with initialize(addresses, heartbeat_interval=0, use_shm=False) as ctx:
            dg = DistGraph(ctx, follow="epoch")
            train = dg.mask_ids("train_mask")
            plan = plan_feature_cache(dg, train, [4, 4], batch_size=64, budget_bytes=1 << 20)
            node = int(plan.ids["_N"][0])
            seeds = torch.tensor([node, *plan.ids["_N"][1:4].tolist()])
            kw = {"batch_size": 4, "cache": plan, "num_workers": num_workers}
            with DistNodeDataLoader(dg, seeds, [2], **kw) as loader:
                (before,) = list(loader)
                assert loader.last_cost.cache_bytes > 0
                row = update_row(addresses, node)
                (after,) = list(loader)
                assert dg.version == 1 and loader.last_cost.cache_bytes > 0
            assert before.n_id[0] == after.n_id[0] == node
            assert before.x[0].tolist() != row.tolist() and after.x[0].tolist() == row.tolist()
            assert torch.equal(before.x[1:4], after.x[1:4])


def test_new_seeds_are_shared_evenly_between_trainers():
    from graphrun.distributed.live import share

    fresh = np.arange(100, 105)
    parts = [share(fresh, r, 2).tolist() for r in range(2)]
    assert parts == [[100, 102, 104], [101, 103, 100]]  # as many each: one wraps around
    assert sorted(set(parts[0]) | set(parts[1])) == fresh.tolist()
    assert [share(fresh[:1], r, 3).tolist() for r in range(3)] == [[100]] * 3
    assert share(fresh[:0], 0, 2).tolist() == []


def test_a_trainers_data_follows_the_graph_and_its_epochs_take_the_new_nodes(parts):
    """The trainer's DistGraphData (what spec.live.follow drives): the second epoch's
    training batches hold the nodes written after the first."""
    from graphrun.train.distdata import DistGraphData

    cfg = ServerConfig(parts, 0, extensions=("graphrun.sampling.server:register",))
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        ctx = initialize(addresses, rank=0, world_size=1, heartbeat_interval=0)
        with ctx:
            data = DistGraphData(DistGraph(ctx, follow="epoch"), 0, 1, cache_mb=64)
            n = data.num_nodes()
            first = [b.data.n_id[: b.data.batch_size] for b in
                     data.loader("train", None, [4, 4], 64, True, epoch=0)]  # fmt: skip
            assert int(torch.cat(first).max()) < n
            feat, _, _ = write_new_nodes(addresses, parts)
            second = [b.data for b in data.loader("train", None, [4, 4], 64, True, epoch=1)]
            seeds = torch.cat([b.n_id[: b.batch_size] for b in second])
            assert int((seeds >= n).sum()) == 6
            x = torch.cat([b.x[: b.batch_size] for b in second])[seeds >= n]
            assert sorted(x[:, 0].tolist()) == sorted(feat[:, 0].tolist())


def test_a_cache_knows_no_new_node_and_says_so():
    """A live graph's new node ids lie past the cache's id space: not cached (-1), not an
    IndexError of the dense map."""
    from graphrun.distributed.cache import CachedRows

    rows = CachedRows(np.asarray([1, 5]), np.zeros((2, 3), np.float32), id_space=10)
    assert rows.slots(np.asarray([5, 1, 12, 3])).tolist() == [1, 0, -1, -1]


def test_find_edges_of_a_following_graph_reads_its_new_edges(parts):
    """``DistGraph.find_edges`` of new edges (routed by their growth blocks, looked up in
    the owners' deltas) while following; a graph at version 0 refuses them by name."""
    cfg = ServerConfig(parts, 0, extensions=("graphrun.sampling.server:register",))
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
            dg = DistGraph(ctx, follow="head")
            _, _, ids = write_new_nodes(addresses, parts)
            ctx.client.follow()  # the head, with them
            got = dg.sample_neighbors(ids, 100)  # every in-edge of the new nodes
            assert len(got.eid) == 12 and (got.eid >= dg.partition_book.num_edges).all()
            src, dst = dg.find_edges(got.eid)
            assert src.tolist() == got.src.tolist()
            assert dst.tolist() == ids[got.seed_index].tolist()
            base = np.array([0, 1, dg.partition_book.num_edges - 1])
            s, d = dg.find_edges(base)  # base edges as before
            assert len(s) == len(d) == 3
            ctx.client.follow(0)
            with pytest.raises(ArgumentError, match="is not an edge"):
                dg.find_edges(got.eid)
