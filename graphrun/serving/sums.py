"""Running sums: what GraphSAGE's first and last layers aggregate, kept per node.

A GraphSAGE layer is ``W_l · mean(h_in) + b + W_r · h``: linear in the sum of its
in-neighbours' rows. So beside the states (:mod:`graphrun.serving.refresh`) the kept
pass stores, per node, float64:

* ``serving/<ntype>/insum`` ``[N, F + 2]``: the sum of the in-neighbours' input features,
  the in-degree (the first layer's aggregation) and the row's stamp;
* ``serving/<ntype>/lastsum`` ``[N, C + 2]``: ``T``, the sum of ``W_l · h_u`` over the
  in-neighbours ``u`` (``h``: the last layer's input, ``C`` its width) plus ``max(d, 1)``
  times the node's own part ``W_r · h_v + b`` (``d`` its in-degree), then ``d`` and the
  row's stamp: the layer's output is ``T / max(d, 1)``;
* ``serving/<ntype>/lastown`` ``[N, 4C + 1]``: the node's own ``W_l · h_v`` (what it adds
  to its out-neighbours' sums: a refresh takes the old one away without reading ``h``)
  and ``W_r · h_v + b``, the same two before the row was last written, and its stamp;

new nodes' rows in ``grown/<table>``, as the states'. A refresh moves a sum by the edges
that changed (``graph_changes`` with ``edges``: each added edge adds its source's row,
each deleted one takes it away) and by the sources whose rows changed (the edges leaving
them, their old and new rows): the cost is those edges times the row's width, never a
node's whole in-neighbourhood. The first layer's sums of the nodes downstream of an
updated or new feature are recomputed over their in-edges (the feature's old value is
gone from the store). Each state is then computed afresh from its sums
(:func:`first_layer`; the last layer on the sums' servers,
:mod:`graphrun.store.sum_moves`): the float64 sums round at about 1e-16 of their size
an update, so nothing adds up over many refreshes in float32.

``lastsum`` holds the own part inside ``T`` so that a refresh moves one row of ``C + 2``
for each node of ``A_L`` (some 27k after 1,000 new edges on a 200k-node power-law
graph; on the row's own server, :mod:`graphrun.serving.moves`) and nothing else of
it: the own part changes only where ``h_v`` did (``A_{L-1}``), and the in-degree only
where an in-edge changed (inside ``A_1``), so ``lastown`` is read for ``A_{L-1}`` and
the changed edges' sources alone (about 2k), and written for ``A_{L-1}`` by the servers
that move the sums (from the projections and own parts they are sent for the moves).
The own parts are fp32 products (the layer's own), so ``max(d, 1)`` times one is exact
in float64 for any in-degree below ``2^29``.

A row's **stamp** (its last column) is the version it was moved (or summed) to. The
sums are the only states a refresh reads and then overwrites, so they are what a
refresh that fails partway leaves wrong for its retry: some partitions' rows moved,
others not. The stamp is in the row, so it is written with the row (a row is never split
across requests): a retry to the same version moves only the ``insum`` and ``lastsum``
rows not stamped with it, and takes a node's own rows at the version before from its
``lastown`` row's earlier copy where that row was written already (the other
partitions' sums still need its old ones taken away). :mod:`graphrun.serving.refresh`
says how a retry finds the version an interrupted refresh was moving to.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import SAGEConv

from graphrun.store import sum_kernels as kernels
from graphrun.train.models import ByLayer, csr_rows

INSUM, LASTSUM, LASTOWN = "insum", "lastsum", "lastown"
TABLES = (INSUM, LASTSUM, LASTOWN)


def widths(model: ByLayer) -> dict[str, int]:
    """The columns of each table of sums (module docstring)."""
    first, last = cast(SAGEConv, model.convs[0]), cast(SAGEConv, model.convs[-1])
    c = last.lin_l.out_channels
    return {INSUM: first.lin_l.in_channels + 2, LASTSUM: c + 2, LASTOWN: 4 * c + 1}


def stamped(sums: Tensor, version: int) -> Tensor:
    """Which rows (of any table of sums) were written at ``version``."""
    return sums[:, -1] == float(version)


def before(rows: Tensor, version: int) -> Tensor:
    """``[W_l · h, W_r · h + b]`` of each ``lastown`` row at the version before
    ``version``: its earlier copy where a try of that refresh wrote the row already."""
    c = (rows.size(1) - 1) // 2
    done = stamped(rows, version)
    if not bool(done.any()):  # no try of this refresh wrote one: the usual case
        return rows[:, :c]
    return torch.where(done[:, None], rows[:, c : 2 * c], rows[:, :c])


def first_layer(model: ByLayer, sums: Tensor, x: Tensor) -> Tensor:
    """Layer 1 (a hidden layer: ReLU after it) of nodes with ``sums`` (``insum`` rows)
    and input features ``x``."""
    conv = cast(SAGEConv, model.convs[0])
    width = x.size(1)
    mean = (sums[:, :width] / sums[:, width : width + 1].clamp(min=1)).float()
    return F.relu(conv.lin_l(mean) + conv.lin_r(x))


def project(model: ByLayer, h: Tensor) -> Tensor:
    """``W_l · h`` of the last layer (what its sum adds up)."""
    return F.linear(h, cast(SAGEConv, model.convs[-1]).lin_l.weight)


def own(model: ByLayer, h: Tensor) -> Tensor:
    """``W_r · h + b`` of the last layer: a node's own part, float64."""
    conv = cast(SAGEConv, model.convs[-1])
    return (conv.lin_r(h) + cast(Tensor, conv.lin_l.bias)).double()


