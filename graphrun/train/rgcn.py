"""R-GCN's layer (Schlichtkrull et al., "Modeling Relational Data with Graph Convolutional
Networks", ESWC 2018) over graphrun's heterogeneous message-flow graphs::

    h'_i = W_0 h_i + b + sum_r (1 / |N_r(i)|) sum_{j in N_r(i)} W_r h_j
    W_r  = sum_b a_rb V_b        (basis decomposition: B bases V_b shared by the relations)

One self-loop weight ``W_0`` and one bias for every node, one ``W_r`` per relation
(``r`` a canonical edge type), the messages of each relation averaged on their own.
Without ``num_bases`` every relation has its own ``W_r``; with it, a layer of ``R``
relations has ``min(num_bases, R)`` bases and an ``R x B`` coefficient matrix ``a``.

The parameters are laid out as PyG's :class:`~torch_geometric.nn.conv.RGCNConv` lays
them out (``weight``: bases or relations x in x out, ``comp``, ``root``, ``bias``), and
the layer computes what ``RGCNConv`` computes on the graph made homogeneous
(``to_homogeneous`` + ``edge_type``) with every node type's features zero-padded to the
widest — a node type with narrower features uses the first rows of each weight — without
building that graph each step: it runs over the per-type tensors and computes only each
type's message-flow-graph targets (the tests check the equality). It also avoids
``RGCNConv``'s ``segment_matmul`` path (with pyg-lib installed), which averages over all
of a node's in-edges rather than per relation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.inits import glorot, zeros
from torch_geometric.utils import scatter

from graphrun.errors import ArgumentError
from graphrun.names import CanonicalEtype


class RGCNLayer(torch.nn.Module):
    """One R-GCN layer over ``relations`` (see the module docstring): node states of at
    most ``in_dim`` channels in, ``out_dim`` out."""

    def __init__(
        self,
        relations: Sequence[CanonicalEtype],
        in_dim: int,
        out_dim: int,
        num_bases: int | None = None,
    ) -> None:
        super().__init__()
        if num_bases is not None and num_bases < 1:
            raise ArgumentError(f"num_bases: expected >= 1, got {num_bases}")
        self.relations: list[CanonicalEtype] = list(relations)
        r = len(self.relations)
        self.in_dim, self.out_dim = in_dim, out_dim
        self.num_bases = min(num_bases, r) if num_bases is not None and r else None
        if self.num_bases is None:
            self.weight = Parameter(torch.empty(r, in_dim, out_dim))
            self.register_parameter("comp", None)
        else:
            self.weight = Parameter(torch.empty(self.num_bases, in_dim, out_dim))
            self.comp = Parameter(torch.empty(r, self.num_bases))
        self.root = Parameter(torch.empty(in_dim, out_dim))
        self.bias = Parameter(torch.empty(out_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``RGCNConv``'s initialisation: Glorot for the weights, zero bias."""
        glorot(self.weight)
        glorot(self.comp)
        glorot(self.root)
        zeros(self.bias)

    def relation_weights(self) -> Tensor:
        """``W_r`` of every relation, ``(relations, in_dim, out_dim)``."""
        if self.comp is None:
            return self.weight
        bases = self.weight.view(self.weight.size(0), -1)
        return (self.comp @ bases).view(-1, self.in_dim, self.out_dim)

    def forward(
        self,
        x: Mapping[str, Tensor],
        edge_index: Mapping[CanonicalEtype, Tensor],
        n_dst: Mapping[str, int],
    ) -> dict[str, Tensor]:
        """The new states of the first ``n_dst[t]`` nodes of every type ``t`` of ``x``
        from the edges of each relation (``[src; dst]`` local ids; a relation without
        edges contributes nothing but stays in the graph, as DDP needs)."""
        for t, h in x.items():
            if h.size(1) > self.in_dim:
                raise ArgumentError(
                    f"node type {t!r}: {h.size(1)} channels, the layer takes {self.in_dim}"
                )
        w = self.relation_weights()
        out = {t: h[: n_dst[t]] @ self.root[: h.size(1)] + self.bias for t, h in x.items()}
        for k, et in enumerate(self.relations):
            src, _, dst = et
            if src not in x or dst not in x:
                continue
            h = x[src]
            e = edge_index.get(et)
            if e is None:
                e = h.new_zeros((2, 0), dtype=torch.long)
            mean = scatter(h[e[0]], e[1], dim=0, dim_size=n_dst[dst], reduce="mean")
            out[dst] = out[dst] + mean @ w[k, : h.size(1)]
        return out
