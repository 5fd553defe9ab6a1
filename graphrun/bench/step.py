"""``graphrun bench step``: one training step of GraphSAGE, model choice by model choice.

The same sampled mini-batches (graphrun's sampler, the PyG layout with per-hop counts)
go through four models, forward + backward + Adam step, one process:

* ``pyg_full`` — PyG's ``GraphSAGE`` on the whole sampled subgraph at every layer (what
  PyG does with its torch-sparse ``NeighborLoader``, which gives no per-hop counts);
* ``pyg_trim`` — PyG's ``GraphSAGE`` with ``trim_to_layer`` (per-hop counts given, as
  with pyg-lib): each layer drops the hops later layers do not read, but still computes
  every node it keeps;
* ``mfg_scatter`` / ``mfg_csr`` — graphrun's ``SAGE``: each layer computes only the
  destinations of its message-flow graph, aggregating by scatter or by one fused
  gather-reduce over the batch's CSR
  (``graphrun.train.models``), with its ``torch.rand`` dropout.

Then the step's roofline (:mod:`graphrun.bench.roofline`): graphrun's model on the
``csr`` path in ``--precision``, phase by phase — sampling, feature fetch, each layer's
aggregation and dense product, backward, Adam, the gradients' all-reduce — each with its
time, flops and bytes, and its rate against this core's matrix-product and memory peaks
measured in the same command. In bf16 its batches are a bf16 trainer's: the fetch brings
their rows in bf16 (``fetch`` and ``aggregate[0]`` count two bytes a feature).

Prints one JSON object: ``step_ms`` (median per variant), ``step_ms_all``, the batch's
``nodes_per_hop`` / ``edges_per_hop``, ``phases`` (one row each: ``phase``, ``ms``,
``gflop``, ``mb``, ``gflops``, ``gbps``, ``bound`` and ``of_peak``; ``sample`` its
``items_per_s``: sampled edges a second; ``aggregate[i]`` and ``aggregate_grad[i]`` (the
mean's backward) also ``gathered_mb``, ``gathered_gbps`` and ``of_gather_peak``),
``peak`` (``fp32_gflops``, ``bf16_gflops``, ``read_gbps``, ``copy_gbps``,
``gather_gbps``), ``precision``, ``torch_threads`` and ``load_avg``. Hidden size,
fanouts and batch size default to the ``graphrun bench train`` configuration.

How the bytes are counted (:mod:`graphrun.bench.roofline`): an aggregation's ``mb`` is
the least it must move — each source row it reads once (in the dtype the layer is handed,
the same count in fp32 and bf16), the CSR, the means — read against the streaming read
(``of_peak``); it reads a row per edge in edge order (``gathered_mb``),
so its real limit is the measured rate of gathering rows at random (``gather_gbps``,
``of_gather_peak``). Both are printed; neither is the other's excuse.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphrun.arguments import integer, integers
from graphrun.bench import MAX_BATCH_SIZE, MAX_FANOUT, MAX_HIDDEN, MAX_LAYERS, MAX_THREADS
from graphrun.errors import ArgumentError

if TYPE_CHECKING:
    import torch

MAX_BATCHES = 100_000
VARIANTS = ("pyg_full", "pyg_trim", "mfg_scatter", "mfg_csr")
Costs = list[tuple[float, float]]  # each batch's (sampling, fetching) seconds


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "step",
        help="one GraphSAGE training step: PyG full / trimmed vs message-flow graphs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dataset", type=Path, required=True, help="any importable dataset")
    p.add_argument("--fanouts", type=integers(0, MAX_FANOUT, MAX_LAYERS), default=[25, 10],
                   help="comma-separated, one per layer")  # fmt: skip
    p.add_argument("--batch-size", type=integer(1, MAX_BATCH_SIZE), default=1000)
    p.add_argument("--hidden", type=integer(1, MAX_HIDDEN), default=128)
    p.add_argument("--batches", type=integer(1, MAX_BATCHES), default=10,
                   help="timed batches (after 2 warm-up)")  # fmt: skip
    p.add_argument("--threads", type=integer(1, MAX_THREADS), default=1,
                   help="torch intra-op threads (default 1)")  # fmt: skip
    p.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="the roofline model's dense products (auto: bf16 where the CPU has it natively)",
    )
    p.add_argument(
        "--no-allreduce", action="store_true", help="leave out the all-reduce phase (2 processes)"
    )
    p.set_defaults(func=run)


def _models(in_dim: int, hidden: int, classes: int, layers: int) -> dict[str, Any]:
    import torch
    from torch_geometric.nn.models import GraphSAGE

    from graphrun.train.models import SAGE

    torch.manual_seed(0)
    pyg = GraphSAGE(in_dim, hidden, layers, classes, dropout=0.5)
    return {
        "pyg_full": pyg,
        "pyg_trim": pyg,
        "mfg_scatter": SAGE(in_dim, hidden, classes, layers, 0.5, "scatter"),
        "mfg_csr": SAGE(in_dim, hidden, classes, layers, 0.5, "csr"),
    }


def _forward(variant: str, model: torch.nn.Module, b: Any) -> torch.Tensor:
    from graphrun.bench.train import pyg_forward

    if variant == "pyg_full":
        return model(b.x, b.edge_index)
    if variant == "pyg_trim":
        return pyg_forward(model, b)  # graphrun's batches carry the per-hop counts
    return model(b.x, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)


def _time_variant(variant: str, model: Any, batches: list[Any]) -> list[float]:
    import torch
    import torch.nn.functional as F

    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    model.train()
    times = []
    for i, b in enumerate(batches):
        t = time.perf_counter()
        opt.zero_grad()
        out = _forward(variant, model, b)[: b.batch_size]
        F.cross_entropy(out, b.y[: b.batch_size]).backward()
        opt.step()
        if i >= 2:  # warm-up
            times.append(time.perf_counter() - t)
    return times


def _batches(
    data: Any, fanouts: list[int], batch_size: int, n: int, x_bf16: bool = False
) -> tuple[list[Any], list[tuple[float, float]]]:
    """``n`` training batches, and each one's (sampling, fetching) seconds; with
    ``x_bf16`` their rows come in bf16, as a bf16 trainer's do.

    The seconds come from a first pass that drops each batch before the next, as a
    training loop does; the batches from a second (the same batches: the loader is
    seeded). Timed while the earlier batches were kept, every fetch wrote fresh memory,
    page by page: 6,300 page faults and 19.6 CPU-ms instead of 5.3 for a 26 MB batch
    (benchmarks/README.md, "Kernels"), which the roofline's 18 ms fetch was."""
    costs: Costs = []
    kw = {"x_bf16": True} if x_bf16 else {}
    it = data.loader("train", None, fanouts, batch_size, True, 0, **kw)
    for _ in range(n):
        t = time.perf_counter()
        b = next(it, None)
        if b is None:
            raise ArgumentError(
                f"--batches: the training split makes {len(costs)} batches of "
                f"--batch-size {batch_size}; {n} are needed (2 of them warm-up)"
            )
        total = time.perf_counter() - t
        costs.append((b.cost.sample_s, total - b.cost.sample_s))
        del b
    it = data.loader("train", None, fanouts, batch_size, True, 0, **kw)
    return [next(it).data for _ in range(n)], costs