def with_stamp(rows: Tensor, version: int) -> Tensor:
    """``rows`` with a last column, their stamp ``version``."""
    return torch.cat([rows, torch.full((len(rows), 1), float(version), dtype=rows.dtype)], 1)


def full_sums(
    model: ByLayer, last: bool, x: Tensor, edge_index: Tensor, n: int, version: int
) -> dict[str, Tensor]:
    """The first layer's (``insum``) or, ``last``, the last layer's (``lastsum``,
    ``lastown``) rows of the first ``n`` rows of ``x`` from the in-edges ``edge_index``
    (local ids: what :func:`graphrun.train.inference.gather` gives the layer), stamped
    ``version``: the layer's own gather-reduce (fp32, as its mean sums them) over the
    rows, projected first for the last layer; kept in float64, where refreshes add to
    them."""
    offsets, columns = csr_rows(edge_index, n)
    rows = project(model, x) if last else x
    got = F.embedding_bag(columns, rows, offsets, mode="sum", include_last_offset=True).double()
    deg = (offsets[1:] - offsets[:-1]).double()[:, None]
    if not last:
        return {INSUM: with_stamp(torch.cat([got, deg], dim=1), version)}
    mine = torch.cat([rows[:n].double(), own(model, x[:n])], dim=1)
    c = got.size(1)
    total = got + deg.clamp(min=1) * mine[:, c:]
    return {LASTSUM: with_stamp(torch.cat([total, deg], dim=1), version),
            LASTOWN: with_stamp(torch.cat([mine, mine], dim=1), version)}  # fmt: skip


def move(sums: Tensor, at: np.ndarray, rows: Tensor, src: np.ndarray, todo: Tensor,
         sign: Tensor | None = None) -> None:  # fmt: skip
    """Add ``rows[src]`` (times ``sign``, and ``sign`` to the in-degree: the changed
    edges) to the ``lastsum`` or ``insum`` rows ``sums[at]`` (each edge's destination),
    in place, where ``todo`` (rows an interrupted try moved already keep theirs)."""
    k = torch.ones(len(at), dtype=torch.float64) if sign is None else sign
    kernels.add_rows(sums.numpy(), at, rows.double().contiguous().numpy(), src, k.numpy(),
                     sign is not None, todo.numpy())  # fmt: skip


def signs(changed: np.ndarray) -> Tensor:
    """The changed edges' signs (``changed[2]``: +1 added, -1 deleted) as float64."""
    return torch.from_numpy(changed[2]).double()
