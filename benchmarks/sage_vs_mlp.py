"""GraphSAGE vs MLP on the synthetic community graph: how much do neighbours help?

Generates ``graphrun generate community`` data in memory, then trains, in one process
on the whole graph (no sampling):

* a 2-layer MLP on node features alone, and
* a 2-layer GraphSAGE (``torch_geometric.nn.SAGEConv``, mean aggregation),

with the same hidden size, optimiser and epochs, and reports the test accuracy at
the epoch of best validation accuracy. Prints one JSON object.

    python benchmarks/sage_vs_mlp.py --nodes 100000 --avg-degree 20

Options not given take the generator's defaults (``graphrun generate community --help``).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv

from graphrun.graph.generate import GenParams, community
from graphrun.graph.pyg import to_pyg


class MLP(torch.nn.Module):
    def __init__(self, d_in: int, hidden: int, d_out: int, dropout: float) -> None:
        super().__init__()
        self.lin1 = torch.nn.Linear(d_in, hidden)
        self.lin2 = torch.nn.Linear(hidden, d_out)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(F.relu(self.lin1(x)), self.dropout, self.training)
        return self.lin2(x)


class SAGE(torch.nn.Module):
    def __init__(self, d_in: int, hidden: int, d_out: int, dropout: float) -> None:
        super().__init__()
        self.conv1 = SAGEConv(d_in, hidden)
        self.conv2 = SAGEConv(hidden, d_out)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(F.relu(self.conv1(x, edge_index)), self.dropout, self.training)
        return self.conv2(x, edge_index)


def train(model: torch.nn.Module, data: Any, epochs: int, lr: float) -> dict[str, float]:
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
    best_val, test_at_best, t0 = -1.0, 0.0, time.perf_counter()
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        out = model(data.x, data.edge_index)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index).argmax(-1)
        val = (pred[data.val_mask] == data.y[data.val_mask]).float().mean().item()
        if val > best_val:
            best_val = val
            test_at_best = (pred[data.test_mask] == data.y[data.test_mask]).float().mean().item()
    return {
        "val": round(best_val, 4),
        "test": round(test_at_best, 4),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    d = GenParams()
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
    torch.manual_seed(a.seed)
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
    graph = community(params)
    gen_s = time.perf_counter() - t0
    data = to_pyg(graph)
    result: dict[str, Any] = {
        "bench": "sage_vs_mlp",
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
    for label, cls in (("mlp", MLP), ("sage", SAGE)):
        torch.manual_seed(a.seed)
        model = cls(a.feat_dim, a.hidden, a.classes, a.dropout)
        for k, v in train(model, data, a.epochs, a.lr).items():
            result[f"{label}_{k}"] = v
    result["gap_points"] = round(100 * (result["sage_test"] - result["mlp_test"]), 1)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
