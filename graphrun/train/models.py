"""Models for the built-in tasks, built from ``torch_geometric.nn`` layers.

Every model takes a PyG mini-batch as graphrun's loaders (and PyG's
``NeighborLoader``) produce it: the seeds first, then the nodes of each hop
(``num_sampled_nodes``), edges of hop 1 first (``num_sampled_edges``). With those
counts each layer runs over its message-flow graph only: layer ``i`` of ``L`` reads the
edges of hops ``1..L-i`` and computes only their destinations (the seeds and hops
``1..L-i-1``, :func:`mfg_targets`), handing ``SAGEConv`` the bipartite pair
``(x, x[:targets])`` (per node type in the heterogeneous model). PyG's
:func:`~torch_geometric.utils.trim_to_layer` drops the same edges but still computes
every remaining node (benchmarks/README.md, "step", measures the difference).

Aggregation path (``aggr_path``): ``"scatter"`` hands ``edge_index`` to the layer
(gather + scatter-reduce); ``"csr"`` first turns each layer into its compressed rows
and takes the mean over each row in one fused kernel each way
(:mod:`graphrun.train.aggregate`: ``F.embedding_bag`` forward, no atomics, no ``[edges,
F]`` temporary; its gradient one numba pass over the same CSR). It replaced a
``torch.sparse_csr`` sparse-dense product (:func:`as_adj`, MKL), about half as fast on
the sampled batches (benchmarks/README.md, "Kernels"). Sampled message-flow graphs
have no duplicate edges, so every path gives the same result; ``graphrun bench train
--aggr`` measures them.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv, HeteroConv, SAGEConv

from graphrun.errors import ArgumentError
from graphrun.names import CanonicalEtype
from graphrun.train.activation import bf16_exact, fused, mask_bits, relu_dropout
from graphrun.train.aggregate import csr_rows, mean_csr, offsets_of
from graphrun.train.names import AggrPath
from graphrun.train.rgcn import RGCNLayer

Precision = Literal["fp32", "bf16"]
#: bf16 layers compute a multiple of this many target rows (see ``SAGE.layer``)
BF16_ROWS = 1024


def resolve_precision(precision: str) -> Precision:
    """``training.precision`` for this machine: ``auto`` is ``bf16`` where the CPU has a
    native bf16 product (AMX tiles or AVX-512 BF16), else ``fp32``."""
    if precision == "auto":
        native = (
            getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
            or getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        )
        return "bf16" if native else "fp32"
    if precision not in ("fp32", "bf16"):
        raise ArgumentError(f"precision: {precision!r} is not 'auto', 'fp32' or 'bf16'")
    return "bf16" if precision == "bf16" else "fp32"


def as_adj(edge_index: Tensor, num_src: int, num_dst: int, path: AggrPath) -> Tensor:
    """``edge_index`` (``[src; dst]``) in the form the chosen aggregation path wants.

    ``"csr"``: the ``num_dst x num_src`` adjacency in ``torch.sparse_csr`` layout, each
    row's values ``1 / degree``, so that a plain sparse-dense product is the mean over
    in-neighbours (faster than ``torch.sparse.mm`` with ``reduce="mean"``; see
    benchmarks/README.md). The ``csr`` path's kernel until :func:`mean_csr` replaced it;
    the tests hold that one to this product. The samplers emit edges
    grouped by destination in order, so the rows usually need no sort (checked; a
    stable sort otherwise)."""
    if path == "scatter":
        return edge_index
    src, dst = edge_index[0], edge_index[1]
    if dst.numel() > 1 and not bool((dst[1:] >= dst[:-1]).all()):
        order = torch.argsort(dst, stable=True)
        src, dst = src[order], dst[order]
    deg = torch.bincount(dst, minlength=num_dst)
    crow = torch.zeros(num_dst + 1, dtype=torch.int64, device=dst.device)
    torch.cumsum(deg, 0, out=crow[1:])
    values = (1.0 / deg.clamp_min(1).to(torch.float32))[dst]
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, src, values, size=(num_dst, num_src))


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout`` with the same distribution (keep with probability ``1 - p``, scale by
    ``1 / (1 - p)``), its mask drawn by numpy's PCG64 from a seed drawn from torch's
    generator — so ``torch.manual_seed`` and checkpointed torch RNG states still fix it.
    One byte per element when ``p`` is a multiple of 1/256 (0.5, 0.25, ...: exact), two
    otherwise (``p`` to 1/65536), PCG64's 64-bit words as they come (``Generator.bytes``
    draws them 32 bits at a time through its bounded-integer path: a [12k, 128] layer's
    dropout 2.3-2.4 -> 1.7-2.0 CPU-ms); the scaled mask is made in one pass. On CPU it
    is several times faster than ``F.dropout``'s ``bernoulli_`` (benchmarks/README.md).
    bf16 ``x`` with a scale exact in bf16 is masked in bf16 (a mask of 2-byte bit
    patterns: what the fp32 product then cast gives, bit for bit); otherwise the product
    is taken in fp32 and cast to ``x``'s dtype.
    """
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return torch.zeros_like(x)
    if x.device.type != "cpu":  # the device's own kernel: no mask crosses from the host
        return F.dropout(x, p, training=True)
    bits, threshold = mask_bits(x.numel(), p)
    keep = np.greater_equal(bits, threshold)
    scale = np.float32(1.0 / (1.0 - p))
    if x.dtype == torch.bfloat16 and bf16_exact(float(scale)):
        return x * _bf16_mask(keep, scale).reshape(x.shape)
    mask = np.multiply(keep, scale, dtype=np.float32).reshape(tuple(x.shape))
    return (x * torch.from_numpy(mask)).to(x.dtype)


