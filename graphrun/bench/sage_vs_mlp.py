"""``graphrun bench sage-vs-mlp``: GraphSAGE vs MLP on the synthetic graphs: how much do
neighbours help?

Generates ``graphrun generate community`` data in memory, then trains, in one process
on the whole graph (no sampling):

* a 2-layer MLP on node features alone, and
* a 2-layer GraphSAGE (``torch_geometric.nn.SAGEConv``, mean aggregation; on the
  academic graph made heterogeneous with ``to_hetero``, relations summed),

with the same hidden size, optimiser and epochs, and reports the test accuracy at
the epoch of best validation accuracy. Prints one JSON object.

    graphrun bench sage-vs-mlp --nodes 100000 --avg-degree 20
    graphrun bench sage-vs-mlp --kind academic --nodes 50000

Options not given take the generator's defaults (``graphrun generate community --help``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from typing import Any


def register(subparsers: Any) -> None:
    from graphrun.arguments import add_fields
    from graphrun.graph.generate import GenParams

    p = subparsers.add_parser(
        "sage-vs-mlp",
        help="full-batch GraphSAGE vs MLP on a generated graph",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--kind", choices=("community", "academic"), default="community")
    graph = ("nodes", "avg_degree", "classes", "feat_dim", "homophily", "feat_noise", "seed")
    add_fields(p, GenParams, only=graph, defaults={"nodes": 100_000})
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    import torch

    from graphrun.arguments import from_fields
    from graphrun.bench.fullbatch import models, train
    from graphrun.graph.generate import GenParams, academic, community
    from graphrun.graph.pyg import to_pyg

    torch.set_num_threads(a.threads)
    params = from_fields(GenParams, a)
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
    return 0
