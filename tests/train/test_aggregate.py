"""The mean over a CSR (graphrun.train.aggregate): its numba backward against torch's own
``embedding_bag`` gradient and a plain index_add reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from graphrun.train.aggregate import csr_rows, mean_csr, mean_split


def graph(seed: int, n_src: int = 300, n_dst: int = 120, width: int = 24):
    gen = torch.Generator().manual_seed(seed)
    nnz = 1000 + 300 * seed
    dst = torch.randint(0, n_dst - 10, (nnz,), generator=gen)  # the last 10 rows empty
    src = torch.randint(0, n_src, (nnz,), generator=gen)  # repeats: a source twice in a row
    return torch.stack([src, dst]), torch.randn(n_src, width, generator=gen), n_dst


def reference_grad(ei: torch.Tensor, n_src: int, n_dst: int, g: torch.Tensor) -> torch.Tensor:
    """d(mean)/dx by hand: each edge adds its row's gradient over the row's degree."""
    src, dst = ei
    deg = torch.bincount(dst, minlength=n_dst).clamp_min(1).float()
    return torch.zeros(n_src, g.size(1)).index_add_(0, src, g[dst] / deg[dst, None])


@pytest.mark.parametrize("seed", range(4))
def test_mean_gradient_equals_torchs_and_the_by_hand_reference(seed):
    ei, x, n_dst = graph(seed)
    offsets, columns = csr_rows(ei, n_dst)
    mine, torchs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = mean_csr(mine, offsets, columns)
    assert out.grad_fn is not None and type(out.grad_fn).__name__ == "_MeanCSRBackward"
    want = F.embedding_bag(columns, torchs, offsets, mode="mean", include_last_offset=True)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)  # a weighted sum: rounding
    g = torch.randn(n_dst, x.size(1), generator=torch.Generator().manual_seed(99))
    out.backward(g)
    want.backward(g)
    assert mine.grad is not None and torchs.grad is not None
    torch.testing.assert_close(mine.grad, torchs.grad, atol=1e-6, rtol=1e-5)
    by_hand = reference_grad(ei, x.size(0), n_dst, g)
    torch.testing.assert_close(mine.grad, by_hand, atol=1e-6, rtol=1e-5)


def test_bf16_rows_get_a_bf16_gradient_summed_in_fp32():
    ei, x, n_dst = graph(5)
    offsets, columns = csr_rows(ei, n_dst)
    xb = x.to(torch.bfloat16).requires_grad_()
    out = mean_csr(xb, offsets, columns)
    assert out.dtype == torch.bfloat16
    g = torch.randn(n_dst, x.size(1)).to(torch.bfloat16)
    out.backward(g)
    assert xb.grad is not None and xb.grad.dtype == torch.bfloat16
    want = reference_grad(ei, x.size(0), n_dst, g.float())
    torch.testing.assert_close(xb.grad.float(), want, atol=0.02, rtol=0.01)  # one rounding


def test_a_mean_in_a_chain_of_layers_passes_its_gradient_on():
    """gradcheck-style: the gradient of a loss through the mean equals finite differences."""
    ei, x, n_dst = graph(6, 40, 20, 3)
    offsets, columns = csr_rows(ei, n_dst)
    w = torch.randn(3, 2)

    def loss(t: torch.Tensor) -> torch.Tensor:
        return (mean_csr(t, offsets, columns) @ w).tanh().sum()

    x = x.requires_grad_()
    loss(x).backward()
    assert x.grad is not None
    eps, checked = 1e-2, 0
    for r, c in [(int(columns[0]), 0), (int(columns[7]), 2), (int(columns[-1]), 1)]:
        bump = torch.zeros_like(x)
        bump[r, c] = eps
        with torch.no_grad():
            numeric = (loss(x + bump) - loss(x - bump)) / (2 * eps)
        assert abs(float(numeric) - float(x.grad[r, c])) < 2e-3
        checked += 1
    assert checked == 3


def test_the_kernel_compiles_where_no_cache_directory_can_be_written(monkeypatch):
    import numba.core.caching

    from graphrun.train import aggregate

    monkeypatch.setattr(numba.core.caching.CacheImpl, "_locator_classes", [])  # read-only
    monkeypatch.setattr(aggregate, "_COMPILED", [])
    ei, x, n_dst = graph(7)
    x.requires_grad_()
    mean_csr(x, *csr_rows(ei, n_dst)).backward(torch.ones(n_dst, x.size(1)))
    assert x.grad is not None
    torch.testing.assert_close(
        x.grad, reference_grad(ei, x.size(0), n_dst, torch.ones(n_dst, x.size(1)))
    )


@pytest.mark.parametrize("seed", range(3))
def test_the_mean_over_two_tables_equals_the_mean_over_one(seed):
    # the edges' sources split between two tables (a partition in place, the pulled
    # rows): the same means as over the one table, the empty rows zero
    ei, x, n_dst = graph(seed)
    offsets, columns = csr_rows(ei, n_dst)
    want = mean_csr(x, offsets, columns)
    rows = torch.repeat_interleave(torch.arange(n_dst), offsets.diff())
    near = columns < 200
    pulled = x[200:].clone()
    got = mean_split(
        [(x[:200], columns[near], rows[near]), (pulled, columns[~near] - 200, rows[~near])], n_dst
    )
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert bool((got[-10:] == 0).all())
    only = mean_split([(x, columns, rows), (pulled[:0], columns[:0], rows[:0])], n_dst)
    torch.testing.assert_close(only, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_csr_rows_counts_grouped_edges_in_one_pass_and_sorts_the_others(seed):
    # the compiled pass against bincount and cumsum: empty rows first, between and last,
    # a source twice in a row; shuffled edges take the stable sort to the same rows
    ei, _, n_dst = graph(seed)
    ei[1] = (ei[1] + 3).clamp(max=n_dst - 1)  # rows 0-2 empty too
    grouped = ei[:, torch.argsort(ei[1], stable=True)]
    want = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(ei[1], minlength=n_dst)])
    want = want.cumsum(0)
    offsets, columns = csr_rows(grouped, n_dst)
    assert torch.equal(offsets, want) and torch.equal(columns, grouped[0])
    offsets, columns = csr_rows(ei, n_dst)
    assert torch.equal(offsets, want) and torch.equal(columns, grouped[0])
    offsets, columns = csr_rows(torch.zeros(2, 0, dtype=torch.long), 4)
    assert torch.equal(offsets, torch.zeros(5, dtype=torch.long)) and columns.numel() == 0


def plain_mean(ei: torch.Tensor, x: torch.Tensor, n_dst: int) -> torch.Tensor:
    """The mean in plain torch, fp32: each edge's source row added, over the degree."""
    src, dst = ei
    deg = torch.bincount(dst, minlength=n_dst).clamp_min(1).float()
    return torch.zeros(n_dst, x.size(1)).index_add_(0, dst, x[src].float()) / deg[:, None]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grad", [False, True])
def test_the_weighted_sum_is_the_plain_mean(seed, dtype, grad):
    # fbgemm's sum weighted 1 / degree: empty rows (the last 10), neighbours twice in a
    # row, with and without a gradient (the autograd function or the sum alone)
    ei, x, n_dst = graph(seed)
    ei = ei[:, torch.argsort(ei[1], stable=True)]
    ei[0, 1::2] = ei[0, 0:-1:2]  # each odd edge repeats the one before it
    x = x.to(dtype).requires_grad_(grad)
    out = mean_csr(x, *csr_rows(ei, n_dst))
    assert out.dtype == dtype and (out.grad_fn is not None) == grad
    want = plain_mean(ei, x.detach().float(), n_dst)
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16: the weight and mean rounded
    torch.testing.assert_close(out.detach().float(), want, atol=tol, rtol=tol)
    assert not out[-10:].any()


def test_offsets_past_the_columns_are_refused_before_a_weight_is_written():
    x, columns = torch.randn(10, 4), torch.arange(10)
    with pytest.raises(RuntimeError, match="offsets"):
        mean_csr(x, torch.tensor([0, 5, 2000]), columns)
