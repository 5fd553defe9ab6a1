"""Full-batch MLP and GraphSAGE models for ``graphrun bench sage-vs-mlp`` (torch at import)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv, to_hetero


class MLP(torch.nn.Module):
    def __init__(self, hidden: int, d_out: int, dropout: float) -> None:
        super().__init__()
        self.lin1 = torch.nn.LazyLinear(hidden)
        self.lin2 = torch.nn.Linear(hidden, d_out)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.dropout(F.relu(self.lin1(x)), self.dropout, self.training)
        return self.lin2(x)


class SAGE(torch.nn.Module):
    def __init__(self, hidden: int, d_out: int, dropout: float) -> None:
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), hidden)
        self.conv2 = SAGEConv((-1, -1), d_out)
        self.drop = torch.nn.Dropout(dropout)  # a module, so to_hetero keeps train/eval

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = self.drop(F.relu(self.conv1(x, edge_index)))
        return self.conv2(x, edge_index)


def train(
    model: torch.nn.Module, logits: Callable[[], torch.Tensor], target: Any, epochs: int, lr: float
) -> dict[str, float]:
    """Full-batch training; ``logits()`` scores the target nodes; test acc at best val."""
    y = target.y
    with torch.no_grad():
        logits()  # materialise lazy parameters before the optimiser sees them
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
    best_val, test_at_best, t0 = -1.0, 0.0, time.perf_counter()
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        F.cross_entropy(logits()[target.train_mask], y[target.train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = logits().argmax(-1)
        val = (pred[target.val_mask] == y[target.val_mask]).float().mean().item()
        if val > best_val:
            best_val = val
            test_at_best = (pred[target.test_mask] == y[target.test_mask]).float().mean().item()
    return {
        "val": round(best_val, 4),
        "test": round(test_at_best, 4),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def models(kind: str, data: Any, a: argparse.Namespace) -> list[tuple[str, Any, Any, Any]]:
    """``(name, model, logits_fn, target_store)`` for the MLP and the GraphSAGE."""
    if kind == "community":
        mlp = MLP(a.hidden, a.classes, a.dropout)
        sage = SAGE(a.hidden, a.classes, a.dropout)
        return [
            ("mlp", mlp, lambda: mlp(data.x), data),
            ("sage", sage, lambda: sage(data.x, data.edge_index), data),
        ]
    paper = data["paper"]
    mlp = MLP(a.hidden, a.classes, a.dropout)
    hetero = to_hetero(SAGE(a.hidden, a.classes, a.dropout), data.metadata(), aggr="sum")
    return [
        ("mlp", mlp, lambda: mlp(paper.x), paper),
        ("sage", hetero, lambda: hetero(data.x_dict, data.edge_index_dict)["paper"], paper),
    ]
