"""The store's request bodies, declared once and checked at once (graphrun.store.requests)."""

from __future__ import annotations

import pytest

from graphrun.errors import ArgumentError
from graphrun.sampling.server import SampleBody
from graphrun.store.registry import Request
from graphrun.store.requests import BackupBody, InitBody, PushBody, ReplicateBody


def args(op: str, body: dict, type_: type):  # type: ignore[no-untyped-def]
    return Request(op, body).args(type_)


def test_defaults_and_envelope_fields_ignored() -> None:
    push = args("push", {"name": "x", "s": "session", "job": "j", "w": 3}, PushBody)
    assert (push.name, push.reducer, push.states, push.params, push.allow_graph) == (
        "x", "assign", [], {}, False,
    )  # fmt: skip
    init = args("init", {"name": "t", "policy": "node:_N"}, InitBody)
    assert (init.dtype, init.row_shape, init.init, init.exist_ok) == ("float32", [], "zeros", False)


@pytest.mark.parametrize(
    ("op", "body", "type_", "message"),
    [
        ("push", {}, PushBody, "push: name: missing"),
        ("push", {"name": "x", "states": [1]}, PushBody, r"push: states\[0\]: Expected `str`"),
        ("push", {"name": "x", "allow_graph": 1}, PushBody, "push: allow_graph: Expected `bool`"),
        ("init", {"name": "t"}, InitBody, "init: policy: missing"),
        ("init", {"name": "t", "policy": "p", "row_shape": [2, -1]}, InitBody, "row_shape"),
        ("init", {"name": "t", "policy": "p", "row_shape": [1] * 7}, InitBody, "short list"),
        ("init", {"name": "t", "policy": "p", "row_shape": [True]}, InitBody, "Expected `int`"),
        ("register_backup", {"address": "a", "pid": "1"}, BackupBody, "pid: Expected `int`"),
        ("replicate", {"op": "push", "body": {}, "job": "j"}, ReplicateBody, "admin: missing"),
        ("sample_neighbors", {"fanout": [2, -1], "seed": 0}, SampleBody, "non-negative"),
        ("sample_neighbors", {"fanout": [True], "seed": 0}, SampleBody, "Expected `int`"),
        ("sample_neighbors", {"fanout": [2]}, SampleBody, "seed: missing"),
        (
            "sample_neighbors",
            {"fanout": [2], "seed": 0, "weighted": True},
            SampleBody,
            "sample_neighbors: weight: missing",
        ),
    ],
)
def test_a_bad_body_is_one_line_naming_the_operation_and_field(op, body, type_, message) -> None:
    with pytest.raises(ArgumentError, match=message) as info:
        args(op, body, type_)
    assert str(info.value).startswith(f"{op}: ") and "\n" not in str(info.value)
