"""The built-in tasks: what one training step and one evaluation do.

* :class:`NodeClassification` — GraphSAGE, GCN or GAT (``model``) on a homogeneous graph;
* :class:`HeteroNodeClassification` — R-GCN or a HeteroConv of SAGEConvs (``model``) on
  one target node type of a heterograph;
* :class:`LinkPrediction` — learnable node embeddings (a ``DistEmbedding`` in a
  distributed job, trained by its sparse optimizer) plus node features when there
  are any, a GraphSAGE encoder and a dot-product decoder, trained with negative
  sampling; evaluated by the AUC of positive against negative scores.

A task holds its model (DDP-wrapped) and optimisers; :mod:`graphrun.train.loop`
runs the epochs, evaluation, checkpoints and metrics around it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from graphrun.errors import ArgumentError
from graphrun.train.context import TrainContext
from graphrun.train.data import Batch, Embedding
from graphrun.train.ddp import unwrap, wrap
from graphrun.train.models import GAT, GCN, SAGE, HeteroGNN, LinkPredictor
from graphrun.train.names import model_name


class Task:
    """Common parts: a model, its dense optimiser, optional sparse embeddings."""

    ntype: str | None = None
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    embedding: Embedding | None = None

    def __init__(self, ctx: TrainContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.config

    def _finish(self, model: torch.nn.Module) -> None:
        self.model = wrap(model, self.ctx.ddp)
        self.opt = torch.optim.Adam(
            self.model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay
        )

    def train_seeds(self) -> Tensor:
        return self.ctx.data.seeds("train", self.ntype)

    def batches(self, split: str, epoch: int, shuffle: bool) -> Iterator[Batch]:
        d = self.ctx.data
        return d.loader(
            split, self.ntype, self.cfg.fanout_spec(d.edge_types), self.cfg.batch_size,
            shuffle, epoch, self.cfg.feature, self.cfg.label,
        )  # fmt: skip

    def step(self, batch: Batch) -> tuple[float, float, int]:
        """One optimisation step: ``(loss, correct, counted)``."""
        self.model.train()
        self.opt.zero_grad()
        if self.embedding is not None:
            self.embedding.zero_grad()
        loss, correct, counted = self.loss(self.model, batch)
        loss.backward()
        self.opt.step()
        if self.embedding is not None:
            self.embedding.step()
        return float(loss.detach()), correct, counted

    @torch.no_grad()
    def evaluate(self, split: str) -> tuple[float, int]:
        """``(sum of per-seed scores, seeds)`` on this trainer's share of ``split``."""
        model = unwrap(self.model)
        model.eval()
        total, count = 0.0, 0
        for batch in self.batches(split, epoch=0, shuffle=False):
            _, correct, counted = self.loss(model, batch)
            total += correct
            count += counted
        return total, count

    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[Tensor, float, int]:
        raise NotImplementedError

    def steps_per_epoch(self) -> int:
        n = int(self.train_seeds().numel())
        return -(-n // self.cfg.batch_size)

    def epoch_batches(self, epoch: int) -> Iterator[Batch]:
        return self.batches("train", epoch, shuffle=True)


def _model(task: str | None, model: str | None) -> str:
    """The model name the task runs (see :mod:`graphrun.train.names`)."""
    try:
        return model_name(str(task), model)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None


def _accuracy(logits: Tensor, y: Tensor) -> tuple[float, int]:
    return float((logits.argmax(-1) == y).sum()), int(y.numel())


class NodeClassification(Task):
    def __init__(self, ctx: TrainContext) -> None:
        super().__init__(ctx)
        d, c = ctx.data, self.cfg
        self.ntype = c.target_node_type
        nt = self.ntype or d.node_types[0]
        in_dim = d.feature_dim(nt, c.feature)
        if in_dim is None:
            raise ArgumentError(f"feature: node type {nt!r} has no feature {c.feature!r}")
        classes = d.num_classes(nt, c.label)
        layers = len(c.fanouts)
        name = _model(c.task, c.model)
        model: torch.nn.Module
        if name == "gcn":
            model = GCN(in_dim, c.hidden, classes, layers, c.dropout)
        elif name == "gat":
            model = GAT(in_dim, c.hidden, classes, layers, c.dropout)
        else:
            model = SAGE(in_dim, c.hidden, classes, layers, c.dropout, c.aggr_path)
        self._finish(model)

    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[Tensor, float, int]:
        data = batch.data
        bs = int(data.batch_size)
        out = model(
            data.x.float(), data.edge_index, data.num_sampled_nodes, data.num_sampled_edges
        )[:bs]
        y = data.y[:bs].long()
        correct, counted = _accuracy(out, y)
        return F.cross_entropy(out, y), correct, counted


class HeteroNodeClassification(Task):
    def __init__(self, ctx: TrainContext) -> None:
        super().__init__(ctx)
        d, c = ctx.data, self.cfg
        if c.target_node_type is None:
            raise ArgumentError("target_node_type: required for hetero-node-classification")
        self.ntype = c.target_node_type
        dims = {t: d.feature_dim(t, c.feature) for t in d.node_types}
        in_dims = {t: v for t, v in dims.items() if v is not None}
        classes = d.num_classes(self.ntype, c.label)
        conv: Literal["rgcn", "sage"] = (
            "sage" if _model(c.task, c.model) == "hetero-sage" else "rgcn"
        )
        model = HeteroGNN(
            in_dims, d.edge_types, c.hidden, classes, len(c.fanouts), self.ntype, c.dropout, conv
        )
        self._finish(model)

    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[Tensor, float, int]:
        data = batch.data
        t = self.ntype
        assert t is not None
        bs = int(data[t].batch_size)
        x = {k: v.float() for k, v in data.x_dict.items()}
        out = model(
            x, data.edge_index_dict, data.num_sampled_nodes_dict, data.num_sampled_edges_dict
        )[:bs]
        y = data[t].y[:bs].long()
        correct, counted = _accuracy(out, y)
        return F.cross_entropy(out, y), correct, counted


class LinkPrediction(Task):
    def __init__(self, ctx: TrainContext) -> None:
        super().__init__(ctx)
        d, c = ctx.data, self.cfg
        if len(d.node_types) != 1:
            raise ArgumentError("link-prediction: needs a homogeneous graph")
        nt = d.node_types[0]
        dim = c.embedding_dim or c.hidden
        self.feat_dim = d.feature_dim(nt, c.feature) or 0
        _model(c.task, c.model)
        self.embedding = d.embedding("node_emb", d.num_nodes(), dim, c.sparse_lr)
        self._finish(LinkPredictor(dim + self.feat_dim, c.hidden, len(c.fanouts), 0.0))

    def positives_per_trainer(self) -> int:
        total = self.cfg.edges_per_epoch or 20 * self.cfg.batch_size
        return min(max(1, total // self.ctx.world_size), self.ctx.data.edges("train").numel())

    def steps_per_epoch(self) -> int:
        return -(-self.positives_per_trainer() // self.cfg.batch_size)

    def _loader(self, split: str, epoch: int, shuffle: bool) -> Iterator[Batch]:
        d = self.ctx.data
        return d.link_loader(
            split, self.cfg.fanout_spec(d.edge_types), self.cfg.batch_size,
            self.cfg.negative_samples, shuffle, epoch, self.cfg.feature,
        )  # fmt: skip

    def epoch_batches(self, epoch: int) -> Iterator[Batch]:
        return self._loader("train", epoch, shuffle=True)

    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[Tensor, float, int]:
        assert self.embedding is not None
        data = batch.data
        x = self.embedding(data.n_id)
        if self.feat_dim:
            x = torch.cat([x, data.x.float()], dim=-1)
        labels = data.edge_label.float()
        scores = model(
            x, data.edge_index, data.edge_label_index, data.num_sampled_nodes,
            data.num_sampled_edges,
        )  # fmt: skip
        loss = F.binary_cross_entropy_with_logits(scores, labels)
        pos, neg = scores[labels > 0].detach(), scores[labels == 0].detach()
        n = pos.numel()
        wins = float((pos.unsqueeze(1) > neg.view(n, -1)).float().mean(1).sum()) if n else 0.0
        return loss, wins, n  # wins / n estimates the AUC

    @torch.no_grad()
    def evaluate(self, split: str) -> tuple[float, int]:
        model = unwrap(self.model)
        model.eval()
        total, count = 0.0, 0
        for batch in self._loader(split, epoch=0, shuffle=False):
            _, wins, n = self.loss(model, batch)
            total, count = total + wins, count + n
        return total, count


TASK_CLASSES: dict[str, type[Task]] = {
    "node-classification": NodeClassification,
    "hetero-node-classification": HeteroNodeClassification,
    "link-prediction": LinkPrediction,
}


def make_task(ctx: TrainContext) -> Task:
    task = ctx.config.task
    if task not in TASK_CLASSES:
        raise ArgumentError(f"task: {task!r} is not one of {', '.join(TASK_CLASSES)}")
    return TASK_CLASSES[task](ctx)


def describe(task: Task) -> dict[str, Any]:
    params = sum(p.numel() for p in task.model.parameters())
    return {"task": task.cfg.task, "model": type(unwrap(task.model)).__name__, "params": params}
