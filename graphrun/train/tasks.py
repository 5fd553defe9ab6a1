"""The built-in tasks: what one training step and one evaluation do.

* :class:`NodeClassification` — GraphSAGE, GCN or GAT (``model``) on a homogeneous graph;
* :class:`HeteroNodeClassification` — R-GCN or a HeteroConv of SAGEConvs (``model``) on
  one target node type of a heterograph;
* :class:`LinkPrediction` — learnable node embeddings (a ``DistEmbedding`` in a
  distributed job, trained by its sparse optimizer) plus node features when there
  are any, a GraphSAGE encoder and a dot-product decoder, trained with negative
  sampling on the training edges; evaluated on held-out edges (never seen in message
  passing, :mod:`graphrun.sampling.edgesplit`) by AUC, MRR and hits@10 of every positive
  ranked against ``eval_negatives`` negatives of its own.

A task holds its model (DDP-wrapped) and optimisers; :mod:`graphrun.train.loop`
runs the epochs, evaluation, checkpoints and metrics around it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from graphrun.distributed.devicefeed import CpuTransfer
from graphrun.errors import ArgumentError
from graphrun.names import RoleName
from graphrun.train import inference
from graphrun.train.context import TrainContext
from graphrun.train.data import Batch, Embedding
from graphrun.train.ddp import barrier, unwrap, wrap
from graphrun.train.device import precision_for
from graphrun.train.gpu import DevicePath
from graphrun.train.models import (
    GAT,
    GCN,
    SAGE,
    HeteroGNN,
    LinkPredictor,
    Precision,
    resolve_precision,
)
from graphrun.train.names import model_name
from graphrun.train.ps import PSOptimizer


class Scores(NamedTuple):
    """``{metric: sum of per-seed scores}`` over ``seeds`` seeds of one trainer; the loop
    divides the sums over all trainers by the seeds."""

    sums: dict[str, float]
    seeds: int


class Task:
    """Common parts: a model, its dense optimiser, optional sparse embeddings."""

    ntype: str | None = None
    model: torch.nn.Module
    opt: torch.optim.Optimizer | PSOptimizer
    embedding: Embedding | None = None

    def __init__(self, ctx: TrainContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.config

    def _finish(self, model: torch.nn.Module) -> None:
        ddp = self.ctx.ddp
        if self.ctx.ps is not None:  # training.sync: ps (graphrun.train.ps): no all-reduce
            self.model = model.to(ddp.device)
            self.opt = self.ctx.ps.optimizer(
                self.model, ddp.rank, ddp.world_size, self.cfg.lr, self.cfg.weight_decay, barrier
            )
        else:
            self.model = wrap(model, ddp)
            self.opt = torch.optim.Adam(
                self.model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay
            )
        d, c = self.ctx.data, self.cfg
        # feed "cpu": a CPU trainer takes the device path with its CPU transfer, the cache
        # sized by gpu_cache_mb (what tests run of the GPU path without a GPU)
        forced = c.feed == "cpu" and self.ctx.device.type == "cpu"
        self.path = DevicePath(
            d, self.ctx.device, self.ntype or d.node_types[0], c.feature,
            RoleName.trainer(self.ctx.rank), c.batch_size, c.gpu_cache_mb,
            transfer=CpuTransfer() if forced else None,
            free_bytes=(c.gpu_cache_mb or 0) << 20 if forced else None,
        )  # fmt: skip

    def train_seeds(self) -> Tensor:
        return self.ctx.data.seeds("train", self.ntype)

    @property
    def x_bf16(self) -> bool:
        """Whether the batches bring ``x`` in bf16: the model's layer 0 reads bf16 rows
        (:attr:`graphrun.train.models.SAGE.reads_bf16`) and no device path stages them."""
        return bool(getattr(unwrap(self.model), "reads_bf16", False)) and not self.path.active

    def batches(self, split: str, epoch: int, shuffle: bool) -> Iterator[Batch]:
        d = self.ctx.data
        return self.path.batches(
            d.loader(
                split, self.ntype, self.cfg.fanouts.for_graph(d.edge_types), self.cfg.batch_size,
                shuffle, epoch, self.path.loader_feature, self.cfg.label, x_bf16=self.x_bf16,
            )
        )  # fmt: skip

    def rest_batches(self, ids: Tensor, epoch: int) -> Iterator[Batch]:
        """Mini-batches over ``ids`` in their order: this trainer's rest of an epoch after
        the group re-formed without a lost machine (:mod:`graphrun.train.elastic`)."""
        d: Any = self.ctx.data
        return self.path.batches(
            d.rest_loader(
                ids, self.ntype, self.cfg.fanouts.for_graph(d.edge_types), self.cfg.batch_size,
                epoch, self.path.loader_feature, self.cfg.label, x_bf16=self.x_bf16,
            )
        )  # fmt: skip

    def step(self, batch: Batch) -> tuple[float, float, int]:
        """One optimisation step: ``(loss, correct, counted)``."""
        self.model.train()
        self.opt.zero_grad()
        if self.embedding is not None:
            self.embedding.zero_grad()
        with self.path.guard():
            loss, correct, counted = self.loss(self.model, batch)
            loss.backward()
            self.opt.step()
        if self.embedding is not None:
            self.embedding.step()
        return float(loss.detach()), correct, counted

    def evaluate_splits(self, splits: tuple[str, ...], final: bool) -> dict[str, Scores]:
        """Every split's :class:`Scores`; evaluations before the last (``final``) stop
        after ``eval_subset`` seeds when it is set."""
        limit = None if final else self.cfg.eval_subset
        return {split: self.evaluate(split, limit) for split in splits}

    @torch.no_grad()
    def evaluate(self, split: str, limit: int | None = None) -> Scores:
        """Sampled evaluation (the training fanouts) on this trainer's share of
        ``split``, or on its first batches holding ``limit`` seeds."""
        model = unwrap(self.model)
        model.eval()
        total, count = 0.0, 0
        for batch in self.batches(split, epoch=0, shuffle=False):
            _, correct, counted = self.loss(model, batch)
            total += correct
            count += counted
            if limit is not None and count >= limit:
                break
        return Scores({"acc": total}, count)

    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[Tensor, float, int]:
        raise NotImplementedError

    def steps_per_epoch(self) -> int:
        n = int(self.train_seeds().numel())
        return -(-n // self.cfg.batch_size)

    def epoch_batches(self, epoch: int) -> Iterator[Batch]:
        return self.batches("train", epoch, shuffle=True)


def device_precision(precision: str, device: torch.device) -> Precision:
    """``training.precision`` on ``device``: ``auto`` is bf16 on a GPU that supports it
    (:func:`graphrun.train.device.precision_for`), the CPU rule on a CPU."""
    if device.type != "cuda":
        return resolve_precision(precision)
    got = precision_for(precision, "cuda", torch.cuda.is_bf16_supported(), cpu_native=False)
    return "bf16" if got == "bf16" else "fp32"


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
            precision = device_precision(c.precision, ctx.device)
            model = SAGE(in_dim, c.hidden, classes, layers, c.dropout, c.aggr_path, precision)
        self.layerwise = c.evaluation != "sampled" and inference.supports(model, d)
        if c.evaluation == "layerwise" and not self.layerwise:
            raise ArgumentError(
                f"evaluation: layerwise runs GraphSAGE and GAT on homogeneous graphs, not "
                f"{name} on {len(d.edge_types)} edge types; use 'sampled'"
            )
        self._finish(model)

    def evaluate_splits(self, splits: tuple[str, ...], final: bool) -> dict[str, Scores]:
        """Layer-wise full-neighbour inference (:mod:`graphrun.train.inference`) over the
        splits at once, when the model supports it and no ``eval_subset`` applies."""
        if not self.layerwise or (not final and self.cfg.eval_subset is not None):
            return super().evaluate_splits(splits, final)
        d, c = self.ctx.data, self.cfg
        nt = self.ntype or d.node_types[0]
        ids = [d.cover(split, self.ntype) for split in splits]
        targets = torch.cat(ids)
        sync = barrier if self.ctx.world_size > 1 else lambda: None
        logits = inference.layerwise(
            unwrap(self.model), d, nt, c.feature, targets, c.batch_size, sync, self.ctx.device
        )
        hit = logits.argmax(-1) == d.node_table(nt, c.label)[targets].long()
        out, lo = {}, 0
        for split, part in zip(splits, ids, strict=True):
            n = part.numel()
            out[split] = Scores({"acc": float(hit[lo : lo + n].sum())}, n)
            lo += n
        return out

    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[Tensor, float, int]:
        data = batch.data
        bs = int(data.batch_size)
        x = data.x if data.x.dtype == torch.bfloat16 else data.x.float()  # bf16: x_bf16
        out = model(x, data.edge_index, data.num_sampled_nodes, data.num_sampled_edges)[:bs]
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
            in_dims, d.edge_types, c.hidden, classes, len(c.fanouts), self.ntype, c.dropout, conv,
            c.num_bases,
        )  # fmt: skip
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
        if ctx.device.type != "cpu":
            raise ArgumentError("link-prediction: runs on CPU trainers (no gpusPerMachine)")
        nt = d.node_types[0]
        dim = c.embedding_dim or c.hidden
        self.feat_dim = d.feature_dim(nt, c.feature) or 0
        _model(c.task, c.model)
        self.embedding = d.embedding("node_emb", d.num_nodes(), dim, c.sparse_lr)
        self._finish(LinkPredictor(dim + self.feat_dim, c.hidden, len(c.fanouts), 0.0))

    def positives_per_trainer(self) -> int:
        mine = self._edges("train").numel()
        if self.cfg.edges_per_epoch is None:
            return mine
        return min(max(1, self.cfg.edges_per_epoch // self.ctx.world_size), mine)

    def _edges(self, split: str) -> Tensor:
        return self.ctx.data.edges(split, self.cfg.edge_split)

    def steps_per_epoch(self) -> int:
        return -(-self.positives_per_trainer() // self.cfg.batch_size)

    def _loader(self, split: str, epoch: int, shuffle: bool, neg_k: int) -> Iterator[Batch]:
        d = self.ctx.data
        return d.link_loader(
            split, self.cfg.fanouts.for_graph(d.edge_types), self.cfg.batch_size, neg_k, shuffle,
            epoch, self.cfg.feature, self.cfg.edge_split,
        )  # fmt: skip

    def epoch_batches(self, epoch: int) -> Iterator[Batch]:
        return self._loader("train", epoch, shuffle=True, neg_k=self.cfg.negative_samples)

    def _scores(self, model: torch.nn.Module, batch: Batch) -> Tensor:
        assert self.embedding is not None
        data = batch.data
        x = self.embedding(data.n_id)
        if self.feat_dim:
            x = torch.cat([x, data.x.float()], dim=-1)
        return model(
            x, data.edge_index, data.edge_label_index, data.num_sampled_nodes,
            data.num_sampled_edges,
        )  # fmt: skip

    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[Tensor, float, int]:
        labels = batch.data.edge_label.float()
        scores = self._scores(model, batch)
        # no pairs: every positive deleted by the batch's version (follow="head"), a step
        # all the same (the trainers agreed the epoch's steps): 0, zero gradients, where
        # the mean of no pairs is NaN
        empty = labels.numel() == 0
        loss = scores.sum() if empty else F.binary_cross_entropy_with_logits(scores, labels)
        ranks = positive_ranks(scores.detach(), labels)
        wins = float((1.0 - ranks.frac).sum())
        return loss, wins, ranks.n  # wins / n estimates the AUC

    @torch.no_grad()
    def evaluate(self, split: str, limit: int | None = None) -> Scores:
        model = unwrap(self.model)
        model.eval()
        sums = {"auc": 0.0, "mrr": 0.0, "hits@10": 0.0}
        count = 0
        for batch in self._loader(split, 0, shuffle=False, neg_k=self.cfg.eval_negatives):
            r = positive_ranks(self._scores(model, batch), batch.data.edge_label.float())
            sums["auc"] += float((1.0 - r.frac).sum())
            sums["mrr"] += float((1.0 / r.rank).sum())
            sums["hits@10"] += float((r.rank <= 10).sum())
            count += r.n
            if limit is not None and count >= limit:
                break
        return Scores(sums, count)


class Ranks(NamedTuple):
    rank: Tensor  # 1-based rank of each positive among itself and its negatives
    frac: Tensor  # the fraction of its negatives scored above it (ties count half)
    n: int


def positive_ranks(scores: Tensor, labels: Tensor) -> Ranks:
    """Rank each positive against its own negatives. A batch holds its ``n`` positives
    first, then ``k`` negatives per positive, positive ``i``'s at ``n + i*k .. n + i*k + k``
    (:class:`~graphrun.sampling.negative.NegativeSampler`'s order)."""
    pos, neg = scores[labels > 0], scores[labels == 0]
    n = pos.numel()
    if n == 0:
        empty = torch.empty(0)
        return Ranks(empty, empty, 0)
    neg = neg.view(n, -1)
    above = (neg > pos.unsqueeze(1)).float().sum(1) + 0.5 * (neg == pos.unsqueeze(1)).float().sum(1)
    return Ranks(1.0 + above, above / neg.shape[1], n)


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
    model = unwrap(task.model)
    out = {"task": task.cfg.task, "model": type(model).__name__, "params": params}
    return {**out, "precision": getattr(model, "precision", "fp32")}