def _bf16_mask(keep: np.ndarray, scale: np.float32) -> Tensor:
    """``keep * scale`` in bf16 (``scale`` exact in bf16), made as its bit patterns: one
    pass of two bytes an element."""
    pattern = int(np.array([scale], dtype=np.float32).view(np.uint32)[0] >> 16)
    return torch.from_numpy(np.multiply(keep, np.uint16(pattern), dtype=np.uint16)).view(
        torch.bfloat16
    )


def mfg_targets(num_sampled_nodes: Sequence[int], num_layers: int, layer: int) -> int:
    """How many nodes layer ``layer`` of ``num_layers`` must compute: the destinations of its
    message-flow graph, i.e. the seeds and the hops that later layers still read
    (``sum(num_sampled_nodes[: num_layers - layer])``). The rest of the trimmed ``x`` is
    only a source of messages."""
    return int(sum(num_sampled_nodes[: num_layers - layer]))


def mfg_edges(
    edge_index: Tensor, num_sampled_edges: Sequence[int], num_layers: int, layer: int
) -> Tensor:
    """The edges layer ``layer`` of ``num_layers`` reads: those of hops ``1..L-layer``,
    the first ``sum(num_sampled_edges[: num_layers - layer])`` columns."""
    return edge_index[:, : sum(num_sampled_edges[: num_layers - layer])]


def mfg_forward(
    layer: Callable[[int, Tensor, Tensor, int], Tensor],
    num_layers: int,
    x: Tensor,
    edge_index: Tensor,
    num_sampled_nodes: Sequence[int] | None = None,
    num_sampled_edges: Sequence[int] | None = None,
) -> Tensor:
    """``layer(i, x, edges, n_dst)`` for ``i`` in ``0..num_layers-1``: over the whole
    graph, or with PyG's ``num_sampled_nodes``/``num_sampled_edges`` over layer ``i``'s
    message-flow graph (its edges, its destinations; :func:`mfg_edges`,
    :func:`mfg_targets`). The forward of every model here that computes by layers."""
    for i in range(num_layers):
        n_dst, edges = x.size(0), edge_index
        if num_sampled_nodes is not None and num_sampled_edges is not None:
            n_dst = mfg_targets(num_sampled_nodes, num_layers, i)
            edges = mfg_edges(edge_index, num_sampled_edges, num_layers, i)
        x = layer(i, x, edges, n_dst)
    return x


