"""The linear-time id kernels return exactly what numpy's sorting versions return."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrun.partition import arrays


@pytest.mark.parametrize("max_key", [3, 70_000, 1 << 33])
def test_stable_argsort(max_key: int) -> None:
    keys = np.random.default_rng(1).integers(0, max_key, 5000)
    assert arrays.stable_argsort(keys, max_key).tolist() == np.argsort(keys, kind="stable").tolist()


# ranges below and above twice the input's length: the dense table and the sort
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=60), st.sampled_from([41, 64, 1000, 1 << 40]))
def test_unique_kernels_match_numpy(values: list[int], upper: int) -> None:
    v = np.array(values, dtype=np.int64)
    uniq, inverse = arrays.unique_inverse(v, upper)
    want, want_inverse = np.unique(v, return_inverse=True)
    assert uniq.tolist() == want.tolist() and inverse.tolist() == want_inverse.tolist()
    assert inverse.dtype == np.int64
    uniq, counts = arrays.unique_counts(v, upper)
    want, want_counts = np.unique(v, return_counts=True)
    assert uniq.tolist() == want.tolist() and counts.tolist() == want_counts.tolist()
    assert arrays.unique(v, upper).tolist() == want.tolist()


def test_the_dense_path_is_taken_where_the_table_is_small() -> None:
    # 1000 ids of a range of 100: the table; of a range of 10**6: the sort
    assert arrays._dense(np.zeros(1000, np.int64), 100)
    assert not arrays._dense(np.zeros(1000, np.int64), 10**6)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_stable_argsort_of_32_bit_keys_either_width(dtype: type) -> None:
    keys = np.random.default_rng(2).integers(0, 1 << 31, 5000).astype(dtype)
    got = arrays.stable_argsort(keys, 1 << 31)
    assert got.dtype == np.int64 and got.tolist() == np.argsort(keys, kind="stable").tolist()
    strided = keys[::2]  # not contiguous: the arithmetic digits
    want = np.argsort(strided, kind="stable").tolist()
    assert arrays.stable_argsort(strided, 1 << 31).tolist() == want


def test_a_pass_over_a_mapped_array_holds_one_slice(tmp_path) -> None:
    from graphrun.partition.arrays import pieces
    from graphrun.partition.peaks import Phases

    np.save(tmp_path / "a.npy", np.arange(16 << 20, dtype=np.int64))  # 128 MiB
    arr = np.load(tmp_path / "a.npy", mmap_mode="r")
    clock = Phases()
    clock.start("pass")
    total = sum(int(s.sum()) for _, s in pieces(arr, 1 << 20))  # 8 MiB slices
    clock.start("")
    assert total == (16 << 20) * ((16 << 20) - 1) // 2
    before = clock.phases["pass"]["peak_rss_mb"]
    clock.start("whole")
    assert int(arr.sum()) == total  # touches every page: the whole file resident
    clock.start("")
    assert clock.per_phase and clock.phases["whole"]["peak_rss_mb"] - before > 64
