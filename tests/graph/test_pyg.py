import numpy as np
import pytest
import torch
from torch_geometric.data import Data, HeteroData

from graphrun.errors import DatasetError
from graphrun.graph import load_dataset, save_dataset
from graphrun.graph.generate import GenParams, academic, community
from graphrun.graph.pyg import from_pyg, to_pyg


def assert_same_graph(a, b) -> None:
    assert a.num_nodes == b.num_nodes and a.node_types == b.node_types
    assert a.edge_types == b.edge_types
    assert (a.src == b.src).all() and (a.dst == b.dst).all()
    assert (a.node_type_offsets == b.node_type_offsets).all()
    assert (a.edge_type_offsets == b.edge_type_offsets).all()
    for side_a, side_b in ((a.ndata, b.ndata), (a.edata, b.edata)):
        assert side_a.keys() == side_b.keys()
        for t in side_a:
            assert side_a[t].keys() == side_b[t].keys()
            for k in side_a[t]:
                assert side_a[t][k].dtype == side_b[t][k].dtype
                assert np.array_equal(side_a[t][k], side_b[t][k]), (t, k)


def test_homogeneous_round_trip() -> None:
    g = community(GenParams(nodes=400, avg_degree=6, feat_dim=3, seed=2))
    data = to_pyg(g)
    assert isinstance(data, Data)
    assert data.x.shape == (400, 3) and data.y.dtype == torch.int64
    assert data.train_mask.dtype == torch.bool
    assert_same_graph(from_pyg(data), g)


def test_hetero_round_trip_through_pyg_and_disk(tmp_path) -> None:
    g = academic(GenParams(nodes=600, avg_degree=6, feat_dim=4, seed=3))
    data = to_pyg(g)
    assert isinstance(data, HeteroData)
    assert data["paper"].x.shape[0] == g.num_nodes_of("paper")
    ei = data["author", "writes", "paper"].edge_index
    assert int(ei[0].max()) < g.num_nodes_of("author")  # per-type ids
    h = from_pyg(data)
    assert_same_graph(h, g)
    save_dataset(h, tmp_path / "ds")
    again = to_pyg(load_dataset(tmp_path / "ds"))  # memory-mapped arrays convert too
    assert torch.equal(again["paper"].y, data["paper"].y)
    assert torch.equal(
        again["paper", "cites", "paper"].edge_index, data["paper", "cites", "paper"].edge_index
    )


def test_pyg_objects_round_trip() -> None:
    data = HeteroData()
    data["a"].x = torch.randn(3, 2)
    data["b"].num_nodes = 2
    data["b"].year = torch.tensor([2001, 2002])
    data["a", "r", "b"].edge_index = torch.tensor([[0, 2], [1, 0]])
    data["a", "r", "b"].edge_attr = torch.tensor([[1.0], [2.0]])
    back = to_pyg(from_pyg(data))
    assert torch.equal(back["a"].x, data["a"].x)
    assert torch.equal(back["b"].year, data["b"].year)
    assert torch.equal(back["a", "r", "b"].edge_index, data["a", "r", "b"].edge_index)
    assert torch.equal(back["a", "r", "b"].edge_attr, data["a", "r", "b"].edge_attr)
    d = Data(x=torch.randn(4, 2), edge_index=torch.tensor([[0, 1], [1, 3]]), y=torch.arange(4))
    b2 = to_pyg(from_pyg(d))
    assert torch.equal(b2.x, d.x) and torch.equal(b2.y, d.y)
    assert torch.equal(b2.edge_index, d.edge_index)


def test_bad_pyg_input() -> None:
    with pytest.raises(DatasetError, match="edge_index: target id 9"):
        from_pyg(Data(x=torch.randn(3, 1), edge_index=torch.tensor([[0], [9]])))
    with pytest.raises(DatasetError, match="expected a torch_geometric"):
        from_pyg({"x": 1})
