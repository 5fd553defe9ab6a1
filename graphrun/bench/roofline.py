"""The step's roofline for ``graphrun bench step``: each phase against this core's peak.

A GraphSAGE step is cut into the phases the trainer runs — ``sample``, ``fetch``, per
layer ``aggregate[i]`` (the mean over in-neighbours: one fused gather-reduce over the
batch's CSR, :func:`graphrun.train.models.mean_csr`) and
``dense[i]`` (``lin_l`` of the mean plus ``lin_r`` of the target, or their one bf16
product), ``backward``, ``optimizer`` (Adam) and ``allreduce`` (the gradients, two gloo
processes on loopback) — and each is timed alone on the same batch, with the floating
point operations and the bytes it must move:

* an aggregation does ``2 * nnz * F`` flops. Its bytes are counted twice over, as two
  limits: ``mb``, what it must move at the least (:func:`mean_bytes`) — each source row
  it reads (the distinct columns of its CSR) once, in the dtype the layer is handed, the
  CSR (a column index per edge, a row start per row) and the ``n_dst`` means written in
  theirs — read against the streaming read (``of_peak``). One formula for both
  precisions: a bf16 layer handed fp32 rows must still read them once, and its cast of
  them is time it spends, not bytes it must move (counted as such, it made a bf16
  aggregation look 1.8x faster than an fp32 one of the same time).
  ``gathered_mb`` is a row per edge as the kernel reads it, read against
  ``gather_gbps`` (``of_gather_peak``), the measured rate of summing rows picked at
  random from a table beyond the caches. The rows are read in the order of the edges,
  each about twice (layer 0 of a [25, 10] batch: 141k edges over 64k rows); laid out in
  the order the edges first read them (the local sampler's relabelling,
  :class:`graphrun.sampling.mfg.Relabeler`) the first reads stream and the repeats
  are mostly the hubs, in the caches;
* ``aggregate_grad[i]`` (layers ``i > 0``, whose input needs a gradient): the mean's
  backward alone, a row's gradient added into each of its sources (``mb``: the means'
  gradient read, the fp32 source gradient zeroed and written once; ``gathered_mb``: a
  row read and written per edge);
* a dense product does ``2 * n_dst * (2 F_in) * F_out`` flops and is read against the
  measured matrix-product peak of its precision;
* ``backward`` is the autograd pass of the whole step (the dense products' gradients,
  twice their forward flops, and the aggregations' transposed products for every layer
  whose input needs a gradient); ``optimizer`` moves seven words per parameter.

The peaks are measured in the same command, on the same threads: :func:`peaks` takes the
best fp32 and bf16 matrix-product rate over a square product and products of a layer's
shapes (``torch.addmm``, best of a few), and times a streaming read (``sum``), a copy
and a random-row gather (:func:`gather_gbps`, rows as wide as the features, in the
aggregation's precision) of a table larger than the caches. Timed on a busy machine,
every figure is low and the shares noisy: run it alone.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from multiprocessing.context import ForkServerContext, SpawnContext
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from graphrun.bench import call_times

MATMUL_N = 2048  # the square product's side for the flop peak
STREAM_MB = 512  # the table the bandwidth is measured on (beyond every cache here)


@dataclass(frozen=True)
class Phase:
    """One phase of the step: median seconds, the work it must do, and its limit
    (``"flops"``: a product, read against the matmul peak of ``precision``; ``"bytes"``:
    memory-bound, read against the read bandwidth; ``None``: no roofline, e.g. sampling)."""

    name: str
    seconds: float
    flops: float = 0.0
    bytes: float = 0.0
    bound: str | None = None
    precision: str = "fp32"
    items: int | None = None  # sample: the edges it drew
    gathered: float | None = None  # aggregate: the bytes of a row per edge (read or added)

    def row(self, peak: dict[str, float | None]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.name,
            "ms": round(self.seconds * 1000, 3),
            "gflop": round(self.flops / 1e9, 4),
            "mb": round(self.bytes / 1e6, 3),
            "gflops": round(self.flops / self.seconds / 1e9, 2) if self.seconds else None,
            "gbps": round(self.bytes / self.seconds / 1e9, 2) if self.seconds else None,
            "bound": self.bound,
        }
        if self.gathered is not None:  # against the measured random-row gather
            out["gathered_mb"] = round(self.gathered / 1e6, 3)
            rate = round(self.gathered / self.seconds / 1e9, 2) if self.seconds else None
            out["gathered_gbps"] = rate
            out["of_gather_peak"] = _share(rate, peak.get("gather_gbps"))
        if self.items is not None:
            out["items"] = self.items
            out["items_per_s"] = round(self.items / self.seconds) if self.seconds else None
        limit = None
        if self.bound == "flops":
            limit = peak.get(f"{self.precision}_gflops")
            out["of_peak"] = _share(out["gflops"], limit)
        elif self.bound == "bytes":
            limit = peak.get("read_gbps")
            out["of_peak"] = _share(out["gbps"], limit)
        return out


def _share(rate: float | None, limit: float | None) -> float | None:
    return round(rate / limit, 3) if rate is not None and limit else None


def best_of(fn: Callable[[], object], repeats: int = 5) -> float:
    """The fastest of ``repeats`` timed calls: for peaks."""
    return min(call_times(fn, repeats))


def median_of(fn: Callable[[], object], repeats: int = 9) -> float:
    """The median of ``repeats`` timed calls: for phases."""
    return statistics.median(call_times(fn, repeats))


def bf16_native() -> bool:
    """Whether the CPU has a native bf16 product (AMX tiles or AVX-512 BF16)."""
    from graphrun.train.models import resolve_precision

    return resolve_precision("auto") == "bf16"


def matmul_gflops(dtype: torch.dtype, shapes: tuple[tuple[int, int, int], ...]) -> float:
    """The best rate of ``torch.addmm`` in ``dtype`` over ``shapes`` (m, k, n): the peak
    a product of this core reaches (oneDNN and MKL pick kernels by shape, so one square
    product can miss it)."""
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        product = partial(torch.addmm, torch.zeros(n).to(dtype), a, b)
        best = max(best, 2 * m * k * n / best_of(product) / 1e9)
    return round(best, 1)


# a square product, and products of a layer's shapes (rows x [mean | x] times weights)
MATMUL_SHAPES = ((MATMUL_N, MATMUL_N, MATMUL_N), (4096, 256, 128), (2048, 256, 256))


def peaks(width: int = 128, dtype: torch.dtype = torch.float32) -> dict[str, float | None]:
    """This process's measured peaks on its torch threads: ``fp32_gflops``,
    ``bf16_gflops`` (None without a native bf16 product: it would be emulated),
    ``read_gbps`` (a streaming sum), ``copy_gbps`` (read and write counted) and
    ``gather_gbps`` (:func:`gather_gbps`: random rows of ``width`` ``dtype`` columns)."""
    out: dict[str, float | None] = {}
    out["fp32_gflops"] = matmul_gflops(torch.float32, MATMUL_SHAPES)
    native = bf16_native()
    out["bf16_gflops"] = matmul_gflops(torch.bfloat16, MATMUL_SHAPES) if native else None
    out["read_gbps"], out["copy_gbps"] = stream_gbps()
    out["gather_gbps"] = gather_gbps(width, dtype)
    return out


def stream_gbps() -> tuple[float, float]:
    """A streaming read (``sum``) and a copy (read and write counted) of a table beyond
    the caches, in GB/s."""
    big = torch.ones(STREAM_MB * (1 << 20) // 4)
    dst = torch.empty_like(big)
    read = round(big.nbytes / best_of(big.sum, 3) / 1e9, 2)
    return read, round(2 * big.nbytes / best_of(lambda: dst.copy_(big), 3) / 1e9, 2)


def gather_gbps(width: int, dtype: torch.dtype, rows: int = 1 << 17) -> float:
    """The rate at which one core sums rows picked at random from a table beyond the
    caches (``embedding_bag``, bags of 16, ``rows`` rows of ``width`` columns): the
    bytes of the rows gathered a second. What an aggregation whose rows are not in the
    caches can reach; the streaming read is the limit only of rows read in order."""
    table = torch.ones(STREAM_MB * (1 << 20) // (width * 4), width).to(dtype)
    picks = torch.randint(0, table.size(0), (rows,))
    bags = torch.arange(0, rows + 1, 16)
    gather = partial(F.embedding_bag, picks, table, bags, mode="sum", include_last_offset=True)
    return round(rows * width * table.element_size() / best_of(gather, 3) / 1e9, 2)


@dataclass(frozen=True)
class LayerInput:
    """What layer ``i`` of a step read: its input rows and message-flow graph."""

    x: Tensor
    edge_index: Tensor
    n_dst: int


def layer_inputs(model: Any, batch: Any) -> list[LayerInput]:
    """Run ``model`` (a :class:`graphrun.train.models.SAGE`) forward on ``batch`` once,
    keeping each layer's input (no gradient)."""
    seen: list[LayerInput] = []
    layer = model.layer

    def keep(i: int, x: Tensor, edge_index: Tensor, n_dst: int) -> Tensor:
        seen.append(LayerInput(x.detach(), edge_index, n_dst))
        return layer(i, x, edge_index, n_dst)

    model._layer = keep  # the instance's forward calls _layer (ByLayer)
    try:
        with torch.no_grad():
            model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
    finally:
        del model._layer
    return seen


