"""A request's ids checked (protocol.parse): the same answers for a few ids (checked as
Python ints) as for many (numpy's checks)."""

import numpy as np
import pytest

from graphrun.errors import BadRequest
from graphrun.serving.protocol import FEW_IDS, Bounds, Graph, parse

GRAPH = Graph(num_nodes=1000, in_dim=4)


def _query(ids):
    body = {"inputs": [{"name": "node_ids", "shape": [len(ids)], "datatype": "INT64",
                        "data": list(ids)}]}  # fmt: skip
    return parse(body, GRAPH, Bounds(), "precomputed")


@pytest.mark.parametrize("n", [1, FEW_IDS, FEW_IDS + 1, 500])
def test_ids_checked_alike_for_few_and_many(n):
    ids = list(range(10, 10 + n))
    np.testing.assert_array_equal(_query(ids).ids, ids)
    for bad in (-1, 1000, 5000):  # the first one not a node, where it stands
        got = [*ids[: n // 2], bad, 1001, *ids[n // 2 :]][: max(n, 2)]
        with pytest.raises(BadRequest, match=f"^inputs.node_ids: id {bad} is not a node "
                                             r"\(ids are below 1000\)$"):  # fmt: skip
            _query(got)
    twice = [*ids[::-1], 12, 11] if n > 2 else [11, 12, 12, 11]
    with pytest.raises(BadRequest, match=r"^inputs\.node_ids: id 11 appears twice$"):
        _query(twice[: max(len(twice), 4)])