class ByLayer(torch.nn.Module):
    """A model computed layer by layer over message-flow graphs (SAGE, GAT, GCN): its
    ``convs`` and ``_layer(i, x, edges, n_dst)`` make the one forward,
    :func:`mfg_forward`. Those that compute destinations only also name it ``layer``,
    which layer-wise inference calls."""

    convs: torch.nn.ModuleList

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        num_sampled_nodes: Sequence[int] | None = None,
        num_sampled_edges: Sequence[int] | None = None,
    ) -> Tensor:
        return mfg_forward(self._layer, len(self.convs), x, edge_index, num_sampled_nodes,
                           num_sampled_edges)  # fmt: skip

    def _layer(self, i: int, x: Tensor, edge_index: Tensor, n_dst: int) -> Tensor:
        raise NotImplementedError


def _check_path(path: str) -> None:
    if path not in ("scatter", "csr"):
        raise ArgumentError(f"aggr_path: {path!r} is not 'scatter' or 'csr'")


class SAGE(ByLayer):
    """GraphSAGE (mean aggregation) over message-flow graphs.

    On the ``csr`` path a layer is ``SAGEConv``'s forward written out — ``lin_l`` of the
    mean of the in-neighbours plus ``lin_r`` of the target itself — so that ``precision``
    ``"bf16"`` can run the two linear layers as one bf16 product (``[mean | x] @ [W_l |
    W_r]^T``: one cast of each side). In bf16 the layer's input is cast once and the mean
    gathered from the bf16 rows (half the bytes; sums in fp32, the mean rounded to bf16 as
    the product reads it anyway); the parameters and their gradients stay fp32 (the
    scatter path is always fp32). What bf16 saves is in benchmarks/README.md.

    Training on a CPU, a hidden layer's output stays bf16, its ReLU and dropout in bf16
    (a GPU's layers as before, untested here): the next layer casts it to bf16 anyway,
    and ReLU and a dropout scale exact in bf16 (0.5's 2.0) round nothing, so values and
    gradients are those of the fp32 round trip bit for bit at half the bytes of each pass
    (no ``.float()`` copy, no cast back). The ReLU and dropout are then one numba pass
    each way (:mod:`graphrun.train.activation`, the same bits again). Its rows padded to
    ``BF16_ROWS`` stay too (the next layer reads none of them; slicing them off would
    cost a zeroed copy of the gradient in the backward). Evaluation keeps the fp32
    activations and the exact row count (layer-wise inference writes them into its
    tables)."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        num_layers: int,
        dropout: float = 0.5,
        aggr_path: AggrPath = "scatter",
        precision: Precision = "fp32",
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ArgumentError(f"num_layers: expected >= 1, got {num_layers}")
        _check_path(aggr_path)
        if precision not in ("fp32", "bf16"):
            raise ArgumentError(f"precision: {precision!r} is not 'fp32' or 'bf16'")
        self.precision = precision
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.convs = torch.nn.ModuleList(SAGEConv(a, b) for a, b in itertools.pairwise(dims))
        self.dropout = dropout
        self.aggr_path = aggr_path

    @property
    def reads_bf16(self) -> bool:
        """Whether layer 0 reads its input rows in bf16 (the ``csr`` path in bf16): its
        batches may then bring them in bf16 (the fetch converts each row as it copies it,
        and the layer's cast is none; the same values)."""
        return self.precision == "bf16" and self.aggr_path == "csr"

    def layer(self, i: int, x: Tensor, edge_index: Tensor, n_dst: int) -> Tensor:
        """Layer ``i`` alone: the states of the first ``n_dst`` nodes of ``x`` from their
        in-edges ``edge_index`` (local ids; what layer-wise inference calls)."""
        n_src = x.size(0)
        conv = cast(SAGEConv, self.convs[i])
        if self.aggr_path == "csr":  # SAGEConv's forward, the mean one fused kernel
            bf16 = self.precision == "bf16"
            # oneDNN builds its bf16 kernels per shape: row counts rounded up to a multiple
            # of BF16_ROWS (empty rows) let batches share them (benchmarks/README.md)
            rows = min(-(-n_dst // BF16_ROWS) * BF16_ROWS, n_src) if bf16 else n_dst
            offsets, columns = csr_rows(edge_index, rows)
            if bf16:
                x = x.to(torch.bfloat16)  # once (none for bf16 rows): half the bytes
            # training on a CPU: a bf16 hidden layer's output stays bf16, padding and all
            hidden = i < len(self.convs) - 1
            kept = bf16 and self.training and hidden and x.device.type == "cpu"
            x = self._dense(conv, mean_csr(x, offsets, columns), x[:rows], kept)
            if rows > n_dst and not kept:  # its backward copies the gradient
                x = x[:n_dst]
        else:
            adj = as_adj(edge_index, n_src, n_dst, self.aggr_path)
            x = conv((x, x[:n_dst]), adj, size=(n_src, n_dst))
        return self._activate(i, x)

    _layer = layer

    def layer_from_table(
        self, i: int, table: Tensor, dst: Tensor, src: Tensor, index: Tensor
    ) -> Tensor:
        """Layer ``i`` for the nodes ``dst`` straight from ``table``, the states of every
        node (in this process's memory), given their in-edges (``src[j] -> dst[index[j]]``,
        grouped by ``index``): the mean gathers the rows by id, with no copy of the
        batch's rows and no relabelling (layer-wise inference on a local table). The same
        sums as :meth:`layer` on either path; in bf16 the mean is rounded after the fp32
        sum rather than each row before it."""
        mean = mean_csr(table, offsets_of(index, dst.numel()), src).float()
        return self.layer_from_mean(i, mean, table[dst].float())

    def layer_from_mean(self, i: int, mean: Tensor, target: Tensor) -> Tensor:
        """Layer ``i`` given its targets' mean over their in-neighbours and their own
        states (fp32): what a store table's rows split between shared memory and the
        network feed (:func:`graphrun.train.inference.split_mean`)."""
        return self._activate(i, self._dense(cast(SAGEConv, self.convs[i]), mean, target))

    def _dense(
        self, conv: SAGEConv, mean: Tensor, target: Tensor, keep_bf16: bool = False
    ) -> Tensor:
        """``lin_l(mean) + lin_r(target)``; in bf16 one product of ``[mean | target]`` with
        ``[W_l | W_r]`` (one cast of each side), its output fp32 (bf16 with
        ``keep_bf16``)."""
        if self.precision != "bf16":
            return cast(Tensor, conv.lin_l(mean) + conv.lin_r(target))
        left, right = cast(Tensor, conv.lin_l.weight), cast(Tensor, conv.lin_r.weight)
        bias = cast(Tensor, conv.lin_l.bias).to(torch.bfloat16)
        both = torch.cat([mean.to(torch.bfloat16), target.to(torch.bfloat16)], dim=1)
        w = torch.cat([left, right], dim=1).to(torch.bfloat16)
        out = torch.addmm(bias, both, w.t())
        return out if keep_bf16 else out.float()

    def _activate(self, i: int, x: Tensor) -> Tensor:
        if i < len(self.convs) - 1:
            if fused(x, self.dropout, self.training):  # bf16: one pass each way
                return relu_dropout(x, self.dropout)
            x = dropout(F.relu(x), self.dropout, self.training)
        return x

    _layer = layer


class GCN(ByLayer):
    """GCN (``GCNConv``: symmetric normalisation, self loops) over message-flow graphs.

    ``GCNConv`` has no bipartite form (its normalisation needs one node set), so each layer
    computes every node of its input over the layer's edges and keeps its destinations:
    the layer-wise cut of SAGE and GAT (computing destinations only) does not apply."""

    def __init__(
        self, in_dim: int, hidden: int, out_dim: int, num_layers: int, dropout: float = 0.5
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ArgumentError(f"num_layers: expected >= 1, got {num_layers}")
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.convs = torch.nn.ModuleList(GCNConv(a, b) for a, b in itertools.pairwise(dims))
        self.dropout = dropout

    def _layer(self, i: int, x: Tensor, edge_index: Tensor, n_dst: int) -> Tensor:
        """Layer ``i`` over every node of ``x``, its first ``n_dst`` kept (not a
        ``layer``: layer-wise inference computes destinations only)."""
        x = self.convs[i](x, edge_index)[:n_dst]
        if i < len(self.convs) - 1:
            x = dropout(F.relu(x), self.dropout, self.training)
        return x


class GAT(ByLayer):
    """GAT (``GATConv``, ``heads`` attention heads concatenated in hidden layers, one head in
    the last) over message-flow graphs: each layer computes only its destinations, given
    the bipartite pair ``(x, x[:targets])`` (self loops for the targets, which are the
    first source nodes)."""

    def __init__(
        self, in_dim: int, hidden: int, out_dim: int, num_layers: int, dropout: float = 0.5,
        heads: int = 4,
    ) -> None:  # fmt: skip
        super().__init__()
        if num_layers < 1:
            raise ArgumentError(f"num_layers: expected >= 1, got {num_layers}")
        if hidden % heads:
            raise ArgumentError(f"hidden: {hidden} is not a multiple of {heads} heads")
        self.convs = torch.nn.ModuleList()
        d = in_dim
        for i in range(num_layers):
            last = i == num_layers - 1
            self.convs.append(
                GATConv(d, out_dim, heads=1) if last else GATConv(d, hidden // heads, heads=heads)
            )
            d = hidden
        self.dropout = dropout

    def layer(self, i: int, x: Tensor, edge_index: Tensor, n_dst: int) -> Tensor:
        """Layer ``i`` alone (see :meth:`SAGE.layer`)."""
        x = self.convs[i]((x, x[:n_dst]), edge_index, size=(x.size(0), n_dst))
        if i < len(self.convs) - 1:
            x = dropout(F.elu(x), self.dropout, self.training)
        return x

    _layer = layer


class MLP(torch.nn.Module):
    """Two linear layers on node features alone (the no-graph baseline)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.lin1 = torch.nn.Linear(in_dim, hidden)
        self.lin2 = torch.nn.Linear(hidden, out_dim)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        return self.lin2(dropout(F.relu(self.lin1(x)), self.dropout, self.training))


def reaching_relations(
    edge_types: Sequence[CanonicalEtype], node_types: set[str], target: str, num_layers: int
) -> list[list[CanonicalEtype]]:
    """Per layer, the relations whose messages can still reach ``target`` by the last
    layer: the last layer's end at ``target``; each earlier layer's end at a type that a
    later kept relation reads (as source, or as destination for its root weight).

    Only these get convolutions, so every parameter takes part in every step's loss —
    DDP's gradient reduction needs that — and no layer computes states nobody reads."""
    usable = [et for et in edge_types if et[0] in node_types and et[2] in node_types]
    layers: list[list[CanonicalEtype]] = []
    needed = {target}
    for _ in range(num_layers):
        rels = [et for et in usable if et[2] in needed]
        layers.append(rels)
        needed = needed | {et[0] for et in rels}
    return layers[::-1]


class HeteroGNN(torch.nn.Module):
    """Heterogeneous GNN on one target node type over heterogeneous message-flow graphs.

    ``rgcn``: R-GCN (:class:`~graphrun.train.rgcn.RGCNLayer`: a weight per relation, from
    ``num_bases`` shared bases when given, the messages of each relation averaged, plus
    one self-loop weight and bias). ``sage``: per relation a ``SAGEConv`` (its own
    neighbour and root weights), summed per destination type in a
    ``torch_geometric.nn.HeteroConv`` (its parameters and state-dict keys); a type that
    receives no messages keeps a zero state. Either way each layer computes only its
    destinations, and only relations that reach the target take part
    (:func:`reaching_relations`)."""

    def __init__(
        self,
        in_dims: Mapping[str, int],
        edge_types: Sequence[CanonicalEtype],
        hidden: int,
        out_dim: int,
        num_layers: int,
        target: str,
        dropout: float = 0.5,
        conv: Literal["rgcn", "sage"] = "rgcn",
        num_bases: int | None = None,
    ) -> None:
        super().__init__()
        if target not in in_dims:
            raise ArgumentError(f"target node type {target!r} has no features")
        if conv not in ("rgcn", "sage"):
            raise ArgumentError(f"conv: {conv!r} is not 'rgcn' or 'sage'")
        self.target = target
        self.dropout = dropout
        self.convs = torch.nn.ModuleList()
        self.relations = reaching_relations(edge_types, set(in_dims), target, num_layers)
        self.out_dims: list[int] = []
        dims = dict(in_dims)
        for i, layer in enumerate(self.relations):
            out = out_dim if i == num_layers - 1 else hidden
            if conv == "rgcn":
                self.convs.append(RGCNLayer(layer, max(dims.values()), out, num_bases))
            else:
                rels = {et: SAGEConv((dims[et[0]], dims[et[2]]), out) for et in layer}
                self.convs.append(HeteroConv(rels, aggr="sum"))
            self.out_dims.append(out)
            dims = dict.fromkeys(dims, out)

    def forward(
        self,
        x: dict[str, Tensor],
        edge_index: dict[CanonicalEtype, Tensor],
        num_sampled_nodes: dict[str, list[int]] | None = None,
        num_sampled_edges: dict[CanonicalEtype, list[int]] | None = None,
    ) -> Tensor:
        layers = len(self.convs)
        for i, layer in enumerate(self.convs):
            n_dst = {t: v.size(0) for t, v in x.items()}
            edges = edge_index
            if num_sampled_nodes is not None and num_sampled_edges is not None:
                # the message-flow graph of layer i, as in SAGE.forward, per type
                n_dst = {
                    t: mfg_targets(num_sampled_nodes[t], layers, i) if t in num_sampled_nodes
                    else n for t, n in n_dst.items()
                }  # fmt: skip
                edges = {
                    et: mfg_edges(e, num_sampled_edges[et], layers, i)
                    if et in num_sampled_edges else e for et, e in edge_index.items()
                }  # fmt: skip
            if isinstance(layer, RGCNLayer):
                x = layer(x, edges, n_dst)
            else:
                x = self._sage_layer(i, cast(HeteroConv, layer), x, edges, n_dst)
            if i < layers - 1:
                x = {t: dropout(F.relu(v), self.dropout, self.training) for t, v in x.items()}
        return x[self.target]

    def _sage_layer(
        self,
        i: int,
        hetero: HeteroConv,
        x: dict[str, Tensor],
        edges: dict[CanonicalEtype, Tensor],
        n_dst: dict[str, int],
    ) -> dict[str, Tensor]:
        """The convs of ``hetero`` one relation at a time, each on its destinations only."""
        out: dict[str, Tensor] = {}
        convs: torch.nn.ModuleDict = hetero.convs
        for et, conv in zip(self.relations[i], convs.values(), strict=True):
            src, _, dst = et
            if src not in x or dst not in x:
                continue
            # a batch without edges of a relation still runs its conv (on no edges),
            # so its parameters are part of the loss as DDP expects
            e = edges.get(et, x[src].new_zeros((2, 0), dtype=torch.long))
            pair = (x[src], x[dst][: n_dst[dst]])
            h = conv(pair, e, size=(x[src].size(0), n_dst[dst]))
            out[dst] = h if dst not in out else out[dst] + h  # HeteroConv's aggr="sum"
        # node types that receive no messages in this layer keep a zero state
        return {t: out.get(t, x[t].new_zeros(n_dst[t], self.out_dims[i])) for t in x}


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
