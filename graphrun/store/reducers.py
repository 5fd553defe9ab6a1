"""Server-side reducers for ``push``: pure numpy functions over local rows.

A reducer is ``reducer(data, rows, values, states, params)``: ``data`` is the
partition's slice of the tensor (a writable shared-memory array), ``rows`` the local
row of each pushed value (int64, may repeat), ``values`` the pushed rows, ``states``
the optimizer state arrays named by the request (same rows as ``data``), ``params``
the request's scalar parameters. Reducers modify ``data`` (and ``states``) in place.

* ``assign``: ``data[rows] = values`` (the last write of a repeated row wins)
* ``add``: ``data[rows] += values`` (repeated rows accumulate)
* ``sparse_adagrad``: gradients in ``values``; state ``[sum]``; params ``lr``, ``eps``
* ``sparse_adam``: gradients; states ``[m, v, step]``; params ``lr``, ``beta1``,
  ``beta2``, ``eps``; bias correction per row (each row counts its own steps)

Optimizer reducers first sum the gradients of repeated rows, as torch's sparse
optimizers do with ``coalesce()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from graphrun.errors import ArgumentError

Reducer = Callable[
    [np.ndarray, np.ndarray, np.ndarray, Sequence[np.ndarray], Mapping[str, Any]], None
]

#: the state tensors each optimizer reducer needs: (suffix, has the tensor's row shape);
#: a state without the row shape holds one float32 per row (Adam's step count)
STATE_SPECS: dict[str, tuple[tuple[str, bool], ...]] = {
    "assign": (),
    "add": (),
    "sparse_adagrad": (("sum", True),),
    "sparse_adam": (("m", True), ("v", True), ("step", False)),
}


def _param(params: Mapping[str, Any], key: str, default: float) -> float:
    val = params.get(key, default)
    if not isinstance(val, int | float) or isinstance(val, bool):
        raise ArgumentError(f"params.{key}: expected a number, got {val!r}")
    return float(val)


def assign(
    data: np.ndarray,
    rows: np.ndarray,
    values: np.ndarray,
    states: Sequence[np.ndarray],
    params: Mapping[str, Any],
) -> None:
    data[rows] = values


def add(
    data: np.ndarray,
    rows: np.ndarray,
    values: np.ndarray,
    states: Sequence[np.ndarray],
    params: Mapping[str, Any],
) -> None:
    uniq, summed = coalesce(rows, values)
    data[uniq] += summed.astype(data.dtype, copy=False)


def coalesce(rows: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique rows and the sum of the values of each (``np.add.reduceat`` over
    the rows sorted once — much faster than ``np.add.at`` on 2-d values)."""
    if len(rows) == 0:
        return rows, values
    order = np.argsort(rows, kind="stable")
    srows = rows[order]
    starts = np.flatnonzero(np.r_[True, srows[1:] != srows[:-1]])
    svals = values[order]
    if len(starts) == len(rows):
        return srows, svals
    return srows[starts], np.add.reduceat(svals, starts, axis=0)


def sparse_adagrad(
    data: np.ndarray,
    rows: np.ndarray,
    values: np.ndarray,
    states: Sequence[np.ndarray],
    params: Mapping[str, Any],
) -> None:
    lr, eps = _param(params, "lr", 0.01), _param(params, "eps", 1e-10)
    (state_sum,) = states
    rows, grad = coalesce(rows, values.astype(np.float32, copy=False))
    s = state_sum[rows] + grad * grad
    state_sum[rows] = s
    data[rows] -= (lr * grad / (np.sqrt(s) + eps)).astype(data.dtype, copy=False)


def sparse_adam(
    data: np.ndarray,
    rows: np.ndarray,
    values: np.ndarray,
    states: Sequence[np.ndarray],
    params: Mapping[str, Any],
) -> None:
    lr = _param(params, "lr", 0.001)
    b1, b2 = _param(params, "beta1", 0.9), _param(params, "beta2", 0.999)
    eps = _param(params, "eps", 1e-8)
    m_all, v_all, step_all = states
    rows, grad = coalesce(rows, values.astype(np.float32, copy=False))
    step = step_all[rows] + 1
    step_all[rows] = step
    m = b1 * m_all[rows] + (1 - b1) * grad
    v = b2 * v_all[rows] + (1 - b2) * grad * grad
    m_all[rows], v_all[rows] = m, v
    shape = (-1,) + (1,) * (grad.ndim - 1)
    m_hat = m / (1 - b1 ** step.astype(np.float64)).reshape(shape)
    v_hat = v / (1 - b2 ** step.astype(np.float64)).reshape(shape)
    data[rows] -= (lr * m_hat / (np.sqrt(v_hat) + eps)).astype(data.dtype, copy=False)


REDUCERS: dict[str, Reducer] = {
    "assign": assign,
    "add": add,
    "sparse_adagrad": sparse_adagrad,
    "sparse_adam": sparse_adam,
}


def get_reducer(name: str) -> Reducer:
    try:
        return REDUCERS[name]
    except KeyError:
        raise ArgumentError(f"reducer: unknown {name!r}; known: {sorted(REDUCERS)}") from None
