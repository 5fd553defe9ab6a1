import numpy as np
import pytest
import torch
from torch_geometric.nn import GraphSAGE, HeteroConv, SAGEConv
from torch_geometric.utils import trim_to_layer

from graphrun.errors import ArgumentError
from graphrun.sampling import (
    CSCGraph,
    GraphFeatures,
    NegativeSampler,
    NeighborSampler,
    OffsetTypeMap,
    collate,
    make_generator,
)
from graphrun.testing.graphs import random_graph, random_hetero_graph


def homo_sampler(fanouts=(5, 3), **kw):
    g = random_graph()
    return g, NeighborSampler(
        CSCGraph.from_graph(g), OffsetTypeMap.from_graph(g), g.num_nodes, list(fanouts), **kw
    )


def test_hierarchical_layout_and_real_edges() -> None:
    g, sampler = homo_sampler(generator=0)
    seeds = torch.tensor([5, 17, 42, 99])
    sub = sampler.sample(seeds)
    assert torch.equal(sub.node[:4], seeds)
    assert sub.num_sampled_nodes[0] == 4 and len(sub.num_sampled_nodes) == 3
    assert sum(sub.num_sampled_nodes) == sub.node.numel()
    assert torch.unique(sub.node).numel() == sub.node.numel()
    assert sum(sub.num_sampled_edges) == sub.edge.numel()
    # every edge is a real edge: src -> dst through the global ids
    src, dst = torch.from_numpy(g.src), torch.from_numpy(g.dst)
    assert torch.equal(src[sub.edge], sub.node[sub.row])
    assert torch.equal(dst[sub.edge], sub.node[sub.col])
    # layer h edges point at layer h-1 nodes, their sources are at most layer h
    bounds = torch.cumsum(torch.tensor([0, *sub.num_sampled_nodes]), 0)
    for h in (1, 2):
        sl = sub.layer_edges(h)
        assert (sub.col[sl] >= bounds[h - 1]).all() and (sub.col[sl] < bounds[h]).all()
        assert (sub.row[sl] < bounds[h + 1]).all()
        # fanout respected per destination, no duplicate edges
        per_dst = torch.bincount(sub.col[sl])
        assert per_dst.max() <= (5 if h == 1 else 3)
    assert torch.unique(sub.edge[sub.layer_edges(1)]).numel() == sub.num_sampled_edges[0]


def test_data_works_with_trim_to_layer_and_graphsage() -> None:
    g, sampler = homo_sampler(generator=1)
    data = collate(sampler.sample(torch.arange(10, 30)), sampler.types, GraphFeatures(g))
    assert data.batch_size == 20
    assert data.x.shape == (data.num_nodes, 8)
    assert torch.equal(data.y, torch.from_numpy(g.ndata["_N"]["label"])[data.n_id])
    assert data.e_id.numel() == data.edge_index.shape[1]
    x, ei, _ = trim_to_layer(
        1, data.num_sampled_nodes, data.num_sampled_edges, data.x, data.edge_index
    )
    assert x.shape[0] == data.num_nodes - data.num_sampled_nodes[-1]
    assert ei.shape[1] == data.num_sampled_edges[0]
    assert int(ei.max()) < x.shape[0]
    model = GraphSAGE(8, 16, num_layers=2, out_channels=4)
    out = model(
        data.x,
        data.edge_index,
        num_sampled_nodes_per_hop=data.num_sampled_nodes,
        num_sampled_edges_per_hop=data.num_sampled_edges,
    )
    full = model(data.x, data.edge_index)
    assert out.shape[0] >= data.batch_size
    assert torch.allclose(out[: data.batch_size], full[: data.batch_size], atol=1e-5)