def _dense(model: Any, conv: Any, mean: Tensor, target: Tensor) -> Callable[[], Tensor]:
    """Layer ``conv``'s dense product as :meth:`SAGE.layer` runs it in its precision."""
    if model.precision == "bf16":  # one product of [mean | x] with [W_l | W_r]
        both = torch.cat([mean, target], dim=1).bfloat16()
        w = torch.cat([conv.lin_l.weight, conv.lin_r.weight], dim=1).detach().bfloat16()
        return partial(torch.addmm, conv.lin_l.bias.detach().bfloat16(), both, w.t())

    def fp32() -> Tensor:
        with torch.no_grad():
            return conv.lin_l(mean) + conv.lin_r(target)

    return fp32


def layer_phases(model: Any, inputs: list[LayerInput]) -> list[Phase]:
    """``aggregate[i]`` and ``dense[i]`` of each layer, timed alone as the model runs
    them (:meth:`graphrun.train.models.SAGE.layer`, the ``csr`` path)."""
    from graphrun.train.models import csr_rows, mean_csr

    out = []
    bf16 = model.precision == "bf16"
    word = 2 if bf16 else 4
    for i, li in enumerate(inputs):
        conv = model.convs[i]
        f_in, f_out, nnz = li.x.size(1), conv.out_channels, li.edge_index.size(1)

        def aggregate(li: LayerInput = li) -> Tensor:
            x = li.x.to(torch.bfloat16) if bf16 else li.x  # the layer's one cast
            return mean_csr(x, *csr_rows(li.edge_index, li.n_dst))

        must = mean_bytes(li, torch.bfloat16 if bf16 else li.x.dtype)  # the means' dtype
        gathered = word * f_in * nnz  # a row per edge (caches serve the repeats)
        out.append(Phase(f"aggregate[{i}]", median_of(aggregate), 2 * nnz * f_in, must,
                         "bytes", gathered=gathered))  # fmt: skip
        if i > 0:  # the layers whose input needs a gradient: the mean's backward
            out.append(_mean_grad(i, li, bf16))
        dense = _dense(model, conv, aggregate(), li.x[: li.n_dst])
        flops = 2 * li.n_dst * 2 * f_in * f_out
        nbytes = word * (li.n_dst * 2 * f_in + 2 * f_in * f_out) + 4 * li.n_dst * f_out
        out.append(Phase(f"dense[{i}]", median_of(dense), flops, nbytes, "flops",
                         model.precision))  # fmt: skip
    return out


