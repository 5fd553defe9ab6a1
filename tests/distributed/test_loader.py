import os
import signal

import numpy as np
import pytest
import torch
from torch_geometric.nn import GraphSAGE, HeteroConv, SAGEConv

from graphrun.distributed import (
    DistGraph,
    DistLinkDataLoader,
    DistNodeDataLoader,
    initialize,
    node_split,
)
from graphrun.errors import ArgumentError, JobFailed

pytestmark = pytest.mark.integration


def check_batch(served, batch, fanouts) -> None:
    g = served.graph
    orig_n = served.orig_nodes(batch.n_id)
    assert np.array_equal(batch.x.numpy(), g.ndata["_N"]["feat"][orig_n])
    assert np.array_equal(batch.y.numpy(), g.ndata["_N"]["label"][orig_n])
    e = served.orig_edges(batch.e_id)
    assert np.array_equal(g.src[e], orig_n[batch.edge_index[0].numpy()])
    assert np.array_equal(g.dst[e], orig_n[batch.edge_index[1].numpy()])
    assert len(batch.num_sampled_edges) == len(fanouts)
    first = batch.edge_index[1][: batch.num_sampled_edges[0]]
    assert int(first.max()) < batch.batch_size
    assert int(torch.bincount(first).max()) <= fanouts[0]


def test_node_loader_equal_batches_and_graphsage(served) -> None:
    fanouts = [4, 3]
    lengths = []
    for rank in range(2):
        with initialize(served.servers, rank=rank, world_size=2, heartbeat_interval=0) as ctx:
            dg = DistGraph(ctx)
            train = node_split(dg.mask_ids("train_mask"), dg.partition_book, rank, 2)
            loader = DistNodeDataLoader(dg, train, fanouts, batch_size=16, shuffle=True, seed=1)
            lengths.append(len(loader))
            batches = list(loader)
            assert len(batches) == len(loader)
            seen = torch.cat([b.n_id[: b.batch_size] for b in batches])
            assert sorted(seen.tolist()) == sorted(train.tolist())
            model = GraphSAGE(8, 16, num_layers=2, out_channels=4)
            for b in batches[:3]:
                check_batch(served, b, fanouts)
                out = model(
                    b.x,
                    b.edge_index,
                    num_sampled_nodes_per_hop=b.num_sampled_nodes,
                    num_sampled_edges_per_hop=b.num_sampled_edges,
                )[: b.batch_size]
                assert out.shape == (b.batch_size, 4)
    assert lengths[0] == lengths[1]


@pytest.mark.parametrize("shm", [True, False])
def test_node_batches_without_edge_ids_are_the_same_batches_without_e_id(served, shm) -> None:
    with initialize(served.servers, heartbeat_interval=0, use_shm=shm) as ctx:
        dg = DistGraph(ctx)
        ids = dg.mask_ids("train_mask")
        got = [
            list(DistNodeDataLoader(dg, ids, [4, 3], batch_size=16, seed=2, edge_ids=e))
            for e in (True, False)
        ]
    for a, b in zip(*got, strict=True):
        assert "e_id" in a and "e_id" not in b
        for key in ("n_id", "edge_index", "x", "y"):
            assert torch.equal(a[key], b[key]), key


def test_a_trainers_seeds_of_other_partitions_are_dealt_last(served) -> None:
    # trainer 0's seeds of partition 1 made every batch ask machine 1 for a first hop
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        ids = dg.mask_ids("train_mask")  # both partitions' ids
        away = dg.partition_book.nid2part(ids.numpy()) != 0
        assert 16 < away.sum() < len(ids) - 16

        def epoch(loader: DistNodeDataLoader, e: int) -> torch.Tensor:
            loader.set_epoch(e)
            return torch.cat([b.n_id[: b.batch_size] for b in loader])

        kw = {"batch_size": 16, "shuffle": True, "seed": 3}
        homed = [DistNodeDataLoader(dg, ids, [2], home=0, **kw) for _ in range(2)]
        plain = DistNodeDataLoader(dg, ids, [2], **kw)
        for e in range(2):
            got = epoch(homed[0], e)
            assert torch.equal(got, epoch(homed[1], e))  # deterministic
            assert sorted(got.tolist()) == sorted(ids.tolist())  # every seed once
            owner = dg.partition_book.nid2part(got.numpy())
            n_home = int((owner == 0).sum())
            assert (owner[:n_home] == 0).all() and (owner[n_home:] == 1).all()
            # each part in the shuffle's order
            before = epoch(plain, e)
            mask = torch.from_numpy(dg.partition_book.nid2part(before.numpy()) == 0)
            assert torch.equal(got, torch.cat([before[mask], before[~mask]]))
        with pytest.raises(ArgumentError, match=r"home: partition 2 is not in \[0, 2\)"):
            DistNodeDataLoader(dg, ids, [2], home=2, **kw)
        with pytest.raises(ArgumentError, match="home: not with live_seeds"):
            DistNodeDataLoader(dg, ids, [2], home=0, live_seeds="train_mask", **kw)


