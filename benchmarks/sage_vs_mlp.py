"""GraphSAGE vs MLP on the synthetic graphs: how much do neighbours help?

Generates ``graphrun generate community`` data in memory, then trains, in one process
on the whole graph (no sampling):

* a 2-layer MLP on node features alone, and
* a 2-layer GraphSAGE (``torch_geometric.nn.SAGEConv``, mean aggregation; on the
  academic graph made heterogeneous with ``to_hetero``, relations summed),

with the same hidden size, optimiser and epochs, and reports the test accuracy at
the epoch of best validation accuracy. Prints one JSON object.

    python benchmarks/sage_vs_mlp.py --nodes 100000 --avg-degree 20
    python benchmarks/sage_vs_mlp.py --kind academic --nodes 50000

Options not given take the generator's defaults (``graphrun generate community --help``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv, to_hetero

from graphrun.graph.generate import GenParams, academic, community
from graphrun.graph.pyg import to_pyg


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

    def forward(self, x: Any, edge_index: Any) -> Any:
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


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    d = GenParams()
    p.add_argument("--kind", choices=("community", "academic"), default="community")
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--avg-degree", type=float, default=d.avg_degree)
    p.add_argument("--classes", type=int, default=d.classes)
    p.add_argument("--feat-dim", type=int, default=d.feat_dim)
    p.add_argument("--homophily", type=float, default=d.homophily)
    p.add_argument("--feat-noise", type=float, default=d.feat_noise)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    params = GenParams(
        nodes=a.nodes,
        avg_degree=a.avg_degree,
        classes=a.classes,
        feat_dim=a.feat_dim,
        homophily=a.homophily,
        feat_noise=a.feat_noise,
        seed=a.seed,
    )
    t0 = time.perf_counter()
    graph = community(params) if a.kind == "community" else academic(params)
    gen_s = time.perf_counter() - t0
    data = to_pyg(graph)
    result: dict[str, Any] = {
        "bench": "sage_vs_mlp",
        "kind": a.kind,
        "nodes": graph.num_nodes,
        "edges": graph.num_edges,
        "classes": a.classes,
        "feat_dim": a.feat_dim,
        "homophily": a.homophily,
        "feat_noise": a.feat_noise,
        "avg_degree": a.avg_degree,
        "epochs": a.epochs,
        "hidden": a.hidden,
        "generate_seconds": round(gen_s, 1),
    }
    torch.manual_seed(a.seed)
    for label, model, logits, target in models(a.kind, data, a):
        for k, v in train(model, logits, target, a.epochs, a.lr).items():
            result[f"{label}_{k}"] = v
    result["gap_points"] = round(100 * (result["sage_test"] - result["mlp_test"]), 1)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    result["load1"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
