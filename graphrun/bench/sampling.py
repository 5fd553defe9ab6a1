"""``graphrun bench sampling``: sampled edges per second and mini-batches per second.

Prints one JSON object:

* ``local_sampled_edges_per_s`` — one process, the whole graph's CSC in memory,
  2-hop sampling (fanouts, batch size) including relabelling into the
  hierarchical layout (``..._per_cpu_s``: per second of this process's CPU time,
  a proxy for a quiet machine); ``local_minibatches_per_s`` adds gathering
  ``feat``/``label`` into a PyG ``Data``;
* ``dist_sampled_edges_per_s`` — the graph in ``--parts`` partitions served by real
  store processes; seeds spread over all partitions; every one-hop request goes
  over loopback (``use_shm=False``); ``dist_shm_sampled_edges_per_s`` — the same
  with the co-located partitions sampled in-process from shared memory;
  ``dist_minibatches_per_s`` — ``DistNodeDataLoader`` batches (sampling + feature
  pulls) over loopback; ``pyg_remote_minibatches_per_s`` — PyG's ``NeighborLoader``
  on the same store (``remote_backend``), the same seeds; ``pyg_remote_slowdown`` —
  how much slower per batch than graphrun's loader (0.1 = 10 %; best of three
  interleaved passes each);
* ``pyg_sampled_edges_per_s`` / ``pyg_minibatches_per_s`` — PyG's ``NeighborLoader`` on
  the whole graph in one process, or null when neither ``pyg-lib`` nor
  ``torch-sparse`` is installed (PyG needs one of them to sample).

``--dataset DIR`` takes any importable dataset (a dataset directory, a folder of
.npy arrays, ...); by default a community graph is generated (``--nodes``,
``--avg-degree``). Timings are wall-clock; note the machine's load next to them.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphrun.bench import check_at_least, int_list

if TYPE_CHECKING:
    from graphrun.graph import Graph

DEFAULTS = {"nodes": 200_000, "avg_degree": 40.0, "batch_size": 1000, "batches": 30}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sampling",
        help="neighbour sampling throughput (local, distributed, PyG)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dataset", type=Path, help="dataset to load (default: generate one)")
    p.add_argument("--nodes", type=int, default=DEFAULTS["nodes"], help="generated graph size")
    p.add_argument("--avg-degree", type=float, default=DEFAULTS["avg_degree"])
    p.add_argument("--fanouts", default="25,10", help="comma-separated fanouts (default 25,10)")
    p.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    p.add_argument("--batches", type=int, default=DEFAULTS["batches"], help="timed batches")
    p.add_argument("--parts", type=int, default=2, help="partitions for the distributed run")
    p.add_argument("--method", default="random", choices=("random", "metis"))
    p.add_argument("--no-dist", action="store_true", help="skip the distributed measurements")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads of this process (default 1: the kernels issue many small "
        "ops, and spinning OpenMP threads only compete on a shared machine)",
    )
    p.set_defaults(func=run)


def _load(args: argparse.Namespace) -> Graph:
    if args.dataset is not None:
        from graphrun.graph.importers import load_graph

        return load_graph(args.dataset)
    from graphrun.graph.generate import GenParams, community

    return community(
        GenParams(nodes=args.nodes, avg_degree=args.avg_degree, seed=args.seed, name="bench")
    )


def _seed_batches(num_nodes: int, args: argparse.Namespace) -> list[Any]:
    import torch

    gen = torch.Generator().manual_seed(args.seed)
    need = args.batch_size * (args.batches + 2)
    perm = torch.cat(
        [torch.randperm(num_nodes, generator=gen) for _ in range(-(-need // num_nodes))]
    )
    return [perm[i * args.batch_size : (i + 1) * args.batch_size] for i in range(args.batches + 2)]


def _timed(batches: list[Any], step: Any) -> tuple[float, int, float]:
    """Run ``step`` on 2 warm-up batches, then time the rest; (seconds, edges, cpu seconds)."""
    for b in batches[:2]:
        step(b)
    edges = 0
    t, c = time.perf_counter(), time.process_time()
    for b in batches[2:]:
        edges += step(b)
    return time.perf_counter() - t, edges, time.process_time() - c


def bench_local(graph: Any, fanouts: list[int], batches: list[Any]) -> dict[str, float]:
    from graphrun.sampling import CSCGraph, GraphFeatures, NeighborSampler, OffsetTypeMap, collate
    from graphrun.sampling.sampler import Output

    types = OffsetTypeMap.from_graph(graph)
    sampler = NeighborSampler(
        CSCGraph.from_graph(graph), types, graph.num_nodes, fanouts, generator=0
    )
    secs, edges, cpu = _timed(batches, lambda b: int(sampler.sample(b).edge.numel()))
    feats = GraphFeatures(graph)
    output: Output = "hetero" if graph.is_hetero else "data"

    def full(b: Any) -> int:
        sub = sampler.sample(b)
        collate(sub, types, feats, output=output)
        return 1

    bsecs, n, _ = _timed(batches, full)
    return {
        "local_sampled_edges_per_s": edges / secs,
        "local_sampled_edges_per_cpu_s": edges / cpu,
        "local_edges_per_batch": edges / max(1, len(batches) - 2),
        "local_minibatches_per_s": n / bsecs,
    }


def bench_pyg(graph: Any, fanouts: list[int], batches: list[Any]) -> dict[str, float | None]:
    import torch_geometric.typing as pyg_typing

    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE) or graph.is_hetero:
        return {"pyg_sampled_edges_per_s": None, "pyg_minibatches_per_s": None}
    import numpy as np
    import torch
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    src, dst = torch.from_numpy(np.array(graph.src)), torch.from_numpy(np.array(graph.dst))
    data = Data(edge_index=torch.stack([src, dst]), num_nodes=graph.num_nodes)
    for key, name in (("x", "feat"), ("y", "label")):
        arr = graph.ndata.get(graph.node_types[0], {}).get(name)
        if arr is not None:
            data[key] = torch.from_numpy(np.array(arr))
    seeds = torch.cat(batches)
    loader = NeighborLoader(data, fanouts, input_nodes=seeds, batch_size=len(batches[0]))
    it = iter(loader)
    for _ in range(2):
        next(it)
    edges = n = 0
    t = time.perf_counter()
    for batch in it:
        edges += int(batch.edge_index.shape[1])
        n += 1
    secs = time.perf_counter() - t
    return {"pyg_sampled_edges_per_s": edges / secs, "pyg_minibatches_per_s": n / secs}


def bench_dist(
    graph: Any, fanouts: list[int], batches: list[Any], args: argparse.Namespace
) -> dict[str, float]:
    import numpy as np
    import torch

    from graphrun.distributed import (
        DistGraph,
        DistNodeDataLoader,
        NeighborLoader,
        initialize,
        remote_backend,
    )
    from graphrun.local.stores import start_stores
    from graphrun.partition import load_id_mapping, partition_graph
    from graphrun.sampling import NeighborSampler
    from graphrun.sampling.partitioned import BookTypeMap

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="graphrun-bench-") as tmp:
        parts = Path(tmp) / "parts"
        t = time.perf_counter()
        partition_graph(graph, parts, args.parts, method=args.method, seed=args.seed)
        out["partition_s"] = time.perf_counter() - t
        new = torch.from_numpy(np.array(load_id_mapping(parts).new_nids))
        seeds = [new[b] for b in batches]  # the same nodes, in the new id space
        with start_stores(parts, args.parts) as stores:
            servers = [s.address for s in stores]
            for key, shm in (
                ("dist_sampled_edges_per_s", False),
                ("dist_shm_sampled_edges_per_s", True),
            ):
                with initialize(servers, use_shm=shm, heartbeat_interval=0) as ctx:
                    book = ctx.book
                    sampler = NeighborSampler(
                        ctx.sampler, BookTypeMap(book), book.num_nodes, fanouts, generator=0
                    )
                    secs, edges, _ = _timed(
                        seeds, lambda b, s=sampler: int(s.sample(b).edge.numel())
                    )
                    out[key] = edges / secs
            with initialize(servers, use_shm=False, heartbeat_interval=0) as ctx:
                if graph.is_hetero:
                    return out
                ids = torch.cat(seeds)
                ours = DistNodeDataLoader(DistGraph(ctx), ids, fanouts, batch_size=args.batch_size)
                fs, gs = remote_backend(ctx)
                theirs = NeighborLoader(
                    (fs, gs), fanouts, input_nodes=ids, batch_size=args.batch_size, seed=0
                )
                rates: dict[str, list[float]] = {"dist": [], "pyg_remote": []}
                for _ in range(3):  # interleaved, best of three: the machine's load varies
                    rates["dist"].append(_loader_rate(ours))
                    rates["pyg_remote"].append(_loader_rate(theirs))
                out["dist_minibatches_per_s"] = max(rates["dist"])
                out["pyg_remote_minibatches_per_s"] = max(rates["pyg_remote"])
                out["pyg_remote_slowdown"] = max(rates["dist"]) / max(rates["pyg_remote"]) - 1
    return out


def _loader_rate(loader: Any) -> float:
    """Batches per second of one pass over ``loader`` after its first two batches."""
    it = iter(loader)
    for _ in range(2):
        next(it)
    n = 0
    t = time.perf_counter()
    for _ in it:
        n += 1
    return n / (time.perf_counter() - t)


def run(args: argparse.Namespace) -> int:
    import torch

    check_at_least(args, 1, "--batch-size", "--batches", "--parts", "--threads")
    fanouts = int_list("--fanouts", args.fanouts, minimum=0)
    torch.set_num_threads(max(1, args.threads))
    t = time.perf_counter()
    graph = _load(args)
    load_s = time.perf_counter() - t
    batches = _seed_batches(graph.num_nodes, args)
    result: dict[str, Any] = {
        "bench": "sampling",
        "graph": graph.name,
        "num_nodes": int(graph.num_nodes),
        "num_edges": int(graph.num_edges),
        "fanouts": fanouts,
        "batch_size": args.batch_size,
        "batches": args.batches,
        "torch_threads": torch.get_num_threads(),
        "load_s": load_s,
        "loadavg_1m": os.getloadavg()[0],
    }
    result.update(bench_local(graph, fanouts, batches))
    result.update(bench_pyg(graph, fanouts, batches))
    result["dist_sampled_edges_per_s"] = None
    if not args.no_dist:
        result.update(bench_dist(graph, fanouts, batches, args))
    print(json.dumps(result))
    return 0