def test_the_training_loaders_order_is_the_one_elastic_trainers_plan_with(served) -> None:
    # three trainers on two partitions: partition 1's one trainer gets seeds of partition 0
    from graphrun.train.distdata import DistGraphData

    foreign = 0
    for rank in range(3):
        with initialize(served.servers, rank=rank, world_size=3, heartbeat_interval=0) as ctx:
            data = DistGraphData(DistGraph(ctx), rank, 3, seed=4)
            home = data._parts[rank]
            for e in range(2):
                want = data.train_orders(e, None)[rank]
                got = torch.cat([
                    b.data.n_id[: b.data.batch_size]
                    for b in data.loader("train", None, [2], 16, True, e)
                ])  # fmt: skip
                assert torch.equal(got, want)
                owner = data.book.nid2part(got.numpy())
                n_home = int((owner == home).sum())
                assert (owner[:n_home] == home).all() and (owner[n_home:] != home).all()
                foreign += len(got) - n_home
            data.close()
    assert foreign > 0


def test_node_batches_with_the_seeds_labels_only(served) -> None:
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        ids = dg.mask_ids("train_mask")
        got = [
            list(DistNodeDataLoader(dg, ids, [4, 3], batch_size=16, seed=2, labels=labels))
            for labels in ("all", "seeds")
        ]
        with pytest.raises(ArgumentError, match=r"^labels: expected 'all' or 'seeds'"):
            DistNodeDataLoader(dg, ids, [4, 3], batch_size=16, labels="some")
    for a, b in zip(*got, strict=True):
        assert len(a.y) == a.num_nodes and len(b.y) == b.batch_size
        assert torch.equal(a.y[: a.batch_size], b.y)
        for key in ("n_id", "edge_index", "x", "e_id"):
            assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
def test_workers_give_the_same_batches_and_a_dead_worker_is_an_error(served) -> None:
    with initialize(served.servers, heartbeat_interval=0, machine="m1") as ctx:
        dg = DistGraph(ctx)
        ids = torch.arange(0, 120)
        kw = {"batch_size": 10, "shuffle": True, "seed": 5}
        inline = list(DistNodeDataLoader(dg, ids, [3, 2], **kw))
        with DistNodeDataLoader(dg, ids, [3, 2], num_workers=2, prefetch=3, **kw) as loader:
            loader.start()  # workers up before the first iteration
            assert len(loader.worker_pids) == 2 and all(loader.worker_pids)
            pooled = list(loader)
            assert len(pooled) == len(inline) == 12
            for a, b in zip(inline, pooled, strict=True):
                assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
                assert torch.equal(a.x, b.x)
            loader.set_epoch(1)
            it = iter(loader)
            next(it)
            os.kill(loader.worker_pids[1], signal.SIGKILL)  # a worker this test started
            # named on the job's machine (it said the host name, "on vm")
            with pytest.raises(JobFailed, match=r"sampler:0:1 on m1 failed \(exit code -9\)"):
                for _ in it:
                    pass


def test_link_loader(served) -> None:
    g = served.graph
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        for mode in ("uniform", "degree"):
            loader = DistLinkDataLoader(
                dg, torch.arange(40), [3], batch_size=20, neg_k=2, neg_mode=mode
            )
            batches = list(loader)
            assert len(batches) == 2
            b = batches[0]
            assert b.edge_label.tolist() == [1.0] * 20 + [0.0] * 40
            pos = b.edge_label_index[:, :20]
            s = served.orig_nodes(b.n_id[pos[0]])
            d = served.orig_nodes(b.n_id[pos[1]])
            e = served.orig_edges(np.arange(20))
            assert np.array_equal(s, g.src[e]) and np.array_equal(d, g.dst[e])
            assert torch.equal(b.edge_label_index[0, 20:], pos[0].repeat_interleave(2))


def test_link_batches_never_carry_held_out_or_target_edges(served) -> None:
    from graphrun.sampling.edgesplit import TRAIN, EdgeSplit, pair_key

    split = EdgeSplit(val=0.2, test=0.2, seed=1)
    n = served.graph.num_nodes
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        eids = torch.arange(dg.num_edges())
        # without the split, sampled edges include held-out ones and the targets themselves
        seen = {"held_out": 0, "targets": 0}
        for es in (None, split):
            for b in DistLinkDataLoader(dg, eids, [8, 4], batch_size=64, edge_split=es):
                src, dst = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
                held = int((split.of(src, dst) != TRAIN).sum())
                pos = b.edge_label_index[:, b.edge_label > 0]
                targets = pair_key(b.n_id[pos[0]], b.n_id[pos[1]], n)
                hits = int(torch.isin(pair_key(src, dst, n), targets).sum())
                if es is None:
                    seen["held_out"] += held
                    seen["targets"] += hits
                else:
                    assert held == 0 and hits == 0
                    assert sum(b.num_sampled_edges) == b.edge_index.shape[1]
        assert seen["held_out"] > 0 and seen["targets"] > 0  # the check can fail


