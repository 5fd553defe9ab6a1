"""StoreDataset / RemoteData: a served graph that reads like a PyG dataset; store.json."""

import copy
import json

import pytest
import torch

from graphrun.distributed import (
    DistTensor,
    NeighborLoader,
    StoreDataset,
    initialize,
    read_store_file,
    write_store_file,
)
from graphrun.errors import DatasetError


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (None, "no store file"),
        ("{not json", "not a readable JSON store file"),
        ({"version": 2, "servers": ["tcp://a:1"]}, "field 'version' is 2; this graphrun reads"),
        ({"version": 1, "servers": []}, "servers: must name at least one"),
        ({"version": 1, "servers": ["tcp://a:1"], "job": 3}, "job: Expected `str`"),
        ({"version": 1, "servers": ["tcp://a:1"], "keys": 1}, "keys: Expected `str`"),
    ],
)
def test_a_bad_store_file_is_one_line_naming_file_and_field(tmp_path, body, field) -> None:
    if body is not None:
        text = body if isinstance(body, str) else json.dumps(body)
        (tmp_path / "store.json").write_text(text)
    with pytest.raises(DatasetError, match=field) as info:
        read_store_file(tmp_path)
    assert str(tmp_path / "store.json") in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.integration
def test_store_dataset_reads_like_a_pyg_dataset(served, tmp_path) -> None:
    write_store_file(tmp_path, served.servers)
    dataset = StoreDataset(tmp_path, heartbeat_interval=0)
    try:
        g = served.graph
        assert len(dataset) == 1 and dataset.num_features == 8
        assert dataset.num_classes == int(g.ndata["_N"]["label"].max()) + 1
        data = dataset[0]
        assert data.to("cpu", "x", "y") is data and data.num_nodes == g.num_nodes
        assert isinstance(data.x, DistTensor)  # a feature table stays on the store
        mask = data.train_mask
        assert mask.dtype == torch.bool and int(mask.sum()) == int(
            g.ndata["_N"]["train_mask"].sum()
        )
        view = copy.copy(data)
        del view.x, view.y  # the view's loaders stop fetching x and y; data's do not
        loader = NeighborLoader(view, [-1], input_nodes=None, batch_size=100, seed=0)
        batch = next(iter(loader))
        assert "x" not in batch and batch.num_nodes > 100
        full = next(iter(NeighborLoader(data, [2], input_nodes=mask, batch_size=10, seed=0)))
        assert full.x.shape[1] == 8 and full.y.shape == (full.num_nodes,)
        with pytest.raises(AttributeError, match="no node feature 'nope'"):
            _ = data.nope
    finally:
        dataset.close()
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        assert StoreDataset(ctx)[0].num_nodes == served.graph.num_nodes
