"""Models for the built-in tasks, built from ``torch_geometric.nn`` layers.

Every model takes a PyG mini-batch as graphrun's loaders (and PyG's
``NeighborLoader``) produce it: the seeds first, then the nodes of each hop
(``num_sampled_nodes``), edges of hop 1 first (``num_sampled_edges``). Before layer
``i`` the batch is cut with :func:`torch_geometric.utils.trim_to_layer`, so each
layer computes only the nodes later layers still need — the message-flow graphs.

Aggregation path (``aggr_path``): ``"scatter"`` hands ``edge_index`` to the layer
(gather + scatter-reduce); ``"csr"`` first turns each trimmed layer into a sorted
compressed adjacency (a ``torch.sparse_csr`` ``adj_t``) so the layer runs one
sparse-dense matrix product. Sampled message-flow graphs have no duplicate edges,
so both give the same result; ``graphrun bench train --aggr`` measures them.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import HeteroConv, SAGEConv
from torch_geometric.utils import to_torch_csr_tensor, trim_to_layer

from graphrun.errors import ArgumentError

AggrPath = Literal["scatter", "csr"]
EdgeType = tuple[str, str, str]


def as_adj(edge_index: Tensor, num_src: int, num_dst: int, path: AggrPath) -> Tensor:
    """``edge_index`` (``[src; dst]``) in the form the chosen aggregation path wants."""
    if path == "scatter":
        return edge_index
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return to_torch_csr_tensor(edge_index.flip(0), size=(num_dst, num_src))


def _check_path(path: str) -> None:
    if path not in ("scatter", "csr"):
        raise ArgumentError(f"aggr_path: {path!r} is not 'scatter' or 'csr'")


class SAGE(torch.nn.Module):
    """GraphSAGE (mean aggregation) over message-flow graphs."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        num_layers: int,
        dropout: float = 0.5,
        aggr_path: AggrPath = "scatter",
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ArgumentError(f"num_layers: expected >= 1, got {num_layers}")
        _check_path(aggr_path)
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.convs = torch.nn.ModuleList(SAGEConv(a, b) for a, b in itertools.pairwise(dims))
        self.dropout = dropout
        self.aggr_path = aggr_path

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        num_sampled_nodes: Sequence[int] | None = None,
        num_sampled_edges: Sequence[int] | None = None,
    ) -> Tensor:
        for i, conv in enumerate(self.convs):
            if num_sampled_nodes is not None and num_sampled_edges is not None:
                x, edge_index, _ = trim_to_layer(
                    i, list(num_sampled_nodes), list(num_sampled_edges), x, edge_index
                )
            n = x.size(0)
            x = conv(x, as_adj(edge_index, n, n, self.aggr_path))
            if i < len(self.convs) - 1:
                x = F.dropout(F.relu(x), self.dropout, self.training)
        return x


class MLP(torch.nn.Module):
    """Two linear layers on node features alone (the no-graph baseline)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.lin1 = torch.nn.Linear(in_dim, hidden)
        self.lin2 = torch.nn.Linear(hidden, out_dim)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        return self.lin2(F.dropout(F.relu(self.lin1(x)), self.dropout, self.training))


class HeteroSAGE(torch.nn.Module):
    """R-GCN-style heterogeneous GNN: per relation a SAGEConv, summed per destination type
    (``torch_geometric.nn.HeteroConv``), over heterogeneous message-flow graphs."""

    def __init__(
        self,
        in_dims: Mapping[str, int],
        edge_types: Sequence[EdgeType],
        hidden: int,
        out_dim: int,
        num_layers: int,
        target: str,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        if target not in in_dims:
            raise ArgumentError(f"target node type {target!r} has no features")
        self.target = target
        self.dropout = dropout
        self.convs = torch.nn.ModuleList()
        dims = dict(in_dims)
        for i in range(num_layers):
            out = out_dim if i == num_layers - 1 else hidden
            rels = {
                et: SAGEConv((dims[et[0]], dims[et[2]]), out)
                for et in edge_types
                if et[0] in dims and et[2] in dims
            }
            self.convs.append(HeteroConv(rels, aggr="sum"))
            dims = dict.fromkeys(dims, out)

    def forward(
        self,
        x: dict[str, Tensor],
        edge_index: dict[EdgeType, Tensor],
        num_sampled_nodes: dict[str, list[int]] | None = None,
        num_sampled_edges: dict[EdgeType, list[int]] | None = None,
    ) -> Tensor:
        for i, conv in enumerate(self.convs):
            if num_sampled_nodes is not None and num_sampled_edges is not None:
                x, edge_index, _ = trim_to_layer(
                    i, num_sampled_nodes, num_sampled_edges, x, edge_index
                )
            out = conv(x, edge_index)
            # node types that receive no messages in this layer keep a zero state
            x = {t: out.get(t, x[t].new_zeros(x[t].size(0), self._out(i))) for t in x}
            if i < len(self.convs) - 1:
                x = {t: F.dropout(F.relu(v), self.dropout, self.training) for t, v in x.items()}
        return x[self.target]

    def _out(self, layer: int) -> int:
        hetero: HeteroConv = self.convs[layer]
        conv = next(iter(hetero.convs.values()))
        return int(conv.out_channels)


class LinkPredictor(torch.nn.Module):
    """A GraphSAGE encoder and a dot-product decoder for edge scores."""

    def __init__(
        self, in_dim: int, hidden: int, num_layers: int, dropout: float = 0.0,
        aggr_path: AggrPath = "scatter",
    ) -> None:  # fmt: skip
        super().__init__()
        self.encoder = SAGE(in_dim, hidden, hidden, num_layers, dropout, aggr_path)

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        pairs: Tensor,
        num_sampled_nodes: Sequence[int] | None = None,
        num_sampled_edges: Sequence[int] | None = None,
    ) -> Tensor:
        """Scores (logits) of the node pairs ``pairs[0] -> pairs[1]`` (local seed indices)."""
        h = self.encoder(x, edge_index, num_sampled_nodes, num_sampled_edges)
        return (h[pairs[0]] * h[pairs[1]]).sum(-1)