def run(args: argparse.Namespace) -> int:
    fanouts = args.fanouts
    import torch

    from graphrun.bench.roofline import roofline
    from graphrun.graph.importers import load_graph
    from graphrun.train.data import LocalData
    from graphrun.train.models import SAGE, resolve_precision

    torch.set_num_threads(args.threads)
    data = LocalData(load_graph(args.dataset))
    nt = data.node_types[0]
    in_dim = data.feature_dim(nt, "feat")
    if in_dim is None:
        raise ArgumentError(f"--dataset: node type {nt!r} has no 'feat' feature")
    batches, costs = _batches(data, fanouts, args.batch_size, args.batches + 2)
    classes = data.num_classes(nt, "label")
    models = _models(in_dim, args.hidden, classes, len(fanouts))
    times = {v: _time_variant(v, models[v], batches) for v in VARIANTS}
    precision = resolve_precision(args.precision)
    torch.manual_seed(0)
    model = SAGE(in_dim, args.hidden, classes, len(fanouts), 0.5, "csr", precision)
    if model.reads_bf16:  # the trainer's fetch: its rows in bf16, gathered as such
        batches, costs = _batches(data, fanouts, args.batch_size, args.batches + 2, True)
    phases, peak = roofline(model, batches, costs, allreduce=not args.no_allreduce)
    ms = {v: round(statistics.median(t) * 1000, 2) for v, t in times.items()}
    first = batches[0]
    out = {
        "bench": "step", "dataset": str(args.dataset), "fanouts": fanouts,
        "batch_size": args.batch_size, "hidden": args.hidden, "batches": len(times["mfg_csr"]),
        "nodes_per_hop": [int(n) for n in first.num_sampled_nodes],
        "edges_per_hop": [int(e) for e in first.num_sampled_edges],
        "step_ms": ms,
        "step_ms_all": {v: [round(x * 1000, 2) for x in t] for v, t in times.items()},
        "precision": precision, "phases": [ph.row(peak) for ph in phases], "peak": peak,
        "torch_threads": torch.get_num_threads(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip
    print(json.dumps(out), flush=True)
    return 0
