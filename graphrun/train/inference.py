"""Layer-wise full-neighbour inference: evaluation whose cost follows the graph, not the fanouts.

Sampled evaluation runs the model over a sampled L-hop neighbourhood of every evaluated
node, so the same hub's states are recomputed for every batch that reaches it. Layer-wise
inference — the way DGL's and PyG's examples evaluate large graphs — computes every layer
once per node, over the node's whole in-neighbourhood:

1. layers ``0 .. L-2``: each trainer computes its share of all nodes
   (:meth:`GraphData.cover` ``(None)``) in batches of targets: read the input states of
   the targets and their in-neighbours (:meth:`GraphData.in_edges`), run the layer
   (``model.layer``), write the targets' outputs into a table every trainer shares
   (:meth:`GraphData.node_table` with a width: a store tensor in a distributed job);
   then all trainers meet (``sync``) before anyone reads the table;
2. layer ``L-1``: only the nodes being evaluated.

A model with ``layer_from_table`` (GraphSAGE) on a table in this process's memory (one
machine: :class:`~graphrun.train.data.LocalData`) reads the rows it averages straight from
the table by id (:meth:`~graphrun.train.models.SAGE.layer_from_table`); otherwise each
batch's rows are copied out once, relabelled (:func:`gather`). The direct read saves the
copy of every batch's in-neighbour rows, which dominated a layer over a whole graph
(benchmarks/README.md, "Kernels"). In a distributed job (a store table) GraphSAGE reads
the rows of the partition on this machine — a trainer's targets and most of their
in-neighbours — in place from the server's shared memory by id, and pulls only the
other partitions' rows, each once a batch (:func:`split_mean`,
``SAGE.layer_from_mean``).

In eval mode the result equals the model's output on sampled neighbourhoods with every
fanout -1 (all neighbours); a test holds the two together. Models with a ``layer(i, x,
edge_index, n_dst)`` method (GraphSAGE and GAT) support it on homogeneous graphs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Protocol, cast

import torch
from torch import Tensor

from graphrun.train.aggregate import mean_split
from graphrun.train.data import ArrayRows, GraphData, NodeTable

#: Targets per batch at least: a batch's sources are read once however many of its
#: targets share them (benchmarks/README.md measures 4096 against 1000).
MIN_BATCH = 4096


class Layered(Protocol):
    """A model run one layer at a time: GraphSAGE's and GAT's ``layer`` and ``convs``."""

    convs: torch.nn.ModuleList

    def layer(self, i: int, x: Tensor, edge_index: Tensor, n_dst: int) -> Tensor: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...


def supports(model: torch.nn.Module, data: GraphData) -> bool:
    """Whether layer-wise inference can run this model on this graph."""
    return hasattr(model, "layer") and hasattr(model, "convs") and len(data.edge_types) == 1


def _batch(
    model: Layered,
    i: int,
    h: NodeTable,
    dst: Tensor,
    data: GraphData,
    device: torch.device | None = None,
) -> Tensor:
    """Layer ``i``'s outputs for the nodes ``dst`` from the states ``h`` of their whole
    in-neighbourhoods (computed on ``device``, returned on the host)."""
    cpu = device is None or device.type == "cpu"
    table = local_rows(h)
    direct = getattr(model, "layer_from_table", None)
    if table is not None and direct is not None and cpu:
        src, index = data.in_edges(dst)
        out: Tensor = direct(i, table, dst, src, index)
        return out
    by_mean = getattr(model, "layer_from_mean", None)
    block = local_block(h, dst) if by_mean is not None and cpu else None
    if by_mean is not None and block is not None:
        mean, target = split_mean(h, block, dst, data)
        out = by_mean(i, mean, target)
        return out
    x, edge_index = gather(h, dst, data)
    if device is not None and device.type != "cpu":
        x, edge_index = x.to(device, non_blocking=True), edge_index.to(device, non_blocking=True)
        return model.layer(i, x, edge_index, dst.numel()).cpu()
    return model.layer(i, x, edge_index, dst.numel())


def local_rows(h: NodeTable) -> Tensor | None:
    """``h`` as one float32 tensor of every node's row in this process's memory (a
    scratch table of :class:`~graphrun.train.data.LocalData`, or the graph's own features),
    or None (a store table: its rows are fetched by id, :func:`gather`)."""
    if isinstance(h, ArrayRows):
        with warnings.catch_warnings():  # a read-only memory map: the layer only reads it
            warnings.simplefilter("ignore", UserWarning)
            h = torch.from_numpy(h.arr)
    if not isinstance(h, Tensor) or h.dtype != torch.float32 or h.dim() != 2:
        return None
    return h if h.is_contiguous() else None


def local_block(h: NodeTable, near: Tensor) -> tuple[int, Tensor] | None:
    """The float32 rows ``first ..`` of ``h`` (a store table) that a partition on this
    machine holds (the one owning most of ``near``), in its shared memory, and ``first``;
    None otherwise."""
    get = getattr(h, "local_block", None)
    block: tuple[int, Tensor] | None = get(near) if get is not None else None
    if block is None or block[1].dtype != torch.float32 or block[1].dim() != 2:
        return None
    return block


def split_mean(
    h: NodeTable, block: tuple[int, Tensor], dst: Tensor, data: GraphData
) -> tuple[Tensor, Tensor]:
    """The mean over the in-neighbours of ``dst`` and their own rows of ``h``, a store
    table whose rows ``block`` are in this machine's shared memory: those are read in
    place by id (:func:`~graphrun.train.aggregate.mean_split`), the others pulled once
    each (sources and targets together, one request per owner)."""
    first, rows = block
    src, index = data.in_edges(dst)
    if index.numel() > 1 and not bool((index[1:] >= index[:-1]).all()):
        order = torch.argsort(index, stable=True)  # grouped by owner server, not in order
        src, index = src[order], index[order]
    near = (src >= first) & (src < first + rows.size(0))
    here = (dst >= first) & (dst < first + rows.size(0))
    far, away = ~near, ~here
    wanted, inverse = torch.unique(torch.cat([src[far], dst[away]]), return_inverse=True)
    pulled = h[wanted].float() if wanted.numel() else rows[:0]
    n_far = int(far.sum())
    parts = [(rows, src[near] - first, index[near]), (pulled, inverse[:n_far], index[far])]
    mean = mean_split(parts, dst.numel())
    target = torch.empty(dst.numel(), rows.size(1))
    target[here] = rows[dst[here] - first]
    target[away] = pulled[inverse[n_far:]]
    return mean, target


def gather(h: NodeTable, dst: Tensor, data: GraphData) -> tuple[Tensor, Tensor]:
    """The input of a layer for the nodes ``dst``: ``(x, edge_index)``, the rows of
    ``dst`` (first, in their order) and of their in-neighbours (each once), and their
    in-edges in those rows' local ids."""
    src, index = data.in_edges(dst)
    nodes, inverse = torch.unique(torch.cat([dst, src]), return_inverse=True)
    # local ids: the targets first (the layer computes the first n_dst rows), then the rest
    local = torch.full((nodes.numel(),), -1, dtype=torch.long)
    local[inverse[: dst.numel()]] = torch.arange(dst.numel())
    rest = torch.nonzero(local < 0).squeeze(1)
    local[rest] = torch.arange(dst.numel(), nodes.numel())
    order = torch.empty_like(nodes)
    order[local] = nodes
    return h[order].float(), torch.stack([local[inverse[dst.numel() :]], index])


def chunk_targets(
    batch_size: int, free_bytes: int | None, width: int, avg_degree: float, fraction: float = 0.5
) -> int:
    """Targets per batch of one layer: at least ``max(batch_size, MIN_BATCH)``; on a GPU
    (``free_bytes`` known) as many as ``fraction`` of its free memory holds, counting each
    target's input rows (itself and its in-neighbours), the messages and the output
    (four bytes a column, three times over for the layer's temporaries)."""
    floor = max(batch_size, MIN_BATCH)
    if free_bytes is None:
        return floor
    per_target = int((1.0 + avg_degree) * max(width, 1) * 4 * 3) + 64
    return max(floor, int(free_bytes * fraction) // per_target)


def _width(model: Layered, i: int, in_width: int) -> int:
    """Output columns of layer ``i`` (run on one node without edges)."""
    device = next(model.parameters()).device
    empty = torch.empty((2, 0), dtype=torch.long, device=device)
    x = torch.zeros(1, in_width, device=device)
    return int(model.layer(i, x, empty, 1).size(1))


@torch.no_grad()
def layerwise(
    model: torch.nn.Module,
    data: GraphData,
    ntype: str,
    x: str,
    targets: Tensor,
    batch_size: int,
    sync: Callable[[], None],
    device: torch.device | None = None,
) -> Tensor:
    """The model's outputs for ``targets`` (per-type ids of ``ntype``), input feature
    ``x``; every trainer of the job calls it together (``sync`` is their barrier). On a
    GPU ``device`` each batch of targets is as large as half its free memory holds
    (:func:`chunk_targets`); the tables stay on the host."""
    model.eval()
    layered = cast(Layered, model)  # supports() held
    layers = len(layered.convs)
    h: NodeTable = data.node_table(ntype, x)
    width = data.feature_dim(ntype, x) or 1
    nodes = data.cover(None, ntype) if layers > 1 else targets
    for i in range(layers):
        last = i == layers - 1
        ids = targets if last else nodes
        in_width, width = width, _width(layered, i, width)
        out: NodeTable
        if last:
            out = torch.empty(ids.numel(), width)
        else:  # two tables, alternating: a layer never writes the table it reads
            out = data.node_table(ntype, f"layerwise{i % 2}", width)
        free, degree = None, 0.0
        if device is not None and device.type == "cuda" and ids.numel():
            free = torch.cuda.mem_get_info(device)[0]
            probe = ids[:1024]  # the in-degree of a sample of the targets
            degree = data.in_edges(probe)[0].numel() / probe.numel()
        step = chunk_targets(batch_size, free, max(in_width, width), degree)
        for lo in range(0, ids.numel(), step):
            dst = ids[lo : lo + step]
            y = _batch(layered, i, h, dst, data, device)
            if last:
                out[torch.arange(lo, lo + dst.numel())] = y
            else:
                out[dst] = y
        sync()  # every share of this layer is written before the next one reads it
        h = out
    assert isinstance(h, Tensor)
    return h
