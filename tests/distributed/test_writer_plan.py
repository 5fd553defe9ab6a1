"""A writer's batch laid out over the partitions (``Plan``), without servers: who owns
each new edge, the pieces' edge rows, and ends that are no node refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from graphrun.distributed.writer_plan import Plan, WriteBatch
from graphrun.errors import ArgumentError, StoreError
from graphrun.names import owners
from graphrun.partition.format import load_partition_book
from graphrun.store.live import GROWTH_BLOCK
from graphrun.store.live_client import LiveView
from graphrun.testing.store import make_partition_dir


class _Writer:
    def __init__(self, book: Any, view: LiveView) -> None:
        self.book, self._view = book, view

    def lookup(self, orig_ids: Any) -> np.ndarray:
        raise AssertionError("graph ids need no lookup")

    def view(self, fresh: bool = False) -> LiveView:
        return self._view


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> Any:
    return load_partition_book(make_partition_dir(tmp_path_factory.mktemp("plan"), 2)[1])


def plan_of(book: Any, src: list[int], dst: list[int], blocks: list[int] = ()) -> Plan:
    n = book.num_nodes
    view = LiveView(0, n, book.num_edges, np.asarray(blocks, np.int64), np.empty(0, np.int64))
    batch = WriteBatch()
    batch.edges.append((0, np.asarray(src, np.int64), np.asarray(dst, np.int64), False))
    return Plan(_Writer(book, view), batch, view)


def test_new_edges_go_to_their_dst_s_owner_with_their_ids(book):
    """A piece's new edges are ``[2, m]`` src, dst and their ids the runs ``live_begin``
    gave (no third row), int32 where the graph's ids fit, without edge types where the
    graph has one (issue 42, wire65: the bytes of a piece, on the wire and in the logs)."""
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, book.num_nodes, (2, 500))
    plan = plan_of(book, src.tolist(), dst.tolist())
    want = owners(book.node_offsets, dst)
    assert (plan.edge_part == want).all()
    counts = plan.edge_counts()
    first = book.num_edges
    plan.give_ids([[], []], [[[first, counts[0]]], [[first + 10**6, counts[1]]]])
    assert len(book.edge_types) == 1
    for p in plan.parts():
        piece = plan.piece(p, 1)
        assert piece.new_edges is not None and piece.edge_types is None
        rows = piece.new_edges.array("piece")
        mine = np.flatnonzero(want == p)
        assert rows.shape == (2, len(mine)) and rows.dtype == np.int32  # the ids fit
        assert (rows[0] == src[mine]).all() and (rows[1] == dst[mine]).all()
        assert piece.edge_ids == [(first + 10**6 * p, len(mine))]
        body, tensors = plan.wire(p, 1)
        assert sum(t.nbytes for t in tensors) == 8 * len(mine)  # src, dst: nothing else
        assert body["edge_ids"] == [(first + 10**6 * p, len(mine))]


def test_a_growth_id_goes_to_its_block_s_owner(book):
    n = book.num_nodes
    plan = plan_of(book, [0, n + 5], [n + GROWTH_BLOCK + 1, 1], blocks=[0, 1])
    assert plan.edge_part.tolist() == [1, int(owners(book.node_offsets, np.asarray([1]))[0])]


@pytest.mark.parametrize("end", ["src", "dst"])
@pytest.mark.parametrize("bad", [-1, "past"])
def test_an_end_that_is_no_node_is_refused(book, end, bad):
    n = book.num_nodes
    bad_id = -1 if bad == -1 else n + GROWTH_BLOCK  # no growth block handed out there
    src, dst = ([bad_id], [3]) if end == "src" else ([3], [bad_id])
    with pytest.raises(ArgumentError, match=f"add_edges {end}: graph id {bad_id} is not a node"):
        plan_of(book, src, dst, blocks=[0])


@pytest.mark.parametrize("parts", [1, 3, 40000])
def test_positions_by_partition_keep_the_batch_order(parts):
    from graphrun.distributed.writer_plan import _by_part

    rng = np.random.default_rng(parts)
    part = rng.integers(0, min(parts, 3), 1000)  # partitions past the third hold none
    got = _by_part(part, parts)
    assert len(got) == parts
    for p in range(parts):
        assert got[p].tolist() == np.flatnonzero(part == p).tolist()
    assert [len(x) for x in _by_part(part[:0], parts)] == [0] * parts


@pytest.mark.parametrize(
    "bounds", [[0, 10], [0, 5, 10], [0, 4, 4, 10], [0, 0, 3, 10, 10], [2, 6, 9]]
)
def test_inner_owners_are_the_blocks_a_search_gives(bounds):
    from graphrun.distributed.writer_plan import _inner_owners

    b = np.asarray(bounds, np.int64)
    ids = np.arange(b[0], b[-1], dtype=np.int64)  # every id inside, empty blocks skipped
    assert _inner_owners(b, ids).tolist() == owners(b, ids).tolist()
    assert _inner_owners(b, ids).dtype == np.int64


def test_ids_for_another_number_of_partitions_are_refused(book):
    plan = plan_of(book, [0, 1], [2, 3])
    first = book.num_edges
    with pytest.raises(StoreError, match="ids for 1 partitions, asked 2"):
        plan.give_ids([[], []], [[[first, 2]]])
