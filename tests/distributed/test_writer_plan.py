"""A write batch laid out over the partitions (``writer_plan.Plan``), without a store."""

from __future__ import annotations

import numpy as np
import pytest

from graphrun.distributed.writer_plan import Plan, WriteBatch
from graphrun.errors import ArgumentError
from graphrun.partition.book import PartitionBook
from graphrun.store.live_client import LiveView

BOOK = PartitionBook(
    num_parts=2, node_types=("_N",), edge_types=(("_N", "_E", "_N"),),
    node_offsets=np.array([0, 50, 100]), edge_offsets=np.array([0, 200, 400]),
    node_ranges_all=np.array([[0, 50, 100]]), edge_ranges_all=np.array([[0, 200, 400]]),
)  # fmt: skip
VIEW = LiveView(0, 100, 400, np.empty(0, np.int64), np.empty(0, np.int64))


class _Writer:
    book = BOOK

    def lookup(self, orig_ids: object) -> np.ndarray:
        """Base nodes' original ids are their graph ids here."""
        o = np.asarray(orig_ids, np.int64)
        return np.where((o >= 0) & (o < 100), o, -1)

    def view(self, fresh: bool = False) -> LiveView:
        return VIEW


def _batch(src: list[int], dst: list[int], new_nodes: int = 0) -> WriteBatch:
    b = WriteBatch()
    if new_nodes:
        b.orig.append(1000 + np.arange(new_nodes, dtype=np.int64))
        b.ntype.append(np.zeros(new_nodes, np.int32))
    b.edges.append((0, np.asarray(src, np.int64), np.asarray(dst, np.int64), False))
    return b


@pytest.mark.parametrize("new_nodes", [0, 1, 2])
@pytest.mark.parametrize("end", ["src", "dst"])
@pytest.mark.parametrize("bad", [-1, -2, 100])
def test_a_graph_id_that_is_no_node_is_refused_by_name(new_nodes, end, bad):
    """Graph ids (``orig=False``) below 0 were taken for the batch's own new nodes (the
    plan names them ``-(i + 1)``): -1 became the batch's first new node, and with no new
    node the plan went on with an owner it did not have."""
    src, dst = ([bad, 3], [5, 60]) if end == "src" else ([3, 5], [bad, 60])
    with pytest.raises(ArgumentError, match=f"add_edges {end}: graph id {bad} is not a node"):
        Plan(_Writer(), _batch(src, dst, new_nodes), VIEW)


def test_edges_between_base_nodes_go_to_their_destinations_partition():
    plan = Plan(_Writer(), _batch([3, 70, 99], [5, 60, 0]), VIEW)
    assert plan.edge_part.tolist() == [0, 1, 0]
    assert plan.edge_counts() == [2, 1]
    plan.give_ids([[], []], [[[400, 2]], [[4096 + 400, 1]]])
    assert plan.parts() == [0, 1]
    body, tensors = plan.wire(0, 7)
    edges = tensors[body["new_edges"]]
    assert edges.tolist() == [[3, 99], [5, 0], [400, 401]]
    body, tensors = plan.wire(1, 7)
    assert tensors[body["new_edges"]].tolist() == [[70], [60], [4496]]


def test_ends_by_original_id_and_by_graph_id_in_one_batch():
    """A batch naming some ends by original id (its new node too) and others by graph
    id: each edge goes to its destination's partition, the new node's end gets its id."""
    b = _batch([3], [60], new_nodes=1)  # by graph id
    b.edges.append((0, np.asarray([1000, 7]), np.asarray([5, 1000]), True))  # by orig id
    plan = Plan(_Writer(), b, VIEW)
    part = int(plan.node_part[0])
    assert plan.edge_part.tolist() == [1, 0, part]
    plan.give_ids([[[100, 1]], []] if part == 0 else [[], [[100, 1]]],
                  [[[400, 1 + (part == 0)]], [[4496, 1 + (part == 1)]]])  # fmt: skip
    assert plan.src.tolist() == [3, 100, 7] and plan.dst.tolist() == [60, 5, 100]
