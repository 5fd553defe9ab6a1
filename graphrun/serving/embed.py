"""Whole-graph embeddings: layer-wise inference over every node, written to the store.

``graphrun infer embed`` runs the model once per layer over every node's whole
in-neighbourhood (:func:`graphrun.train.inference.layerwise`, as evaluation does) and
writes three tensors of the node type's id space:

* ``serving/<ntype>/embeddings`` — float32 ``[N, hidden]``: each node's input to the last
  layer (its final embedding; the features themselves for a one-layer model);
* ``serving/<ntype>/logits`` — float32 ``[N, classes]``: the model's output;
* ``serving/<ntype>/predictions`` — int64 ``[N]``: the argmax.

They are **job tensors**, persistent, in the namespace of the job key that wrote them: a
job key may create and write its own job's tensors but never the graph's, so the writer
needs no admin key; the endpoint (and the job's trainers) joining with the same job key
read them, other jobs do not see them; they stay until deleted or the store stops
(``persistent``: not freed when the writer leaves). Written again by the next run.
"""

from __future__ import annotations

import time
from typing import Any, cast

import torch
from torch import Tensor

from graphrun.names import PolicyName
from graphrun.store.dist_tensor import DistTensor
from graphrun.train import inference
from graphrun.train.data import GraphData, NodeTable
from graphrun.train.models import ByLayer

TABLES = ("embeddings", "logits", "predictions")
EMBEDDINGS = "serving-embeddings"  # the node table the last layer reads
CHUNK = 65536  # rows per push


def table_name(ntype: str, what: str) -> str:
    return f"serving/{ntype}/{what}"


class Layers(torch.nn.Module):
    """Layers ``lo .. hi-1`` of ``model`` as a model of their own (what
    :func:`~graphrun.train.inference.layerwise` runs)."""

    def __init__(self, model: ByLayer, lo: int, hi: int) -> None:
        super().__init__()
        self.model, self.lo = model, lo
        self.convs = torch.nn.ModuleList(model.convs[lo:hi])

    def layer(self, i: int, x: Tensor, edge_index: Tensor, n_dst: int) -> Tensor:
        return self.model._layer(self.lo + i, x, edge_index, n_dst)


class Own:
    """``data`` as the embedding pass reads it: its scratch tables under names of its own
    (``serving-...``: never those of the job's trainers, whose evaluation may run at the
    same time in the same namespace), kept to be deleted when the pass is done; and, for the
    last layer, the stored embeddings as the node table ``EMBEDDINGS``."""

    def __init__(self, data: GraphData, table: NodeTable | None = None, width: int = 0) -> None:
        self.data, self.table, self.width = data, table, width
        self.scratch: list[NodeTable] = []

    def feature_dim(self, ntype: str, name: str) -> int | None:
        if name == EMBEDDINGS and self.table is not None:
            return self.width
        return self.data.feature_dim(ntype, name)

    def node_table(self, ntype: str, name: str, width: int | None = None) -> NodeTable:
        if width is not None:
            table = self.data.node_table(ntype, f"serving-{name}", width)
            self.scratch.append(table)
            return table
        if name == EMBEDDINGS and self.table is not None:
            return self.table
        return self.data.node_table(ntype, name)

    def delete_scratch(self) -> None:
        for t in self.scratch:
            if isinstance(t, DistTensor):
                t.delete()
        self.scratch.clear()

    def __getattr__(self, attr: str) -> object:
        return getattr(self.data, attr)


def _write(client: Any, name: str, rows: Tensor, ntype: str) -> None:
    t = DistTensor(
        client, name, shape=tuple(rows.shape), dtype=str(rows.dtype).replace("torch.", ""),
        policy=PolicyName.node(ntype), persistent=True,
    )  # fmt: skip
    for lo in range(0, rows.size(0), CHUNK):
        t[torch.arange(lo, min(lo + CHUNK, rows.size(0)))] = rows[lo : lo + CHUNK]


def embed(
    model: ByLayer, data: Any, ntype: str, feature: str, batch_size: int
) -> dict[str, float | int]:
    """Every node's embeddings, logits and predictions into the store (see the module
    docstring); what it took."""
    if not inference.supports(model, data):
        raise_unsupported()
    t0 = time.perf_counter()
    n = data.num_nodes(ntype)
    every = torch.arange(n)
    layers = len(model.convs)
    none = lambda: None  # noqa: E731  (one process: no other trainer to meet)
    client = data.graph.ctx.client
    head = Own(data)
    try:
        if layers > 1:
            emb = inference.layerwise(Layers(model, 0, layers - 1), cast(GraphData, head), ntype,
                                      feature, every, batch_size, none)  # fmt: skip
        else:
            emb = data.node_table(ntype, feature)[every].float()
    finally:
        head.delete_scratch()
    kept = table_name(ntype, "version")  # a --live pass's states: no longer all at it
    if any(t.name == kept for t in client.list_tensors(anywhere=True)):
        client.delete_tensor(kept)
    _write(client, table_name(ntype, "embeddings"), emb.contiguous(), ntype)
    stored = DistTensor(client, table_name(ntype, "embeddings"))
    tail = cast(GraphData, Own(data, stored, int(emb.size(1))))
    logits = inference.layerwise(Layers(model, layers - 1, layers), tail, ntype, EMBEDDINGS,
                                 every, batch_size, none)  # fmt: skip
    _write(client, table_name(ntype, "logits"), logits.contiguous(), ntype)
    _write(client, table_name(ntype, "predictions"), logits.argmax(-1).long(), ntype)
    return {"nodes": n, "embedding_dim": int(emb.size(1)), "classes": int(logits.size(1)),
            "full_pass_s": round(time.perf_counter() - t0, 3)}  # fmt: skip


def raise_unsupported() -> None:
    from graphrun.errors import ArgumentError

    raise ArgumentError("embed: layer-wise inference runs GraphSAGE and GAT on homogeneous graphs")
