"""A bf16 hidden layer's ReLU and dropout in one pass each way, against torch's ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from graphrun.train.activation import fused, relu_dropout, warm_up
from graphrun.train.models import SAGE, dropout, mfg_edges, mfg_targets


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def awkward_bf16(n: int) -> torch.Tensor:
    """Normal values of every size, zeros of both signs, subnormals, and values whose
    product overflows to inf."""
    x = torch.randn(n) * torch.logspace(-30, 30, n)[torch.randperm(n)]
    special = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38, 1.0, -1.0])
    x[: min(n, 8)] = special[: min(n, 8)]
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("p", [0.5, 0.75, 1 / 3])  # scales 2, 4 and 1.5: exact in bf16
@pytest.mark.parametrize("n", [1, 2047, 2048, 70_001])  # around and across its chunks
def test_one_pass_equals_torchs_relu_then_dropout_bit_for_bit(p, n):
    x = awkward_bf16(n).requires_grad_()
    ref = x.detach().clone().requires_grad_()
    grad = awkward_bf16(n)
    torch.manual_seed(3)
    got = relu_dropout(x, p)
    torch.manual_seed(3)
    want = dropout(F.relu(ref), p, True)
    got.backward(grad)
    want.backward(grad)
    assert got.dtype == x.grad.dtype == torch.bfloat16
    assert torch.equal(bits(got), bits(want)) or torch.equal(got, want)
    assert torch.equal(x.grad, ref.grad)
    kept = float((got != 0).float().mean())
    assert n < 1000 or abs(kept - (1 - p) / 2) < 0.02  # half the values are negative


def test_what_takes_the_one_pass():
    x = torch.ones(4, dtype=torch.bfloat16)
    assert fused(x, 0.5, True)
    assert not fused(x, 0.5, False)  # evaluation: no dropout
    assert not fused(x.float(), 0.5, True)  # fp32 keeps torch's ops
    assert not fused(x, 0.25, True)  # 4/3 is no bf16: the fp32 product, then cast
    assert not fused(x, 0.0, True) and not fused(x, 1.0, True)


def test_a_bf16_sage_in_training_takes_it():
    from graphrun.testing.graphs import random_graph
    from graphrun.train.data import LocalData

    b = next(LocalData(random_graph(500, 5000, 8, seed=1)).loader("train", None, [5, 5], 32,
                                                                  True, 0)).data  # fmt: skip
    model = SAGE(8, 16, 3, 2, 0.5, "csr", "bf16")
    n_dst = mfg_targets(b.num_sampled_nodes, 2, 0)
    hidden = model.layer(0, b.x, mfg_edges(b.edge_index, b.num_sampled_edges, 2, 0), n_dst)
    assert type(hidden.grad_fn).__name__ == "_ReluDropoutBackward"


def test_warm_up_runs_the_kernel():
    warm_up()
