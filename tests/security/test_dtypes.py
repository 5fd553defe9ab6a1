"""One allow-list of wire dtypes, checked before a store creates anything (issue 26)."""

from __future__ import annotations

import numpy as np
import pytest

from graphrun.errors import ArgumentError
from graphrun.rpc.codec import ALLOWED_DTYPES, wire_dtype
from graphrun.store.state import TensorInfo, received

REFUSED = ["object", "O", "U16", "<U16", "M8", "datetime64[s]", "V16", "S8",
           "complex128", ">f4", "float128", "f4,i4", "nope", 3]  # fmt: skip


@pytest.mark.parametrize("name", sorted(ALLOWED_DTYPES))
def test_wire_dtypes_round_trip(name):
    assert wire_dtype(name).name == name


@pytest.mark.parametrize("name", REFUSED)
def test_other_dtypes_are_refused(name):
    with pytest.raises(ValueError, match="is not one of"):
        wire_dtype(name)
    info = {"name": "x", "job": "j", "policy": "node:_N", "dtype": name, "row_shape": [],
            "num_rows": 1, "part_rows": 1, "segment": "s", "persistent": False}  # fmt: skip
    with pytest.raises(ArgumentError, match="TensorInfo from a peer: dtype"):
        received(TensorInfo, info)


def test_init_refuses_a_dtype_before_making_its_segment(shared_store):
    """`init` took any numpy dtype: `object` failed with an internal error after creating
    its shared-memory segment (leaked), U16/M8/V16/S8/complex128 tensors were created but
    could not be pulled, and `reduce` on them crashed. A job key could do it."""
    with shared_store.client(shared_store.job_key("jobA"), "jobA") as a:
        before = sorted(p.name for p in shared_store.shm.iterdir())
        for name in ["object", "U16", "M8", "V16", "S8", "complex128", ">f4"]:
            with pytest.raises(ArgumentError, match="field 'dtype'"):
                a.init_tensor("t", "node:_N", (2,), dtype=name)
        assert sorted(p.name for p in shared_store.shm.iterdir()) == before
        assert a.list_tensors() == [t for t in a.list_tensors() if t.name.startswith("node/")]
        a.init_tensor("ok", "node:_N", (2,), dtype="f2")
        assert a.pull("ok", [0]).dtype == np.float16
