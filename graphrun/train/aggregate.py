"""The mean over in-neighbours as one fused kernel each way, over a batch's CSR.

:func:`csr_rows` turns a layer's edges into compressed rows (row offsets and source
columns; for edges grouped by destination, as samplers emit them, one compiled pass that
checks the order as it counts; a stable sort otherwise) and :func:`mean_csr` takes the
mean of each row's source rows:

* forward (on a CPU): fbgemm's gather-reduce (``F.embedding_bag``) as a *weighted sum*,
  each edge weighing ``1 / degree`` of its row (:func:`_edge_weights`): its rows
  prefetched, no ``[edges, F]`` temporary, fp32 sums for bf16 rows, each mean written
  once. torch's ``mode="mean"`` runs the same sum, then maps each edge to its row and
  divides the means in a second pass over them: 0.5–0.8 ms more on layer 0 of a
  [25, 10] batch (benchmarks/README.md, "the aggregation against the streaming read").
  Reverted once for a training job measured 2–4 ms a step slower; its steps alternated
  with ``mode="mean"`` in one job were not (benchmarks/README.md, "the weighted-sum mean
  in the training job");
* backward (on a CPU): the transposed product as one pass over the same CSR in a numba
  kernel (:func:`_scatter_mean`: row ``r``'s gradient over its degree added into each of
  its sources' rows, in edge order, one thread, no atomics). torch's own backward for
  ``embedding_bag`` sorts the columns and reduces segments: 2.6–2.8 CPU-ms against
  0.3–0.4 for the kernel on layer 1 of a [25, 10] batch (benchmarks/README.md, "Kernels").

Other devices keep torch's ``mode="mean"`` and its backward. The gather stays fbgemm's:
the same loops compiled by numba (a gather per row, with or without prefetches of the
rows a few edges ahead, or by source with the rows' sums in the caches) were slower
(benchmarks/README.md). What moves it is the rows' layout: the local sampler numbers a
batch's nodes in the order layer 0's rows first read them
(:class:`graphrun.sampling.mfg.Relabeler`, ``order="first"``), so its first reads
stream and its repeats are mostly hubs (benchmarks/README.md, "Aggregation in
first-read order").
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from graphrun.jit import njit


def csr_rows(edge_index: Tensor, num_dst: int) -> tuple[Tensor, Tensor]:
    """The compressed rows of ``edge_index`` (``[src; dst]``, ``dst < num_dst``):
    ``offsets`` (``num_dst + 1``: row ``r``'s edges are ``offsets[r] .. offsets[r+1]-1``)
    and their source ``columns``. Edges grouped by destination in order (what the
    samplers emit) need no sort: on a CPU one compiled pass (:func:`_sorted_offsets`)
    checks the order and counts them (0.1 ms for 141k edges, against 0.3 for the check,
    ``bincount`` and ``cumsum`` in torch); a stable sort otherwise."""
    src, dst = edge_index[0], edge_index[1]
    if dst.device.type == "cpu":
        offsets = torch.empty(num_dst + 1, dtype=torch.int64)
        if _kernels().offsets(_i64(dst), num_dst, offsets.numpy()):
            return offsets, src
    if dst.numel() > 1 and not bool((dst[1:] >= dst[:-1]).all()):
        order = torch.argsort(dst, stable=True)
        src, dst = src[order], dst[order]
    return offsets_of(dst, num_dst), src


def offsets_of(rows: Tensor, num_rows: int) -> Tensor:
    """The CSR offsets (``num_rows + 1``) of edges whose rows ``rows`` are in order."""
    offsets = torch.zeros(num_rows + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(torch.bincount(rows, minlength=num_rows), 0, out=offsets[1:])
    return offsets


def mean_csr(x: Tensor, offsets: Tensor, columns: Tensor) -> Tensor:
    """Row ``r``: the mean of ``x[columns[offsets[r]:offsets[r+1]]]`` (zeros for an empty
    row), in ``x``'s dtype, with a gradient for ``x`` (the kernels above)."""
    if x.device.type != "cpu":
        return F.embedding_bag(columns, x, offsets, mode="mean", include_last_offset=True)
    if not x.requires_grad or not torch.is_grad_enabled():
        return _weighted_mean(x, offsets, columns)
    out: Tensor = _MeanCSR.apply(x, offsets, columns)
    return out


def _weighted_mean(x: Tensor, offsets: Tensor, columns: Tensor) -> Tensor:
    """The means as fbgemm's sum of each row's source rows weighted ``1 / degree``: one
    pass, each mean written once (in bf16: the weight rounded to bf16, the sum in fp32,
    the mean rounded once)."""
    weights = torch.empty(columns.numel(), dtype=torch.float32)
    if not _kernels().weights(_i64(offsets), weights.numpy()):  # offsets past the columns
        return F.embedding_bag(columns, x, offsets, mode="mean", include_last_offset=True)
    return F.embedding_bag(columns, x, offsets, mode="sum", include_last_offset=True,
                           per_sample_weights=weights.to(x.dtype))  # fmt: skip


def mean_split(parts: list[tuple[Tensor, Tensor, Tensor]], num_rows: int) -> Tensor:
    """Row ``r``'s mean over its in-edges whose source rows lie in several tables:
    ``parts`` holds ``(table, columns, rows)`` per table (edge ``j`` adds
    ``table[columns[j]]`` to row ``rows[j]``, ``rows`` in order). The sums of each table's
    edges (fbgemm's, as :func:`mean_csr`) added, over the degree, fp32; zeros for an empty
    row. Inference only: no gradient."""
    width = parts[0][0].size(1)
    total = torch.zeros(num_rows, width)
    degree = torch.zeros(num_rows)
    for table, columns, rows in parts:
        if columns.numel():
            offsets = offsets_of(rows, num_rows)
            total += F.embedding_bag(columns, table, offsets, mode="sum", include_last_offset=True)
            degree += offsets.diff()
    return total / degree.clamp_(min=1).unsqueeze(1)


class _MeanCSR(torch.autograd.Function):
    """fbgemm's weighted sum forward; the numba scatter of :func:`_scatter_mean` backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, offsets: Tensor, columns: Tensor) -> Tensor:
        ctx.save_for_backward(offsets, columns)
        ctx.shape, ctx.dtype = x.shape, x.dtype
        return _weighted_mean(x, offsets, columns)

    @staticmethod
    @once_differentiable  # the kernel's gradient has no gradient of its own
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        offsets, columns = ctx.saved_tensors
        g = grad.float().contiguous()
        gx = torch.zeros(ctx.shape, dtype=torch.float32)
        _kernels().scatter(g.numpy(), _i64(offsets), _i64(columns), gx.numpy())
        return gx.to(ctx.dtype), None, None


def _i64(t: Tensor) -> np.ndarray:
    out: np.ndarray = t.to(torch.int64).contiguous().numpy()
    return out


def _scatter_mean(g: np.ndarray, offsets: np.ndarray, columns: np.ndarray, gx: np.ndarray) -> None:
    """``gx[columns[e]] += g[r] / degree(r)`` for every edge ``e`` of every row ``r``: the
    mean's gradient, the CSR read once in order (``gx`` zeroed by the caller)."""
    width = g.shape[1]
    for r in range(offsets.size - 1):
        lo, hi = offsets[r], offsets[r + 1]
        if hi == lo:
            continue
        scale = np.float32(1.0) / np.float32(hi - lo)
        row = g[r]
        for e in range(lo, hi):
            out = gx[columns[e]]
            for k in range(width):
                out[k] += row[k] * scale


def _sorted_offsets(rows: np.ndarray, num_rows: int, offsets: np.ndarray) -> bool:
    """The CSR ``offsets`` (``num_rows + 1``) of edges whose ``rows`` are in order, in one
    pass; False (``offsets`` half-written) where they are out of order or not below
    ``num_rows``."""
    nnz = rows.size
    row = 0
    offsets[0] = 0
    for e in range(nnz):
        r = rows[e]
        if r < row or r >= num_rows:
            return False
        while row < r:
            row += 1
            offsets[row] = e
    while row < num_rows:
        row += 1
        offsets[row] = nnz
    return True


def _edge_weights(offsets: np.ndarray, weights: np.ndarray) -> bool:
    """``weights[e] = 1 / degree(r)`` for every edge ``e`` of every row ``r``; False
    (nothing written past ``weights``) where a row's edges lie outside it."""
    for r in range(offsets.size - 1):
        lo, hi = offsets[r], offsets[r + 1]
        if hi > lo:
            if lo < 0 or hi > weights.size:
                return False
            w = np.float32(1.0) / np.float32(hi - lo)
            for e in range(lo, hi):
                weights[e] = w
    return True


class _Kernels(NamedTuple):
    scatter: Any  # _scatter_mean
    offsets: Any  # _sorted_offsets
    weights: Any  # _edge_weights


_COMPILED: list[_Kernels] = []


def warm_up() -> None:
    """The kernels loaded (from numba's cache, or compiled) and run once in this process,
    as the trainers' warm server does before it forks them (:mod:`graphrun.machine.warm`):
    each trainer would pay about 0.7 CPU-s for them at its first step (numba's import,
    the kernels' load and their first dispatch)."""
    g = np.zeros((1, 1), dtype=np.float32)
    one, zero = np.array([0, 1], dtype=np.int64), np.zeros(1, dtype=np.int64)
    _kernels().scatter(g, one, zero, g.copy())
    _kernels().offsets(zero, 1, one.copy())
    _kernels().weights(one, np.zeros(1, dtype=np.float32))


def _kernels() -> _Kernels:
    """The kernels compiled by numba (once a process), cached on disk where they can be
    (:mod:`graphrun.jit`)."""
    if not _COMPILED:
        _COMPILED.append(_Kernels(
            njit(_scatter_mean, fastmath=True, boundscheck=False),
            njit(_sorted_offsets, boundscheck=False),
            njit(_edge_weights, boundscheck=False),
        ))  # fmt: skip
    return _COMPILED[0]
