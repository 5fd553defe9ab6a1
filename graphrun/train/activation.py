"""A bf16 hidden layer's ReLU and dropout as one pass each way (CPU, training).

A bf16 GraphSAGE's hidden layer hands the next one ``dropout(relu(h))`` in bf16
(:class:`graphrun.train.models.SAGE`). As torch ops that is four passes over the layer's
rows (``clamp_min`` and the mask's product forward; the mask's product and
``threshold_backward`` backward) and a mask of two bytes an element. One numba loop
each way does it from the dropout's random bits (one byte an element at ``p = 0.5``):

* forward: ``y = bf16(h * scale)`` where ``h > 0`` and the element is kept, else 0;
* backward: ``gh = bf16(g * scale)`` where ``h > 0`` and the element is kept, else 0.

The values are torch's bit for bit: a bf16 times a scale exact in bf16 is exact in fp32,
then rounded to bf16 to nearest even, which is what torch's bf16 product does (the
tests compare the two). The random bits are the ones :func:`graphrun.train.models.dropout`
draws (:func:`mask_bits`), so the masks are too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from graphrun.jit import njit

#: elements a kernel converts at a time (its fp32 scratch stays in the first-level cache)
CHUNK = 2048


def mask_bits(numel: int, p: float) -> tuple[np.ndarray, int]:
    """The dropout's random draws for ``numel`` elements and the threshold an element's
    draw must reach to be kept: one byte an element when ``p`` is a multiple of 1/256,
    two otherwise, PCG64's 64-bit words as they come, seeded by one draw from torch's
    generator (so ``torch.manual_seed`` and checkpointed RNG states fix them)."""
    seed = int(torch.randint(0, 2**62, (1,)))
    width, dtype = (1, np.uint8) if float(p * 256).is_integer() else (2, np.uint16)
    words = np.random.PCG64(seed).random_raw(-(-width * numel // 8))
    return words.view(np.uint8)[: width * numel].view(dtype), round(p * 256**width)


def bf16_exact(value: float) -> bool:
    """Whether ``value`` is a bf16 number (its fp32 has no bits below bf16's)."""
    return int(np.array([value], dtype=np.float32).view(np.uint32)[0]) & 0xFFFF == 0


def fused(x: Tensor, p: float, training: bool) -> bool:
    """Whether :func:`relu_dropout` takes ``x`` in one pass: a bf16 CPU tensor in
    training, ``0 < p < 1`` with a scale exact in bf16 (0.5's 2.0, 0.75's 4.0, ...)."""
    return (
        training
        and x.dtype == torch.bfloat16
        and x.device.type == "cpu"
        and 0.0 < p < 1.0
        and bf16_exact(1.0 / (1.0 - p))
    )


def relu_dropout(x: Tensor, p: float) -> Tensor:
    """``dropout(relu(x), p)`` of a bf16 ``x`` (:func:`fused` holds), one pass each way."""
    bits, threshold = mask_bits(x.numel(), p)
    out: Tensor = _ReluDropout.apply(x, bits, threshold, 1.0 / (1.0 - p))
    return out


def _u16(t: Tensor) -> np.ndarray:
    """A contiguous bf16 tensor's bits, flat (no copy)."""
    out: np.ndarray = t.view(torch.int16).numpy().view(np.uint16).reshape(-1)
    return out


class _ReluDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, bits: np.ndarray, threshold: int, scale: float) -> Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        _kernel()(_u16(x), _u16(x), bits, threshold, np.float32(scale), _u16(out))
        ctx.save_for_backward(x)
        ctx.bits, ctx.threshold, ctx.scale = bits, threshold, scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        (x,) = ctx.saved_tensors
        grad = grad.to(torch.bfloat16).contiguous()
        gx = torch.empty_like(x)
        _kernel()(_u16(grad), _u16(x), ctx.bits, ctx.threshold, np.float32(ctx.scale), _u16(gx))
        return gx, None, None, None


def _masked_scale(
    src: np.ndarray,
    cond: np.ndarray,
    bits: np.ndarray,
    threshold: int,
    scale: np.float32,
    out: np.ndarray,
) -> None:
    """``out[i] = bf16(src[i] * scale)`` where ``cond[i] > 0`` and ``bits[i] >=
    threshold``, else 0 (bf16 as their 16 bits; rounded as torch rounds: to nearest
    even, a NaN to the quiet NaN). Forward ``src`` and ``cond`` are ``h``; backward
    ``src`` is the gradient. Every constant typed: numba makes int64 of signed and
    unsigned mixed, and the loops then stop vectorising."""
    one, shift = np.uint32(1), np.uint32(16)
    words = np.empty(CHUNK, dtype=np.uint32)
    values = words.view(np.float32)
    for lo in range(0, src.size, CHUNK):
        n = min(CHUNK, src.size - lo)
        s, c, b, o = src[lo : lo + n], cond[lo : lo + n], bits[lo : lo + n], out[lo : lo + n]
        for k in range(n):
            words[k] = np.uint32(s[k]) << shift
        for k in range(n):
            values[k] = values[k] * scale
        for k in range(n):
            w = words[k]
            r = (w + np.uint32(0x7FFF) + ((w >> shift) & one)) >> shift
            r = np.uint32(0x7FC0) if w & np.uint32(0x7FFFFFFF) > np.uint32(0x7F800000) else r
            positive = np.uint32(c[k]) - one < np.uint32(0x7FFF)  # not 0, no sign bit
            o[k] = np.uint16(r) if positive and b[k] >= threshold else np.uint16(0)


_COMPILED: list[Any] = []


def _kernel() -> Any:
    """:func:`_masked_scale` compiled by numba (once a process), cached on disk where it
    can be (:mod:`graphrun.jit`)."""
    if not _COMPILED:
        _COMPILED.append(njit(_masked_scale, boundscheck=False))
    return _COMPILED[0]


def warm_up() -> None:
    """The loops loaded (or compiled) and run once in this process, as the trainers' warm
    server does before it forks them (:mod:`graphrun.machine.warm`)."""
    x = torch.ones(4, dtype=torch.bfloat16, requires_grad=True)
    for width in (np.uint8, np.uint16):
        bits = np.full(4, 255, dtype=width)
        _ReluDropout.apply(x, bits, 1, 2.0).sum().backward()
