"""DistDGL's names on graphrun: a DistDGL script's calls, with the current context."""

import numpy as np
import pytest
import torch
from torch_geometric.nn import SAGEConv

import graphrun.distributed as gd
from graphrun.errors import ArgumentError

pytestmark = pytest.mark.integration


def test_distdgl_calls_find_the_current_context(served) -> None:
    with pytest.raises(ArgumentError, match="no graphrun context"):
        gd.current_context()
    with gd.initialize(served.servers, heartbeat_interval=0) as ctx:
        assert gd.current_context() is ctx
        g = gd.DistGraph("random", part_config="unused.json")
        assert g.ctx is ctx and g.rank() == 0
        g.barrier()  # one trainer: nothing to wait for
        pb = g.get_partition_book()
        n = g.num_nodes()
        assert np.array_equal(pb.partid2nids(1).numpy(), np.arange(*pb.owned_nodes(1)))
        assert len(pb.partid2nids(0)) + len(pb.partid2nids(1)) == n
        mask = g.ndata["train_mask"]
        train = gd.node_split(mask, pb, force_even=True)
        assert torch.equal(train, gd.node_split(g.mask_ids("train_mask"), pb, 0, 1))
        assert torch.equal(gd.node_split(mask), train)  # the book from the mask's client
        assert gd.edge_split(torch.arange(10)).tolist() == list(range(10))

        feat = g.ndata["feat"]
        assert feat.device == torch.device("cpu") and feat.dtype == torch.float32
        assert feat.shape == (n, 8) and feat.size(1) == 8 and feat.ndim == 2

        h = gd.DistTensor((n, 4), torch.float32, "h", lambda shape, dtype: torch.ones(shape))
        assert h.policy == "node:_N" and h.dtype == torch.float32
        assert torch.equal(h[torch.tensor([0, n - 1])], torch.ones(2, 4))
        with pytest.raises(ArgumentError, match="needs a name"):
            gd.DistTensor((n, 4), torch.float32)
        emb = gd.DistEmbedding(n, 3, "emb", lambda shape, dtype: torch.full(shape, 0.5))
        assert torch.equal(emb(torch.tensor([1, 2])), torch.full((2, 3), 0.5))
        gd.SparseAdam([emb], lr=0.01)

        ids = train[:40]
        # DistDGL's fanouts run from the input layer to the seeds: graphrun's reversed
        by_object = gd.DistNodeDataLoader(g, ids, gd.NeighborSampler([2, 3]), batch_size=16)
        by_list = gd.DistNodeDataLoader(g, ids, [3, 2], batch_size=16)
        for (inputs, seeds, blocks), b in zip(by_object, by_list, strict=True):
            (a,) = blocks  # DistDGL's triple; the "blocks" are the one PyG batch
            assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
            assert torch.equal(inputs, b.n_id) and torch.equal(seeds, b.n_id[: b.batch_size])
        assert pb.partid == ctx.partition and pb.num_partitions() == 2
        assert torch.equal(pb.partid2nids(0), torch.from_numpy(pb.book.partid2nids(0)))
        assert gd.DistEdgeDataLoader is gd.DistLinkDataLoader
    with pytest.raises(ArgumentError, match="no graphrun context"):
        gd.current_context()


def test_dist_tensor_is_the_input_of_a_pyg_layer_wise_inference_loop(served) -> None:
    """PyG's reddit.py ``inference``: ``x_all[batch.n_id.to(x_all.device)]``, layer by layer."""
    with gd.initialize(served.servers, heartbeat_interval=0) as ctx:
        g = gd.DistGraph(ctx)
        x_all = g.ndata["feat"]
        fs, gs = gd.remote_backend(ctx)
        loader = gd.NeighborLoader(
            (fs, gs), [-1], input_nodes=torch.arange(g.num_nodes()), batch_size=64
        )
        conv = SAGEConv(8, 4)
        xs = []
        for batch in loader:
            x = x_all[batch.n_id.to(x_all.device)]
            xs.append(conv(x, batch.edge_index)[: batch.batch_size])
        out = torch.cat(xs)
        full = torch.from_numpy(served.graph.ndata["_N"]["feat"])
        orig = served.orig_nodes(np.arange(g.num_nodes()))
        assert torch.allclose(x_all[torch.arange(g.num_nodes())], full[orig])
        assert out.shape == (g.num_nodes(), 4)
