"""Models on hand-made mini-batches: trimming, the csr path, hetero and link models."""

from __future__ import annotations

import torch

from graphrun.train.models import SAGE, HeteroSAGE, LinkPredictor


def mfg() -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    # 2 seeds, 3 hop-1 nodes, 2 hop-2 nodes; edges of hop 1 (into seeds) first
    x = torch.randn(7, 4)
    hop1 = torch.tensor([[2, 3, 4, 2], [0, 0, 1, 1]])
    hop2 = torch.tensor([[5, 6, 5], [2, 3, 4]])
    return x, torch.cat([hop1, hop2], 1), [2, 3, 2], [4, 3]


def test_sage_trimmed_equals_untrimmed_on_the_seeds():
    torch.manual_seed(0)
    x, ei, nodes, edges = mfg()
    model = SAGE(4, 8, 3, num_layers=2, dropout=0.0).eval()
    full = model(x, ei)[:2]
    trimmed = model(x, ei, nodes, edges)[:2]
    assert torch.allclose(full, trimmed, atol=1e-6)


def test_csr_path_matches_scatter():
    torch.manual_seed(0)
    x, ei, nodes, edges = mfg()
    a = SAGE(4, 8, 3, 2, 0.0, "scatter").eval()
    b = SAGE(4, 8, 3, 2, 0.0, "csr").eval()
    b.load_state_dict(a.state_dict())
    assert torch.allclose(a(x, ei, nodes, edges)[:2], b(x, ei, nodes, edges)[:2], atol=1e-5)


def test_hetero_model_outputs_target_rows():
    torch.manual_seed(0)
    et = ("author", "writes", "paper")
    model = HeteroSAGE({"paper": 4, "author": 3}, [et], 8, 5, 1, "paper", 0.0)
    x = {"paper": torch.randn(2, 4), "author": torch.randn(3, 3)}
    out = model(x, {et: torch.tensor([[0, 1, 2], [0, 0, 1]])})
    assert out.shape == (2, 5)


def test_link_predictor_scores_pairs():
    x, ei, nodes, edges = mfg()
    scores = LinkPredictor(4, 8, 2)(x, ei, torch.tensor([[0, 1], [1, 0]]), nodes, edges)
    assert scores.shape == (2,)
