"""PyG's own loaders over graphrun's FeatureStore / GraphStore / sampler: the same
batches as graphrun's loaders, batch for batch, homogeneous and heterogeneous."""

import gc

import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.loader import LinkLoader, LinkNeighborLoader, NeighborLoader, NodeLoader

from graphrun.distributed import DistGraph, DistLinkDataLoader, DistNodeDataLoader, initialize
from graphrun.distributed.minibatch import shuffled
from graphrun.distributed.pyg_remote import RemoteNeighborSampler
from graphrun.distributed.pyg_stores import remote_backend
from graphrun.errors import ArgumentError
from graphrun.testing.jobs import no_children
from graphrun.testing.procs import torch_processes

pytestmark = pytest.mark.integration

SEED = 7


def same(a, b, keys) -> None:
    for k in keys:
        va, vb = a[k], b[k]
        if isinstance(va, torch.Tensor):
            assert torch.equal(va, vb), k
        else:
            assert va == vb, k


NODE_KEYS = ("n_id", "e_id", "edge_index", "x", "y", "num_sampled_nodes", "num_sampled_edges")


def test_neighbor_loader_equals_graphrun_loader_batch_for_batch(served) -> None:
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        ids = dg.mask_ids("train_mask")
        ours = list(DistNodeDataLoader(dg, ids, [3, 2], batch_size=16, shuffle=True, seed=SEED))
        fs, gs = remote_backend(ctx)
        sampler = RemoteNeighborSampler(gs, [3, 2], seed=SEED)
        theirs = list(
            NeighborLoader(
                (fs, gs),
                [3, 2],
                input_nodes=shuffled(ids, SEED, 0),  # graphrun's shuffle, epoch 0
                neighbor_sampler=sampler,
                batch_size=16,
            )
        )
        assert len(ours) == len(theirs) > 2
        for a, b in zip(ours, theirs, strict=True):
            same(a, b, NODE_KEYS)
            assert a.batch_size == b.batch_size
        # NodeLoader with the sampler, a boolean mask as input, and epoch 1
        sampler.set_epoch(1)
        loader = DistNodeDataLoader(dg, ids, [3, 2], batch_size=16, seed=SEED)
        loader.set_epoch(1)
        mask = torch.zeros(dg.num_nodes(), dtype=torch.bool)
        mask[ids] = True
        node_loader = NodeLoader((fs, gs), sampler, input_nodes=mask, batch_size=16)
        for a, b in zip(loader, node_loader, strict=True):
            same(a, b, NODE_KEYS)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_workers_fork_their_own_clients_and_give_the_same_batches(served) -> None:
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        ids = torch.arange(60)
        ours = list(DistNodeDataLoader(dg, ids, [3, 2], batch_size=10, seed=SEED))
        fs, gs = remote_backend(ctx)
        sampler = RemoteNeighborSampler(gs, [3, 2], seed=SEED)
        # two forked workers would share this process's store client; a worker from the
        # fork server (a fresh interpreter that imported torch and PyG once, not this
        # process's copy) has nothing to share, so one shows that it connects by itself
        for mp_ctx, workers in (("fork", 2), (torch_processes(), 1)):
            loader = NeighborLoader(
                (fs, gs), [3, 2], input_nodes=ids, neighbor_sampler=sampler, batch_size=10,
                num_workers=workers, multiprocessing_context=mp_ctx,
            )  # fmt: skip
            for a, b in zip(ours, loader, strict=True):
                same(a, b, NODE_KEYS)
        persistent = NeighborLoader(
            (fs, gs), [3, 2], input_nodes=ids, neighbor_sampler=sampler, batch_size=10,
            num_workers=2, persistent_workers=True, prefetch_factor=1,
        )  # fmt: skip
        for _ in range(2):  # the workers and their store clients serve both epochs
            for a, b in zip(ours, persistent, strict=True):
                same(a, b, NODE_KEYS)
        # torch stops persistent workers when their loader is collected: PyG's loader is
        # in a reference cycle, so not at `del` (the forked workers outlived the test)
        del persistent
        gc.collect()
        no_children(timeout=15)