def mean_bytes(li: LayerInput, out: torch.dtype) -> float:
    """The bytes layer ``li``'s mean must move at the least: each source row its edges
    read, once, in the dtype the layer was handed; its CSR (an int64 column per edge, a
    row start per mean); its ``n_dst`` means written in ``out``. The same in fp32 and
    bf16 but for the means' word (and the rows', where they come in bf16)."""
    src = li.edge_index[0]
    rows = int(torch.unique(src).numel())
    nnz, width = src.numel(), li.x.size(1)
    word = torch.empty(0, dtype=out).element_size()
    return float(li.x.element_size() * width * rows + word * width * li.n_dst
                 + 8 * nnz + 8 * (li.n_dst + 1))  # fmt: skip


def _mean_grad(i: int, li: LayerInput, bf16: bool) -> Phase:
    """``aggregate_grad[i]``: the mean's backward alone (the gradient of layer ``i``'s
    input rows from its means'), as the step runs it. It must read the means' gradient
    and the CSR and write a zeroed ``n_src`` x ``F`` fp32 gradient once (``mb``); it adds
    a row per edge into it (``gathered_mb``: read and written, from the caches or not)."""
    from graphrun.train.models import csr_rows, mean_csr

    x = (li.x.to(torch.bfloat16) if bf16 else li.x).detach().requires_grad_()
    (n_src, f_in), nnz = li.x.shape, li.edge_index.size(1)
    mean = mean_csr(x, *csr_rows(li.edge_index, li.n_dst))
    grad = torch.ones_like(mean)

    def backward() -> object:
        return torch.autograd.grad(mean, x, grad, retain_graph=True)

    word = 2 if bf16 else 4
    must = 2 * 4 * f_in * n_src + word * f_in * li.n_dst + 8 * nnz + 8 * (li.n_dst + 1)
    return Phase(f"aggregate_grad[{i}]", median_of(backward), 2 * nnz * f_in, must, "bytes",
                 gathered=2 * 4 * f_in * nnz)  # fmt: skip