def test_hetero_per_type_fanouts() -> None:
    g = random_hetero_graph()
    types = OffsetTypeMap.from_graph(g)
    fanouts = [{"writes": 4, "cites": 2, "follows": 0}, {"writes": 1, "cites": 1, "follows": 3}]
    sampler = NeighborSampler(CSCGraph.from_graph(g), types, g.num_nodes, fanouts, generator=0)
    seeds = torch.arange(60, 80)  # papers
    sub = sampler.sample(seeds)
    src, dst = torch.from_numpy(g.src), torch.from_numpy(g.dst)
    assert torch.equal(src[sub.edge], sub.node[sub.row])
    assert torch.equal(dst[sub.edge], sub.node[sub.col])
    et = torch.from_numpy(g.edge_type_ids()).long()
    assert sub.edge_type is not None and torch.equal(sub.edge_type.long(), et[sub.edge])
    indeg = {r: torch.bincount(dst[et == r], minlength=g.num_nodes) for r in range(3)}
    for h, fan in ((1, (4, 2, 0)), (2, (1, 1, 3))):
        sl = sub.layer_edges(h)
        for r in range(3):
            cols = sub.col[sl][sub.edge_type[sl] == r]
            n = torch.bincount(cols, minlength=sub.node.numel())
            frontier = torch.arange(
                sum(sub.num_sampled_nodes[: h - 1]), sum(sub.num_sampled_nodes[:h])
            )
            expect = torch.minimum(indeg[r][sub.node[frontier]], torch.tensor(fan[r]))
            assert torch.equal(n[frontier], expect), (h, r)

    data = collate(sub, types, GraphFeatures(g), output="hetero")
    assert data["paper"].batch_size == 20
    assert data["paper"].x.shape[0] == data["paper"].num_nodes
    assert torch.equal(data["paper"].n_id[:20], seeds - 60)
    assert sum(data["paper"].num_sampled_nodes) == data["paper"].num_nodes
    assert data["author", "follows", "author"].num_sampled_edges[0] == 0
    conv = HeteroConv({et: SAGEConv((-1, -1), 16) for et in data.edge_types}, aggr="sum")
    out = conv(data.x_dict, data.edge_index_dict)
    assert out["paper"].shape == (data["paper"].num_nodes, 16)
    nodes, edges = data.num_sampled_nodes_dict, data.num_sampled_edges_dict
    x, _, _ = trim_to_layer(1, nodes, edges, data.x_dict, data.edge_index_dict)
    assert x["paper"].shape[0] == data["paper"].num_nodes - data["paper"].num_sampled_nodes[-1]

    typed = collate(sub, types, GraphFeatures(g), output="typed")
    assert typed.node_type.numel() == typed.num_nodes
    assert typed.x.shape == (typed.num_nodes, 8)


def test_same_fanout_on_a_heterograph_applies_per_type() -> None:
    g = random_hetero_graph()
    types = OffsetTypeMap.from_graph(g)
    sampler = NeighborSampler(CSCGraph.from_graph(g), types, g.num_nodes, [2], generator=0)
    sub = sampler.sample(torch.arange(60, 160))
    per = torch.bincount(sub.col * 3 + sub.edge_type.long(), minlength=300).view(100, 3)
    assert per.max() <= 2 and per[:, 0].sum() > 0 and per[:, 1].sum() > 0


def test_minus_one_takes_every_neighbour() -> None:
    # the job spec documents fanout -1 as "takes all"; the samplers refused it
    g, sampler = homo_sampler([-1], generator=0)
    seeds = torch.arange(40)
    sub = sampler.sample(seeds)
    want = int(np.isin(g.dst, seeds.numpy()).sum())
    assert sub.edge.numel() == want


@pytest.mark.parametrize(
    ("fanouts", "kw", "match"),
    [
        ([], {}, "fanouts: empty"),
        ([5, -2], {}, r"fanouts\[1\]: must be >= 0 or -1"),
        ([5, 2.5], {}, r"fanouts\[1\]: expected an int"),
        ([{"nope": 3}], {}, "unknown edge type 'nope'"),
        ([5, 3], {"num_layers": 3}, "2 layers given but the model has 3"),
    ],
)
def test_bad_fanouts(fanouts, kw, match) -> None:
    with pytest.raises(ArgumentError, match=match):
        homo_sampler(fanouts, **kw)