def test_hetero_loader(served_hetero) -> None:
    with initialize(served_hetero.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        assert dg.is_hetero and dg.num_nodes("paper") == 100
        fan = [{"writes": 3, "cites": 2, "follows": 0}, {"writes": 1, "cites": 1, "follows": 2}]
        loader = DistNodeDataLoader(dg, torch.arange(30), fan, batch_size=10, ntype="paper")
        b = next(iter(loader))
        assert b["paper"].batch_size == 10 and b["paper"].x.shape[0] == b["paper"].num_nodes
        assert b["paper"].y.shape[0] == b["paper"].num_nodes
        assert b["author", "follows", "author"].num_sampled_edges[0] == 0
        conv = HeteroConv({et: SAGEConv((-1, -1), 8) for et in b.edge_types}, aggr="sum")
        assert conv(b.x_dict, b.edge_index_dict)["paper"].shape[0] == b["paper"].num_nodes
        link = DistLinkDataLoader(dg, torch.arange(10), fan, batch_size=5, etype="writes")
        lb = next(iter(link))
        li = lb["author", "writes", "paper"].edge_label_index
        assert li.shape == (2, 10) and int(li[0].max()) < lb["author"].num_nodes
        assert int(li[1].max()) < lb["paper"].num_nodes
        # the positives are the edges asked for, through the per-type ids
        src, dst = dg.find_edges(torch.arange(5), etype="writes")
        assert torch.equal(lb["author"].n_id[li[0, :5]], src)
        assert torch.equal(lb["paper"].n_id[li[1, :5]], dst)
        with pytest.raises(ArgumentError, match="ntype"):
            DistNodeDataLoader(dg, torch.arange(3), [2], batch_size=2)
        with pytest.raises(ArgumentError, match="unknown edge type"):
            DistNodeDataLoader(dg, torch.arange(3), [{"nope": 1}], batch_size=2, ntype="paper")


def test_bad_loader_arguments(served) -> None:
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        with pytest.raises(ArgumentError, match="2 layers given but the model has 3"):
            DistNodeDataLoader(dg, torch.arange(3), [2, 2], batch_size=2, num_layers=3)
        with pytest.raises(ArgumentError, match="batch_size"):
            DistNodeDataLoader(dg, torch.arange(3), [2], batch_size=0)
        with pytest.raises(ArgumentError, match=r"fanouts\[0\]: must be >= 0 or -1"):
            DistNodeDataLoader(dg, torch.arange(3), [-3], batch_size=2)
        with pytest.raises(ArgumentError, match="seeds"):
            next(iter(DistNodeDataLoader(dg, torch.tensor([10**6]), [2], batch_size=2)))
        # the keywords are a BatchSpec's and LoaderOptions' fields: others are named
        with pytest.raises(ArgumentError, match="neg_k: not an argument of the loader"):
            DistNodeDataLoader(dg, torch.arange(3), [2], batch_size=2, neg_k=2)
        with pytest.raises(ArgumentError, match="batch_size: required"):
            DistLinkDataLoader(dg, torch.arange(3), [2])
        with pytest.raises(ArgumentError, match="prefetch_factor: only with num_workers > 0"):
            DistNodeDataLoader(dg, torch.arange(3), [2], batch_size=2, prefetch_factor=2)
        loader = DistNodeDataLoader(dg, torch.arange(3), [2], batch_size=2, x="feat", y="label")
        assert loader.spec.x == "feat" and loader.options.batch_size == 2 and len(loader) == 2


UNGUARDED = """
import sys
import torch
from graphrun.distributed import DistGraph, DistNodeDataLoader, initialize

print("top level ran", flush=True)
ctx = initialize(sys.argv[1:], heartbeat_interval=0)
dg = DistGraph(ctx)
with DistNodeDataLoader(dg, torch.arange(40), [3, 2], batch_size=10, num_workers=1) as loader:
    print("batches", sum(1 for _ in loader), flush=True)
ctx.close()
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_workers_do_not_run_a_script_without_a_main_guard(served, tmp_path) -> None:
    import subprocess
    import sys

    from graphrun.testing.procs import child_env

    script = tmp_path / "train.py"  # like every PyG example: no `if __name__ == "__main__"`
    script.write_text(UNGUARDED)
    out = subprocess.run(
        [sys.executable, str(script), *served.servers],
        capture_output=True, text=True, env=child_env(), timeout=100,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("top level ran") == 1, out.stdout  # not again in the worker
    assert "batches 4" in out.stdout
