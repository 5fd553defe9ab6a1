"""The distributed mode's slice-by-slice kernels: the arrays of the whole-array versions
they replaced, with a peak of their output plus a slice (numpy's allocations are
traced by ``tracemalloc``)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from graphrun.partition import shuffle, xtrapulp

SLICE = 1 << 14  # entries per pass here: the bound below is a few slices, not the input


def traced(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and the bytes it allocated at its peak beyond what it returned."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, peak - max(now, base)


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xtrapulp, "PIECE", SLICE)
    monkeypatch.setattr(shuffle, "PIECE", SLICE)


def test_adjacency_by_counting_sort_is_scipys_csr(small_slices: None) -> None:
    rng = np.random.default_rng(0)
    n, width, m = 50_000, 70_000, 1 << 21
    pairs = np.stack([rng.integers(0, n, m), rng.integers(0, width, m)], axis=1)
    pairs = pairs.astype(np.int32)  # with repeats: summed below
    rows, cols = pairs[:, 0], pairs[:, 1]  # strided, as build_local_graph passes them
    (indptr, indices), extra = traced(lambda: xtrapulp._by_row(rows, cols, n))
    # a few slices' temporaries (and n-long counts), not a multiple of the 8 MiB input
    assert extra < 40 * SLICE + 4 * 8 * n
    adj = sp.csr_matrix((np.ones(m, np.float32), indices, indptr), shape=(n, width))
    adj.sum_duplicates()
    want = sp.coo_matrix((np.ones(m, np.float32), (rows, cols)), shape=(n, width)).tocsr()
    assert np.array_equal(adj.indptr, want.indptr)
    assert np.array_equal(adj.indices, want.indices)
    assert np.array_equal(adj.data, want.data)


def test_in_edges_by_destination_then_edge_id(small_slices: None) -> None:
    rng = np.random.default_rng(1)
    a, b, m = 1000, 41_000, 1 << 21
    dst = rng.integers(a, b, m).astype(np.int32)  # by edge id
    (indptr, perm), extra = traced(lambda: shuffle._csc(dst, a, b))
    assert extra < 40 * SLICE + 4 * 8 * (b - a)
    want = np.lexsort((np.arange(m), dst))
    assert perm.dtype == np.int32 and np.array_equal(perm, want)
    assert np.array_equal(indptr, np.searchsorted(dst[want], np.arange(a, b + 1)))


def test_block_pairs_sum_the_edges_between_different_blocks(small_slices: None) -> None:
    rng = np.random.default_rng(2)
    n, ghosts, m = 3000, 500, 40_000
    adj = sp.coo_matrix(
        (
            rng.integers(1, 3, m).astype(np.float32),
            (rng.integers(0, n, m), rng.integers(0, n + ghosts, m)),
        ),
        shape=(n, n + ghosts),
    ).tocsr()
    g = xtrapulp.LocalGraph(0, n, adj.indptr, adj.indices, adj.data, np.arange(ghosts), [])
    block = rng.integers(0, 40, n + ghosts)
    key, weight = xtrapulp._block_pairs(g, block, 40)
    rows = np.repeat(np.arange(n), np.diff(adj.indptr))
    x, y = block[rows], block[adj.indices]
    cross = x != y
    want, inverse = np.unique(x[cross] * 40 + y[cross], return_inverse=True)
    assert np.array_equal(key, want)
    assert np.array_equal(weight, np.bincount(inverse, weights=adj.data[cross]).astype(np.int64))