def step_phases(model: Any, batch: Any, inputs: list[LayerInput]) -> list[Phase]:
    """``backward`` and ``optimizer`` of the real step (forward, loss, backward, Adam)."""
    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    model.train()
    back, step = [], []
    for _ in range(7):
        opt.zero_grad()
        out = model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
        loss = F.cross_entropy(out[: batch.batch_size], batch.y[: batch.batch_size])
        t0 = time.perf_counter()
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        back.append(t1 - t0)
        step.append(t2 - t1)
    dense = sum(2 * li.n_dst * 2 * li.x.size(1) * c.out_channels
                for li, c in zip(inputs, model.convs, strict=True))  # fmt: skip
    # the transposed aggregation of every layer whose input needs a gradient (not layer 0)
    agg = sum(2 * li.edge_index.size(1) * li.x.size(1) for li in inputs[1:])
    params = sum(p.numel() for p in model.parameters())
    return [
        Phase(
            "backward", statistics.median(back[2:]), 2 * dense + agg, 0.0, "flops", model.precision
        ),  # its products' gradients in the forward's precision
        Phase("optimizer", statistics.median(step[2:]), 12 * params, 28 * params, "bytes"),
    ]


def _allreduce_rank(rank: int, init: str, numel: int, repeats: int, out: Any) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    t = torch.ones(numel)
    dist.all_reduce(t)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(statistics.median(times))
    dist.destroy_process_group()


def allreduce_phase(
    numel: int, repeats: int = 9, timeout_s: float = 60.0,
    processes: SpawnContext | ForkServerContext | None = None,
) -> Phase:  # fmt: skip
    """The gradients' all-reduce: two gloo processes on loopback sum ``numel`` floats
    (what DDP sends a step, in one bucket); the bytes each rank sends and receives.
    ``processes``: the ``multiprocessing`` context they start from (``spawn`` by
    default; the test forks them from its fork server, torch imported once)."""
    import multiprocessing as mp
    import tempfile
    from pathlib import Path

    from graphrun.errors import GraphrunError

    ctx = processes if processes is not None else mp.get_context("spawn")
    got = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="graphrun-roofline-") as tmp:
        init = f"file://{Path(tmp) / 'rendezvous'}"
        procs = [ctx.Process(target=_allreduce_rank, args=(r, init, numel, repeats, got))
                 for r in range(2)]  # fmt: skip
        for p in procs:
            p.start()
        try:
            seconds = got.get(timeout=timeout_s)
        except Exception as exc:  # queue.Empty: a rank died or hung
            raise GraphrunError(f"allreduce: no result within {timeout_s:g} s") from exc
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    return Phase("allreduce", seconds, float(numel), 2.0 * 4 * numel, None)


def roofline(
    model: Any, batches: list[Any], costs: list[tuple[float, float]], allreduce: bool = True
) -> tuple[list[Phase], dict[str, float | None]]:
    """Every phase of a step on ``batches[0]`` (``costs``: each batch's sampling and
    fetching seconds, medians taken) and the peaks measured now."""
    b = batches[0]
    edges = sum(int(e) for e in b.num_sampled_edges)
    sample_s = statistics.median(c[0] for c in costs)
    fetch_s = statistics.median(c[1] for c in costs)
    feat = b.x.nbytes + b.y.nbytes
    out = [
        Phase("sample", sample_s, 0.0, 0.0, None, items=edges),  # sampled edges
        Phase("fetch", fetch_s, 0.0, float(feat), "bytes"),
    ]
    inputs = layer_inputs(model, b)
    out += layer_phases(model, inputs)
    out += step_phases(model, b, inputs)
    if allreduce:
        out.append(allreduce_phase(sum(p.numel() for p in model.parameters())))
    word = torch.bfloat16 if model.precision == "bf16" else torch.float32
    return out, peaks(b.x.size(1), word)  # layer 0's rows, as its aggregation gathers them
