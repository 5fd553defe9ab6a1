import numpy as np
import pytest
import torch

from graphrun.errors import ArgumentError
from graphrun.store.reducers import add, assign, coalesce, get_reducer, sparse_adagrad, sparse_adam


def test_assign_and_add():
    data = np.zeros((5, 2), np.float32)
    assign(data, np.array([1, 3]), np.ones((2, 2), np.float32), (), {})
    add(data, np.array([1, 1, 4]), np.ones((3, 2), np.float32), (), {})
    np.testing.assert_array_equal(data[:, 0], [0, 3, 0, 1, 1])


def test_coalesce_sums_repeated_rows():
    rows, vals = coalesce(np.array([3, 1, 3]), np.array([[1.0], [2.0], [4.0]], np.float32))
    np.testing.assert_array_equal(rows, [1, 3])
    np.testing.assert_array_equal(vals.ravel(), [2, 5])


def _torch_run(opt_cls, steps, ids_per_step, grads_per_step, init, **kw):
    emb = torch.nn.Embedding(init.shape[0], init.shape[1], sparse=True)
    emb.weight.data[:] = torch.from_numpy(init)
    opt = opt_cls(emb.parameters(), **kw)
    for ids, g in zip(ids_per_step, grads_per_step, strict=True):
        opt.zero_grad()
        out = emb(torch.from_numpy(ids))
        out.backward(torch.from_numpy(g))
        opt.step()
    return emb.weight.detach().numpy()


@pytest.mark.parametrize("name", ["sparse_adagrad", "sparse_adam"])
def test_optimizers_match_torch(name):
    rng = np.random.default_rng(1)
    n, d, steps = 10, 3, 4
    init = rng.normal(size=(n, d)).astype(np.float32)
    # every row is touched each step (torch's SparseAdam counts steps per parameter,
    # ours per row; they agree when all rows move together), with repeats
    ids = [np.concatenate([np.arange(n), rng.integers(0, n, 5)]) for _ in range(steps)]
    grads = [rng.normal(size=(len(i), d)).astype(np.float32) for i in ids]
    data = init.copy()
    if name == "sparse_adagrad":
        states = [np.zeros((n, d), np.float32)]
        params = {"lr": 0.1, "eps": 1e-10}
        ref = _torch_run(torch.optim.Adagrad, steps, ids, grads, init, lr=0.1, eps=1e-10)
    else:
        states = [
            np.zeros((n, d), np.float32),
            np.zeros((n, d), np.float32),
            np.zeros(n, np.float32),
        ]
        params = {"lr": 0.05, "beta1": 0.9, "beta2": 0.99, "eps": 1e-8}
        ref = _torch_run(
            torch.optim.SparseAdam, steps, ids, grads, init, lr=0.05, betas=(0.9, 0.99)
        )
    for i, g in zip(ids, grads, strict=True):
        get_reducer(name)(data, i, g, states, params)
    np.testing.assert_allclose(data, ref, rtol=1e-4, atol=1e-5)


def test_unknown_reducer_and_bad_param():
    with pytest.raises(ArgumentError, match="unknown 'max'"):
        get_reducer("max")
    with pytest.raises(ArgumentError, match=r"params\.lr"):
        sparse_adagrad(
            np.zeros((2, 1)), np.array([0]), np.ones((1, 1)), [np.zeros((2, 1))], {"lr": "x"}
        )
    with pytest.raises(ArgumentError, match=r"params\.lr"):
        sparse_adam(
            np.zeros((2, 1)), np.array([0]), np.ones((1, 1)), [np.zeros((2, 1))] * 3, {"lr": None}
        )
