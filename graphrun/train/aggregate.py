"""The mean over in-neighbours as one fused kernel each way, over a batch's CSR.

:func:`csr_rows` turns a layer's edges into compressed rows (row offsets and source
columns, no sort for edges grouped by destination, as samplers emit them) and
:func:`mean_csr` takes the mean of each row's source rows:

* forward: ``F.embedding_bag(mode="mean")`` — fbgemm's gather-reduce, its rows
  prefetched, no ``[edges, F]`` temporary, fp32 sums for bf16 rows;
* backward (on a CPU): the transposed product as one pass over the same CSR in a numba
  kernel (:func:`_scatter_mean`: row ``r``'s gradient over its degree added into each of
  its sources' rows, in edge order, one thread, no atomics). torch's own backward for
  ``embedding_bag`` sorts the columns and reduces segments: 2.6–2.8 CPU-ms against
  0.3–0.4 for the kernel on layer 1 of a [25, 10] batch (benchmarks/README.md, "Kernels").

Other devices keep torch's backward. The forward stays fbgemm's: the same loops compiled
by numba (a gather per row, or by source with the rows' sums in the caches) were no faster
(benchmarks/README.md). What moves it is the rows' layout: the local sampler numbers a
batch's nodes in the order layer 0's rows first read them
(:class:`graphrun.sampling.mfg.Relabeler`, ``order="first"``), so its first reads
stream and its repeats are mostly hubs (benchmarks/README.md, "Aggregation in
first-read order").
"""

from __future__ import annotations

from typing import Any

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
    samplers emit) need no sort (checked; a stable sort otherwise)."""
    src, dst = edge_index[0], edge_index[1]
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
    if x.device.type != "cpu" or not x.requires_grad or not torch.is_grad_enabled():
        return F.embedding_bag(columns, x, offsets, mode="mean", include_last_offset=True)
    out: Tensor = _MeanCSR.apply(x, offsets, columns)
    return out


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
    """fbgemm's mean forward; the numba scatter of :func:`_scatter_mean` backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, offsets: Tensor, columns: Tensor) -> Tensor:
        ctx.save_for_backward(offsets, columns)
        ctx.shape, ctx.dtype = x.shape, x.dtype
        return F.embedding_bag(columns, x, offsets, mode="mean", include_last_offset=True)

    @staticmethod
    @once_differentiable  # the kernel's gradient has no gradient of its own
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        offsets, columns = ctx.saved_tensors
        g = grad.float().contiguous()
        gx = torch.zeros(ctx.shape, dtype=torch.float32)
        _kernel()(g.numpy(), _i64(offsets), _i64(columns), gx.numpy())
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


_COMPILED: list[Any] = []


def warm_up() -> None:
    """The backward's kernel loaded (from numba's cache, or compiled) and run once in this
    process, as the trainers' warm server does before it forks them
    (:mod:`graphrun.machine.warm`): each trainer would pay about 0.7 CPU-s for it at its
    first backward (numba's import, the kernel's load and its first dispatch)."""
    g = np.zeros((1, 1), dtype=np.float32)
    _kernel()(g, np.array([0, 1], dtype=np.int64), np.zeros(1, dtype=np.int64), g.copy())


def _kernel() -> Any:
    """:func:`_scatter_mean` compiled by numba (once a process), cached on disk where it
    can be (:mod:`graphrun.jit`)."""
    if not _COMPILED:
        _COMPILED.append(njit(_scatter_mean, fastmath=True, boundscheck=False))
    return _COMPILED[0]
