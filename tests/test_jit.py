"""graphrun.jit: the one place that compiles a kernel with numba, cached where it can be."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from graphrun.jit import njit


def _total(a: np.ndarray) -> float:
    s = 0.0
    for v in a:
        s += v
    return s


def test_a_kernel_compiles_where_numba_cannot_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    # a read-only image whose user can write neither beside the source nor a home cache:
    # numba finds no place for its cache, and cache=True raised at the kernel's import
    monkeypatch.setattr(numba.core.caching.CacheImpl, "_locator_classes", [])
    with pytest.raises(RuntimeError, match="no locator"):
        numba.njit(cache=True)(_total)
    kernel = njit(_total, nogil=True)
    assert kernel(np.arange(5.0)) == 10.0
    assert kernel.targetoptions.get("nogil") is True


def test_a_kernel_is_cached_where_numba_can() -> None:
    kernel = njit(_total)
    assert kernel(np.ones(3)) == 3.0
    assert kernel._cache._impl.locator is not None  # on disk


def _first_row_sum(a: np.ndarray) -> int:
    s = 0
    for j in range(a.shape[1]):
        s += a[0, j]
    return s


def test_a_kernel_with_a_signature_is_compiled_for_it_alone() -> None:
    """The live index's merge: one signature taking arrays of any layout (a run sorted
    by a gather is Fortran-ordered, a merged one C-ordered), never compiled again for
    another argument type."""
    kernel = njit(_first_row_sum, "int64(int64[:, :])", nogil=True)
    c = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert kernel(c) == 3 and kernel(np.asfortranarray(c)) == 3 and kernel(c[:, ::2]) == 2
    assert len(kernel.signatures) == 1
    with pytest.raises(TypeError):
        kernel(c.astype(np.float64))
