"""DistDGL as a benchmark peer: run by ``graphrun bench train --peer distdgl`` with the
peer's own Python (``--peer-python``: a virtual environment with dgl 2.1 and its torch).

This file imports nothing of graphrun (it runs under another interpreter, numpy < 2,
torch 2.2); it reads the graphrun dataset format directly (``graph.json``, ``src.npy``,
``dst.npy``, ``node/<type>/<name>.npy``). Three commands:

``partition DATASET OUT --parts P``
    DGL's ``partition_graph`` with METIS, training nodes and edges balanced (the
    settings graphrun's bench uses); prints ``{"partition_s": .., "peak_rss_mb": ..}``.
``host --machine I ...``
    one machine of the run: starts its DistDGL server (``DGL_ROLE=server``), then its
    trainer, waits for the trainer and the server. The caller runs it inside the
    machine's network namespace with a private ``/dev/shm`` (DistDGL's shared-memory
    names collide when two of its servers share a kernel's /dev/shm).
``train ...``
    the trainer: GraphSAGE (DGL's ``SAGEConv`` mean aggregator, as DGL's distributed
    example) over ``DistNodeDataLoader`` + ``NeighborSampler``, DDP over gloo, uneven
    batches joined with ``model.join()``; after the epochs, layer-wise full-neighbour
    inference over every node (as DGL's example evaluates) and the test accuracy.
    Rank 0 prints one JSON line::

        {"peer": "distdgl", "epoch_s_all": [...], "test_acc": .., "eval_s": ..,
         "first_step_s": seconds from process start to the first step}
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

T_START = time.time()


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_graph(path: Path) -> Any:
    import dgl
    import numpy as np
    import torch

    meta = json.loads((path / "graph.json").read_text())
    if len(meta["node_types"]) != 1:
        raise SystemExit(f"{path}: the DistDGL peer takes homogeneous graphs only")
    ntype = meta["node_types"][0]["name"]
    src = torch.from_numpy(np.load(path / "src.npy"))
    dst = torch.from_numpy(np.load(path / "dst.npy"))
    g = dgl.graph((src, dst), num_nodes=int(meta["num_nodes"]))
    for name in ("feat", "label", "train_mask", "val_mask", "test_mask"):
        g.ndata[name] = torch.from_numpy(np.load(path / "node" / ntype / f"{name}.npy"))
    return g


def cmd_partition(args: argparse.Namespace) -> None:
    import dgl

    g = load_graph(args.dataset)
    t0 = time.time()
    dgl.distributed.partition_graph(
        g, "graph", args.parts, str(args.out), part_method="metis",
        balance_ntypes=g.ndata["train_mask"], balance_edges=True,
    )  # fmt: skip
    out = {"partition_s": round(time.time() - t0, 2), "partition_peak_rss_mb": round(_peak_mb(), 1)}
    print(json.dumps(out), flush=True)


def cmd_host(args: argparse.Namespace) -> int:
    """Server, then trainer, of machine ``args.machine``; returns the trainer's exit code."""
    base = {
        **os.environ, "DGL_DIST_MODE": "distributed", "DGL_NUM_SERVER": "1",
        "DGL_IP_CONFIG": str(args.ip_config), "DGL_CONF_PATH": str(args.part_config),
        "DGL_NUM_CLIENT": str(args.world), "DGL_GRAPH_FORMAT": "csc",
        "OMP_NUM_THREADS": str(args.threads),
    }  # fmt: skip
    me = [sys.executable, __file__]
    server = subprocess.Popen(
        [*me, "serve", "--ip-config", str(args.ip_config)],
        env={**base, "DGL_ROLE": "server", "DGL_SERVER_ID": str(args.machine)},
    )
    trainer_env = {
        **base, "DGL_ROLE": "client", "DGL_NUM_SAMPLER": "0", "RANK": str(args.machine),
        "WORLD_SIZE": str(args.world), "MASTER_ADDR": args.master_addr,
        "MASTER_PORT": str(args.master_port),
    }  # fmt: skip
    train_argv = [*me, "train", *args.train_args]
    try:
        code = subprocess.run(train_argv, env=trainer_env, check=False).returncode
        server.wait(timeout=120)  # servers exit once every client has left
    finally:
        if server.poll() is None:
            server.kill()
    return code


def cmd_serve(args: argparse.Namespace) -> None:
    import dgl

    dgl.distributed.initialize(str(args.ip_config))  # never returns on a server


