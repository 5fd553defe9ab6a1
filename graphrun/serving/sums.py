"""Running sums: what GraphSAGE's first and last layers aggregate, kept per node.

A GraphSAGE layer is ``W_l · mean(h_in) + b + W_r · h``: linear in the sum of its
in-neighbours' rows. So beside the states (:mod:`graphrun.serving.refresh`) the kept
pass stores, per node, float64:

* ``serving/<ntype>/insum`` ``[N, F + 1]``: the sum of the in-neighbours' input features
  and the in-degree (the first layer's aggregation);
* ``serving/<ntype>/lastsum`` ``[N, 3C + 1]``: the sum of ``W_l · h_u`` over the
  in-neighbours ``u`` (``h``: the last layer's input), ``W_r · h_v + b`` (the last
  layer's two parts, ``C`` its width), the node's own ``W_l · h_v`` (what it adds to its
  out-neighbours' sums: a refresh takes the old one away without reading ``h``), and the
  in-degree;

new nodes' rows in ``grown/insum`` and ``grown/lastsum``, as the states'. A refresh
moves a sum by the edges that changed (``graph_changes`` with ``edges``: each added edge
adds its source's row, each deleted one takes it away) and by the sources whose rows
changed (the edges leaving them, their old and new rows): the cost is those edges times
the row's width, never a node's whole in-neighbourhood. The first layer's sums of the
nodes downstream of an updated or new feature are recomputed over their in-edges (the
feature's old value is gone from the store). Each state is then computed afresh from
its sums (:func:`first_layer`, :func:`last_layer`): the float64 sums round at about
1e-16 of their size an update, so nothing adds up over many refreshes in float32.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import SAGEConv

from graphrun.train.models import ByLayer, csr_rows

INSUM, LASTSUM = "insum", "lastsum"


def first_layer(model: ByLayer, sums: Tensor, x: Tensor) -> Tensor:
    """Layer 1 (a hidden layer: ReLU after it) of nodes with ``sums`` (``insum`` rows)
    and input features ``x``."""
    conv = cast(SAGEConv, model.convs[0])
    width = x.size(1)
    mean = (sums[:, :width] / sums[:, width:].clamp(min=1)).float()
    return F.relu(conv.lin_l(mean) + conv.lin_r(x))


def last_layer(sums: Tensor) -> Tensor:
    """The last layer's output from ``lastsum`` rows."""
    c = (sums.size(1) - 1) // 3
    return (sums[:, :c] / sums[:, 3 * c :].clamp(min=1) + sums[:, c : 2 * c]).float()


def project(model: ByLayer, h: Tensor) -> Tensor:
    """``W_l · h`` of the last layer (what its sum adds up)."""
    return F.linear(h, cast(SAGEConv, model.convs[-1]).lin_l.weight)


def own(model: ByLayer, h: Tensor) -> Tensor:
    """``W_r · h + b`` of the last layer: a node's own part, float64."""
    conv = cast(SAGEConv, model.convs[-1])
    return (conv.lin_r(h) + cast(Tensor, conv.lin_l.bias)).double()


def full_sums(model: ByLayer, last: bool, x: Tensor, edge_index: Tensor, n: int) -> Tensor:
    """The first layer's (``insum``) or, ``last``, the last layer's (``lastsum``) sums
    of the first ``n`` rows of ``x`` from the in-edges ``edge_index`` (local ids: what
    :func:`graphrun.train.inference.gather` gives the layer): the layer's own
    gather-reduce (fp32, as its mean sums them) over the rows, projected first for the
    last layer; kept in float64, where refreshes add to them."""
    offsets, columns = csr_rows(edge_index, n)
    rows = project(model, x) if last else x
    got = F.embedding_bag(columns, rows, offsets, mode="sum", include_last_offset=True).double()
    deg = (offsets[1:] - offsets[:-1]).double()[:, None]
    parts = [got, own(model, x[:n]), rows[:n].double(), deg] if last else [got, deg]
    return torch.cat(parts, dim=1)


def moved(changed: np.ndarray, ids: np.ndarray, rows: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """What the changed edges ``changed`` ((src, dst, sign) into ``ids``, sorted) add to
    the sums of ``ids``: ``sign * rows`` of each edge's source (``rows[j]`` the source of
    edge ``j``), and the degree's change; ``([len(ids), width], [len(ids)])`` float64."""
    at = torch.from_numpy(np.searchsorted(ids, changed[1]))
    sign = torch.from_numpy(changed[2]).double()
    add = torch.zeros(len(ids), width, dtype=torch.float64)
    add.index_add_(0, at, rows.double() * sign[:, None])
    deg = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, at, sign)
    return add, deg
