"""Layer-wise full-neighbour inference equals the model on sampled neighbourhoods with
every fanout -1, in one process (LocalData)."""

from __future__ import annotations

import pytest
import torch

from graphrun.graph.generate import GenParams, community
from graphrun.train import inference
from graphrun.train.data import LocalData
from graphrun.train.models import GAT, GCN, SAGE


@pytest.fixture(scope="module")
def graph():
    return community(GenParams(nodes=1500, avg_degree=12, feat_dim=8, classes=4, seed=1))


def sampled_logits(model, data, seeds_split, layers):
    """The model's outputs on the loader's mini-batches with every neighbour (fanout -1)."""
    out = []
    for batch in data.loader(seeds_split, None, [-1] * layers, 128, False, 0):
        d = batch.data
        out.append(model(d.x.float(), d.edge_index, d.num_sampled_nodes, d.num_sampled_edges))
        out[-1] = out[-1][: int(d.batch_size)]
    return torch.cat(out)


@pytest.mark.parametrize("make", [SAGE, GAT])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_layerwise_equals_full_fanout_sampling(graph, make, layers) -> None:
    torch.manual_seed(0)
    model = make(8, 16, 4, layers, 0.5).eval()
    data = LocalData(graph)
    want = sampled_logits(model, data, "test", layers)
    got = inference.layerwise(model, data, "_N", "feat", data.cover("test"), 100, sync=lambda: None)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_partial_neighbourhoods_would_differ(graph) -> None:
    # the comparison above can fail: sampling with a fanout below the degrees gives
    # different logits
    torch.manual_seed(0)
    model = SAGE(8, 16, 4, 2, 0.5).eval()
    data = LocalData(graph)
    full = sampled_logits(model, data, "test", 2)
    part = []
    for batch in data.loader("test", None, [2, 2], 128, False, 0):
        d = batch.data
        logits = model(d.x.float(), d.edge_index, d.num_sampled_nodes, d.num_sampled_edges)
        part.append(logits[: int(d.batch_size)])
    assert not torch.allclose(torch.cat(part), full, atol=1e-3)


def test_supports() -> None:
    data = LocalData(community(GenParams(nodes=100, avg_degree=4, feat_dim=4, classes=2)))
    assert inference.supports(SAGE(4, 8, 2, 2), data)
    assert not inference.supports(GCN(4, 8, 2, 2), data)  # GCN normalises by both degrees


@pytest.mark.parametrize(("precision", "tol"), [("fp32", 2e-5), ("bf16", 0.05)])
def test_sage_reads_a_local_table_directly_and_equals_full_fanout_sampling(
    graph, precision, tol, monkeypatch
) -> None:
    torch.manual_seed(0)
    model = SAGE(8, 16, 4, 2, 0.5, "csr", precision).eval()
    data = LocalData(graph)
    want = sampled_logits(model, data, "test", 2)
    copied = []
    gather = inference.gather
    monkeypatch.setattr(inference, "gather", lambda *a: copied.append(1) or gather(*a))
    got = inference.layerwise(model, data, "_N", "feat", data.cover("test"), 100, lambda: None)
    assert not copied  # every batch read the table by id, no rows copied out
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_a_store_table_keeps_the_copy() -> None:
    class Remote:  # rows fetched by id, as a DistTensor
        def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
            return torch.zeros(ids.numel(), 2)

    assert inference.local_rows(Remote()) is None
    assert inference.local_rows(torch.zeros(3, 2, dtype=torch.float64)) is None
    table = torch.zeros(3, 2)
    assert inference.local_rows(table) is table
