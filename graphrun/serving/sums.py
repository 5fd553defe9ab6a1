"""Running sums: what GraphSAGE's first and last layers aggregate, kept per node.

A GraphSAGE layer is ``W_l · mean(h_in) + b + W_r · h``: linear in the sum of its
in-neighbours' rows. So beside the states (:mod:`graphrun.serving.refresh`) the kept
pass stores, per node, float64:

* ``serving/<ntype>/insum`` ``[N, F + 2]``: the sum of the in-neighbours' input features,
  the in-degree (the first layer's aggregation) and the row's stamp;
* ``serving/<ntype>/lastsum`` ``[N, 4C + 2]``: the sum of ``W_l · h_u`` over the
  in-neighbours ``u`` (``h``: the last layer's input), ``W_r · h_v + b`` (the last
  layer's two parts, ``C`` its width), the node's own ``W_l · h_v`` (what it adds to its
  out-neighbours' sums: a refresh takes the old one away without reading ``h``), the
  in-degree, the own ``W_l · h_v`` before the row was last moved, and the row's stamp;

new nodes' rows in ``grown/insum`` and ``grown/lastsum``, as the states'. A refresh
moves a sum by the edges that changed (``graph_changes`` with ``edges``: each added edge
adds its source's row, each deleted one takes it away) and by the sources whose rows
changed (the edges leaving them, their old and new rows): the cost is those edges times
the row's width, never a node's whole in-neighbourhood. The first layer's sums of the
nodes downstream of an updated or new feature are recomputed over their in-edges (the
feature's old value is gone from the store). Each state is then computed afresh from
its sums (:func:`first_layer`, :func:`last_layer`): the float64 sums round at about
1e-16 of their size an update, so nothing adds up over many refreshes in float32.

A row's **stamp** (its last column) is the version its sums were moved (or summed) to.
The sums are the only states a refresh reads and then overwrites, so they are what a
refresh that fails partway leaves wrong for its retry: some partitions' rows moved,
others not. The stamp is in the row, so it is written with the sums (a row is never
split across requests): a retry to the same version moves only the rows not stamped
with it, and reads the source's own ``W_l · h_v`` at the version before from the row's
earlier copy where the row was moved already (the other partitions' rows still need
its old one taken away). :mod:`graphrun.serving.refresh` says how a retry finds the
version an interrupted refresh was moving to.
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


def classes(sums: Tensor) -> int:
    """``C``, the last layer's width, of ``lastsum`` rows."""
    return (sums.size(1) - 2) // 4


def widths(model: ByLayer) -> dict[str, int]:
    """The columns of each table of sums: ``insum`` ``F + 2``, ``lastsum`` ``4C + 2``."""
    first, last = cast(SAGEConv, model.convs[0]), cast(SAGEConv, model.convs[-1])
    return {INSUM: first.lin_l.in_channels + 2, LASTSUM: 4 * last.lin_l.out_channels + 2}


def stamped(sums: Tensor, version: int) -> Tensor:
    """Which rows (``insum`` or ``lastsum``) were moved to ``version`` already."""
    return sums[:, -1] == float(version)


def first_layer(model: ByLayer, sums: Tensor, x: Tensor) -> Tensor:
    """Layer 1 (a hidden layer: ReLU after it) of nodes with ``sums`` (``insum`` rows)
    and input features ``x``."""
    conv = cast(SAGEConv, model.convs[0])
    width = x.size(1)
    mean = (sums[:, :width] / sums[:, width : width + 1].clamp(min=1)).float()
    return F.relu(conv.lin_l(mean) + conv.lin_r(x))


def last_layer(sums: Tensor) -> Tensor:
    """The last layer's output from ``lastsum`` rows."""
    c = classes(sums)
    deg = sums[:, 3 * c : 3 * c + 1].clamp(min=1)
    return (sums[:, :c] / deg + sums[:, c : 2 * c]).float()


def project(model: ByLayer, h: Tensor) -> Tensor:
    """``W_l · h`` of the last layer (what its sum adds up)."""
    return F.linear(h, cast(SAGEConv, model.convs[-1]).lin_l.weight)


def own(model: ByLayer, h: Tensor) -> Tensor:
    """``W_r · h + b`` of the last layer: a node's own part, float64."""
    conv = cast(SAGEConv, model.convs[-1])
    return (conv.lin_r(h) + cast(Tensor, conv.lin_l.bias)).double()


def full_sums(
    model: ByLayer, last: bool, x: Tensor, edge_index: Tensor, n: int, version: int
) -> Tensor:
    """The first layer's (``insum``) or, ``last``, the last layer's (``lastsum``) sums
    of the first ``n`` rows of ``x`` from the in-edges ``edge_index`` (local ids: what
    :func:`graphrun.train.inference.gather` gives the layer), stamped ``version``: the
    layer's own gather-reduce (fp32, as its mean sums them) over the rows, projected
    first for the last layer; kept in float64, where refreshes add to them."""
    offsets, columns = csr_rows(edge_index, n)
    rows = project(model, x) if last else x
    got = F.embedding_bag(columns, rows, offsets, mode="sum", include_last_offset=True).double()
    deg = (offsets[1:] - offsets[:-1]).double()[:, None]
    stamp = torch.full((n, 1), float(version), dtype=torch.float64)
    if not last:
        return torch.cat([got, deg, stamp], dim=1)
    q = rows[:n].double()
    return torch.cat([got, own(model, x[:n]), q, deg, q, stamp], dim=1)


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
