"""Baselines trained in one process on a whole in-memory graph."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from graphrun.graph import Graph
from graphrun.train.models import MLP


def mlp_baseline(
    graph: Graph, epochs: int = 50, hidden: int = 128, lr: float = 0.01, seed: int = 0
) -> float:
    """Test accuracy of an MLP on node features alone (best validation epoch)."""
    torch.manual_seed(seed)
    nt = graph.node_types[0]
    nd = graph.ndata[nt]
    x = torch.from_numpy(np.asarray(nd["feat"], dtype=np.float32))
    y = torch.from_numpy(np.asarray(nd["label"]).astype(np.int64))
    masks = {s: torch.from_numpy(np.asarray(nd[f"{s}_mask"])) for s in ("train", "val", "test")}
    model = MLP(x.size(1), hidden, int(y.max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    best_val, test_at_best = -1.0, 0.0
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(x[masks["train"]]), y[masks["train"]]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(x).argmax(-1)
        acc = {s: float((pred[m] == y[m]).float().mean()) for s, m in masks.items()}
        if acc["val"] > best_val:
            best_val, test_at_best = acc["val"], acc["test"]
    return test_at_best