def build_model(in_feats: int, hidden: int, classes: int, layers: int, dropout: float) -> Any:
    import dgl.nn.pytorch as dglnn
    import torch
    import torch.nn.functional as F

    class DistSAGE(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            dims = [in_feats] + [hidden] * (layers - 1) + [classes]
            self.layers = torch.nn.ModuleList(
                dglnn.SAGEConv(dims[i], dims[i + 1], "mean") for i in range(layers)
            )
            self.dropout = torch.nn.Dropout(dropout)

        def forward(self, blocks: Any, x: Any) -> Any:
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks, strict=True)):
                h = layer(block, h)
                if i != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

        @torch.no_grad()
        def inference(self, g: Any, batch_size: int) -> Any:
            """Layer-wise full-neighbour inference over every node, split over trainers."""
            import dgl

            nodes = dgl.distributed.node_split(
                torch.arange(g.num_nodes()), g.get_partition_book(), force_even=True
            )
            x = g.ndata["feat"]
            sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
            for i, layer in enumerate(self.layers):
                dim = hidden if i != len(self.layers) - 1 else classes
                y = dgl.distributed.DistTensor(
                    (g.num_nodes(), dim), torch.float32, f"h{i}", persistent=True
                )
                loader = dgl.dataloading.DistNodeDataLoader(
                    g, nodes, sampler, batch_size=batch_size, shuffle=False, drop_last=False
                )
                for input_nodes, output_nodes, blocks in loader:
                    h = layer(blocks[0], x[input_nodes].float())
                    if i != len(self.layers) - 1:
                        h = F.relu(h)
                    y[output_nodes] = h
                x = y
                g.barrier()
            return y

    return DistSAGE()


def cmd_train(args: argparse.Namespace) -> None:
    import dgl
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    dgl.distributed.initialize(str(args.ip_config))
    torch.distributed.init_process_group("gloo")
    g = dgl.distributed.DistGraph("graph", part_config=str(args.part_config))
    pb = g.get_partition_book()
    train_nid = dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True)
    test_nid = dgl.distributed.node_split(g.ndata["test_mask"], pb, force_even=True)
    labels = g.ndata["label"][torch.arange(g.num_nodes())]
    classes = int(labels.max()) + 1
    in_feats = g.ndata["feat"].shape[1]
    fanouts = [int(f) for f in args.fanouts.split(",")]
    model = build_model(in_feats, args.hidden, classes, len(fanouts), args.dropout)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    sampler = dgl.dataloading.NeighborSampler(fanouts)
    loader = dgl.dataloading.DistNodeDataLoader(
        g, train_nid, sampler, batch_size=args.batch_size, shuffle=True, drop_last=False
    )
    rank = torch.distributed.get_rank()
    epoch_s: list[float] = []
    first_step = None
    for _ in range(args.epochs):
        ddp.train()
        tic = time.time()
        with ddp.join():  # trainers may have different batch counts
            for input_nodes, seeds, blocks in loader:
                x = g.ndata["feat"][input_nodes].float()
                y = g.ndata["label"][seeds].long()
                loss = F.cross_entropy(ddp(blocks, x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if first_step is None:
                    first_step = time.time() - T_START
        epoch_s.append(round(time.time() - tic, 4))
    t0 = time.time()
    ddp.eval()
    pred = model.inference(g, args.batch_size * 4)
    correct = (pred[test_nid].argmax(1) == labels[test_nid]).sum()
    counts = torch.tensor([float(correct), float(len(test_nid))])
    torch.distributed.all_reduce(counts)
    eval_s = time.time() - t0
    if rank == 0:
        acc = round(float(counts[0] / counts[1]), 5)
        out = {
            "peer": "distdgl", "epoch_s_all": epoch_s, "test_acc": acc,
            "eval_s": round(eval_s, 2), "first_step_s": round(first_step or 0.0, 2),
            "peak_rss_mb_trainer0": round(_peak_mb(), 1),
        }  # fmt: skip
        print(json.dumps(out), flush=True)
    torch.distributed.barrier()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="distdgl-peer", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    part = sub.add_parser("partition")
    part.add_argument("dataset", type=Path)
    part.add_argument("out", type=Path)
    part.add_argument("--parts", type=int, default=2)
    host = sub.add_parser("host")
    host.add_argument("--machine", type=int, required=True)
    host.add_argument("--world", type=int, required=True)
    host.add_argument("--ip-config", type=Path, required=True)
    host.add_argument("--part-config", type=Path, required=True)
    host.add_argument("--master-addr", required=True)
    host.add_argument("--master-port", type=int, required=True)
    host.add_argument("--threads", type=int, default=1)
    host.add_argument("train_args", nargs=argparse.REMAINDER)
    serve = sub.add_parser("serve")
    serve.add_argument("--ip-config", type=Path, required=True)
    train = sub.add_parser("train")
    train.add_argument("--ip-config", type=Path, required=True)
    train.add_argument("--part-config", type=Path, required=True)
    train.add_argument("--epochs", type=int, default=10)
    train.add_argument("--batch-size", type=int, default=1000)
    train.add_argument("--fanouts", default="25,10")
    train.add_argument("--hidden", type=int, default=128)
    train.add_argument("--lr", type=float, default=0.003)
    train.add_argument("--dropout", type=float, default=0.5)
    train.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.cmd == "host":
        if args.train_args and args.train_args[0] == "--":
            args.train_args = args.train_args[1:]
        return cmd_host(args)
    {"partition": cmd_partition, "serve": cmd_serve, "train": cmd_train}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