def test_bad_seeds() -> None:
    _, sampler = homo_sampler()
    with pytest.raises(ArgumentError, match=r"seeds\[2\] = 200 is out of range \[0, 200\)"):
        sampler.sample([1, 2, 200])


def test_negative_sampling() -> None:
    gen = make_generator(0)
    neg = NegativeSampler(50, k=3)
    s, d = neg.sample(torch.tensor([1, 2]), gen)
    assert s.tolist() == [1, 1, 1, 2, 2, 2] and d.numel() == 6 and int(d.max()) < 50
    deg = torch.zeros(50)
    deg[[3, 7]] = torch.tensor([1.0, 3.0])
    byd = NegativeSampler(50, mode="degree", degrees=deg, power=1.0)
    d = byd.draw(4000, gen)
    assert set(d.unique().tolist()) == {3, 7}
    assert 0.2 < float((d == 3).float().mean()) < 0.3
    with pytest.raises(ArgumentError, match="k"):
        NegativeSampler(5, k=0)
    with pytest.raises(ArgumentError, match="degrees"):
        NegativeSampler(5, mode="degree")


def test_data_edge_index_is_the_samplers_own_pair_without_a_copy() -> None:
    from dataclasses import replace

    g, sampler = homo_sampler(generator=0)
    sub = sampler.sample(torch.tensor([5, 17, 42, 99]))
    data = collate(sub, OffsetTypeMap.from_graph(g), GraphFeatures(g))
    assert torch.equal(data.edge_index, torch.stack([sub.row, sub.col]))
    assert data.edge_index.data_ptr() == sub.row.data_ptr()  # the same memory
    moved = replace(sub, col=sub.col.clone())  # rows of different tensors: stacked
    assert torch.equal(moved.edge_index(), data.edge_index)
    assert moved.edge_index().data_ptr() != sub.row.data_ptr()


@pytest.mark.parametrize("compiled", ["", "1"])
def test_without_edge_ids_samples_the_same_edges(
    compiled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAPHRUN_COMPILED", compiled)
    csc = CSCGraph.from_graph(random_graph())
    seeds = np.arange(0, 200, 2)
    full = csc.sample_one_hop(seeds, [4], seed=9)
    bare = csc.without_edge_ids().sample_one_hop(seeds, [4], seed=9)
    assert np.array_equal(bare.src, full.src)
    assert np.array_equal(bare.seed_index, full.seed_index)
    assert (bare.eid == -1).all() and len(bare.eid) == len(full.eid) > 0
    assert (full.eid >= 0).all()  # the block itself still gathers them
    assert np.array_equal(csc.sample_one_hop(seeds, [4], seed=9).eid, full.eid)


def test_local_node_batches_carry_no_edge_ids() -> None:
    from graphrun.train.data import LocalData

    g = random_graph(500, 4000, 8, seed=3)
    data = LocalData(g)
    got = next(data.loader("train", None, [5, 3], 64, True, 0))
    d = got.data
    assert "e_id" not in d and d.edge_index.size(1) == sum(d.num_sampled_edges) > 0
    # the same edges as the sampler with edge ids: every one of them real
    sampler = data._sampler([5, 3], 0)
    order = data._order(data.seeds("train", None), True, 0)
    sub = sampler.sample(order[:64])
    assert torch.equal(sub.edge_index(), d.edge_index) and torch.equal(sub.node, d.n_id)
    src, dst = torch.from_numpy(g.src), torch.from_numpy(g.dst)
    assert torch.equal(src[sub.edge], sub.node[sub.row])
    assert torch.equal(dst[sub.edge], sub.node[sub.col])
