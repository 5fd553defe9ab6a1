import numpy as np
import pytest
import torch

from graphrun.distributed import DistGraph, initialize
from graphrun.errors import ArgumentError

pytestmark = pytest.mark.integration


def test_dist_graph_matches_the_original(served) -> None:
    g = served.graph
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        assert dg.num_nodes() == g.num_nodes and dg.num_edges() == g.num_edges
        assert dg.partition_book.num_parts == 2 and not dg.is_hetero
        new = torch.arange(g.num_nodes)
        orig = served.orig_nodes(new)
        feat = dg.ndata["feat"][new]
        assert np.array_equal(feat.numpy(), g.ndata["_N"]["feat"][orig])
        assert np.array_equal(
            dg.nodes["_N"].data["label"][new].numpy(), g.ndata["_N"]["label"][orig]
        )
        assert np.array_equal(dg.in_degrees(new).numpy(), g.in_degrees()[orig])
        assert np.array_equal(dg.out_degrees(new).numpy(), g.out_degrees()[orig])
        eids = torch.tensor([0, 5, g.num_edges - 1])
        src, dst = dg.find_edges(eids)
        e = served.orig_edges(eids)
        assert np.array_equal(served.orig_nodes(src), g.src[e])
        assert np.array_equal(served.orig_nodes(dst), g.dst[e])
        train = dg.mask_ids("train_mask")
        assert np.array_equal(
            np.sort(served.orig_nodes(train)), np.flatnonzero(g.ndata["_N"]["train_mask"])
        )
        with pytest.raises(ArgumentError, match="ids"):
            dg.in_degrees([g.num_nodes])
        hop = dg.sample_neighbors(torch.tensor([3, 150]), 2, generator=0)
        e = served.orig_edges(hop.eid)
        assert np.array_equal(served.orig_nodes(hop.src), g.src[e])
        assert np.array_equal(served.orig_nodes(torch.tensor([3, 150])[hop.seed_index]), g.dst[e])
        assert int(np.bincount(hop.seed_index).max()) <= 2
        weighted = dg.sample_neighbors(torch.tensor([3, 150]), 2, weight="w", generator=0)
        assert len(weighted) == len(hop)
        with pytest.raises(ArgumentError, match="fanout"):
            dg.sample_neighbors(torch.tensor([3]), -2)


def test_initialize_validates(served) -> None:
    with pytest.raises(ArgumentError, match="rank"):
        initialize(served.servers, rank=2, world_size=2)
    with pytest.raises(ArgumentError, match="servers"):
        initialize([])
    with initialize(served.servers, rank=1, world_size=2, heartbeat_interval=0) as ctx:
        assert ctx.partition == 1 and ctx.rank == 1