def test_hetero_neighbor_loader_equals_graphrun_loader(served_hetero) -> None:
    with initialize(served_hetero.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        nt = dg.node_types[0]
        ids = torch.arange(min(40, dg.num_nodes(nt)))
        fanouts = [3, 2]
        ours = list(
            DistNodeDataLoader(dg, ids, fanouts, ntype=nt, batch_size=8, shuffle=True, seed=SEED)
        )
        fs, gs = remote_backend(ctx)
        theirs = list(
            NeighborLoader(
                (fs, gs),
                fanouts,
                input_nodes=(nt, shuffled(ids, SEED, 0)),
                neighbor_sampler=RemoteNeighborSampler(gs, fanouts, seed=SEED),
                batch_size=8,
            )
        )
        assert len(ours) == len(theirs) > 2
        for a, b in zip(ours, theirs, strict=True):
            assert isinstance(b, HeteroData)
            assert a[nt].batch_size == b[nt].batch_size
            for t in dg.node_types:
                same(a[t], b[t], [k for k in ("n_id", "x", "y", "num_sampled_nodes") if k in a[t]])
            for et in dg.edge_types:
                same(a[et], b[et], ("edge_index", "e_id", "num_sampled_edges"))


def test_link_loaders_equal_graphrun_link_loader(served) -> None:
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        eids = torch.arange(60)
        ours = list(DistLinkDataLoader(dg, eids, [3], batch_size=20, neg_k=2, seed=SEED))
        fs, gs = remote_backend(ctx)
        pairs = (dg.edge_types[0], torch.stack(dg.find_edges(eids)))  # PyG wants the type
        sampler = RemoteNeighborSampler(gs, [3], seed=SEED)
        theirs = LinkNeighborLoader(
            (fs, gs), [3], edge_label_index=pairs, neighbor_sampler=sampler,
            neg_sampling_ratio=2, batch_size=20,
        )  # fmt: skip
        plain = LinkLoader((fs, gs), sampler, edge_label_index=pairs, neg_sampling_ratio=2,
                           batch_size=20)  # fmt: skip
        keys = (*NODE_KEYS, "edge_label_index", "edge_label")
        for a, b, c in zip(ours, theirs, plain, strict=True):
            same(a, b, keys)
            same(a, c, keys)


def test_hetero_link_loader_equals_graphrun_link_loader(served_hetero) -> None:
    with initialize(served_hetero.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        et = dg.edge_types[0]
        eids = torch.arange(min(30, dg.num_edges(et)))
        ours = list(DistLinkDataLoader(dg, eids, [3], etype=et, batch_size=10, seed=SEED))
        fs, gs = remote_backend(ctx)
        pairs = torch.stack(dg.find_edges(eids, et))
        theirs = LinkNeighborLoader(
            (fs, gs), [3], edge_label_index=(et, pairs),
            neighbor_sampler=RemoteNeighborSampler(gs, [3], seed=SEED),
            neg_sampling_ratio=1, batch_size=10,
        )  # fmt: skip
        for a, b in zip(ours, theirs, strict=True):
            same(a[et], b[et], ("edge_label_index", "edge_label", "edge_index", "e_id"))
            for t in dg.node_types:
                same(a[t], b[t], ("n_id",))


def test_feature_store_reads_and_the_graph_store_keeps_structure_on_the_servers(served) -> None:
    g = served.graph
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        fs, gs = remote_backend(ctx)
        ids = torch.tensor([5, 1, 9])
        x = fs.get_tensor(None, "x", ids)
        orig = served.orig_nodes(ids)
        assert torch.equal(x, torch.from_numpy(g.ndata["_N"]["feat"][orig]))
        assert torch.equal(fs["_N", "feat", ids], x)  # the store's own name, the type's name
        assert fs.get_tensor_size(None, "x", None)[0] == g.num_nodes
        assert [a.attr_name for a in fs.get_all_tensor_attrs()] == ["x", "y"]
        (attr,) = gs.get_all_edge_attrs()
        assert attr.size == (g.num_nodes, g.num_nodes)
        with pytest.raises(ArgumentError, match="does not copy a whole edge type"):
            gs.coo()
        with pytest.raises(ArgumentError, match="neighbor_sampler=RemoteNeighborSampler"):
            NeighborLoader((fs, gs), [3], input_nodes=ids, batch_size=2)
        with pytest.raises(ArgumentError, match="neg_sampling_ratio"):
            pairs = (attr.edge_type, torch.zeros(2, 4).long())
            sampler = RemoteNeighborSampler(gs, [3])
            list(LinkLoader((fs, gs), sampler, edge_label_index=pairs, neg_sampling_ratio=0.5))
