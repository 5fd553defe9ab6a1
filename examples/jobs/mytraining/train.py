"""A user's own training loop: what ``training.entryPoint`` and ``training.script`` run.

graphrun calls ``main(ctx)`` in every trainer process with a
:class:`graphrun.train.context.TrainContext`: the trainer's rank and world size, its
share of the graph (``ctx.data``: seeds, PyG mini-batch loaders served by the store),
the job's arguments (``ctx.args``) and the metrics log. The process group is already
joined, so DDP works as in any PyTorch script.

Run by ``custom-placement.yaml`` as the entry point ``mytraining.train:main`` (an entry
point's module is imported from the job file's directory first) and by
``planned.yaml`` as the script ``mytraining/train.py``.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import GraphSAGE

from graphrun.train.context import TrainContext
from graphrun.train.ddp import all_min, all_sum

FANOUTS = [10, 5]


def parse_args(argv: tuple[str, ...]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mytraining")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--batch-size", type=int, default=256)
    return p.parse_args(list(argv))


def accuracy(model: torch.nn.Module, ctx: TrainContext, split: str, batch_size: int) -> float:
    """Accuracy over every trainer's share of ``split`` (counts summed over trainers)."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in ctx.data.loader(split, None, FANOUTS, batch_size, False, 0, "feat", "label"):
            b = batch.data
            out = model(b.x.float(), b.edge_index)[: b.batch_size]
            correct += int((out.argmax(-1) == b.y[: b.batch_size]).sum())
            total += b.batch_size
    c, t = all_sum([float(correct), float(total)], ctx.ddp)
    return c / max(t, 1.0)


def main(ctx: TrainContext) -> dict[str, Any]:
    args = parse_args(ctx.args)
    ntype = ctx.data.node_types[0]
    in_dim = ctx.data.feature_dim(ntype, "feat")
    classes = ctx.data.num_classes(ntype, "label")
    if in_dim is None:
        raise ValueError(f"node type {ntype!r} has no feature 'feat'")
    model: torch.nn.Module = GraphSAGE(in_dim, 128, num_layers=2, out_channels=classes)
    if ctx.world_size > 1:
        model = DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    # every trainer must take the same number of steps, or DDP's all-reduces don't pair up
    seeds = int(ctx.data.seeds("train").numel())
    steps = all_min(-(-seeds // args.batch_size), ctx.ddp)
    record: dict[str, Any] = {}
    for epoch in range(args.epochs):
        model.train()
        loader = ctx.data.loader(
            "train", None, FANOUTS, args.batch_size, True, epoch, "feat", "label"
        )
        total = 0.0
        for _, batch in zip(range(steps), loader):
            b = batch.data
            opt.zero_grad()
            out = model(b.x.float(), b.edge_index)[: b.batch_size]
            loss = F.cross_entropy(out, b.y[: b.batch_size].long())
            loss.backward()
            opt.step()
            total += float(loss)
        record = {"epoch": epoch, "loss": round(total / max(steps, 1), 5)}
        record["val_acc"] = round(accuracy(model, ctx, "val", args.batch_size), 5)
        ctx.metrics.write(record)
    record["test_acc"] = round(accuracy(model, ctx, "test", args.batch_size), 5)
    ctx.metrics.write(record)
    return record
