"""Routing: ids grouped by owner once, remote requests first, answers in the caller's order."""

from pathlib import Path

import numpy as np
import pytest

from graphrun.errors import ArgumentError
from graphrun.store import routing
from graphrun.store.state import PartitionInfo, Segment, TensorInfo, received
from graphrun.wire import to_builtins

BOUNDS = np.array([0, 10, 10, 25, 40])  # partition 1 is empty


def test_ids_are_grouped_by_owner_in_their_order():
    ids = np.array([30, 3, 12, 39, 0, 24, 11])
    groups = routing.by_owner(BOUNDS, ids)
    assert [g.part for g in groups] == [0, 2, 3]
    for g in groups:
        np.testing.assert_array_equal(ids[g.pos], g.ids)
        lo, hi = BOUNDS[g.part], BOUNDS[g.part + 1]
        assert ((g.ids >= lo) & (g.ids < hi)).all()
        np.testing.assert_array_equal(g.rows, g.ids - lo)
    assert sorted(np.concatenate([g.pos for g in groups]).tolist()) == list(range(len(ids)))
    np.testing.assert_array_equal(groups[1].ids, [12, 24, 11])  # the caller's order kept


def test_one_owner_is_one_group_over_all_the_ids():
    ids = np.array([14, 12, 20])
    (g,) = routing.by_owner(BOUNDS, ids)
    assert g.part == 2 and g.pos == slice(0, 3) and g.ids is ids
    np.testing.assert_array_equal(g.rows, [4, 2, 10])
    (empty,) = routing.by_owner(BOUNDS, np.empty(0, np.int64))
    assert len(empty.ids) == 0


def test_pieces_cover_a_group_in_order():
    ids = np.arange(10, 17)
    (g,) = routing.by_owner(BOUNDS, ids)
    pieces = g.pieces(3)
    assert [p.pos for p in pieces] == [slice(0, 2), slice(2, 4), slice(4, 7)]
    np.testing.assert_array_equal(np.concatenate([p.rows for p in pieces]), ids - 10)
    mixed = routing.by_owner(BOUNDS, np.array([1, 30, 2, 31, 3]))
    halves = mixed[0].pieces(2)
    np.testing.assert_array_equal(np.concatenate([h.pos for h in halves]), mixed[0].pos)


def test_remote_requests_are_sent_before_local_work():
    events = []
    groups = routing.by_owner(BOUNDS, np.array([1, 12, 30]))
    answers = routing.remote_first(
        groups,
        lambda part: part == 0,
        lambda g: events.append(("send", g.part)) or g.part,
        lambda pending: events.append(("wait", pending)) or f"remote {pending}",
        lambda g: events.append(("local", g.part)) or "local",
    )
    got = [(g.part, a) for g, a in answers]
    assert events == [("send", 2), ("send", 3), ("local", 0), ("wait", 2), ("wait", 3)]
    assert got == [(0, "local"), (2, "remote 2"), (3, "remote 3")]


def test_partition_info_crosses_the_wire_whole():
    ti = TensorInfo("node/_N/feat", "", "node:_N", "float32", (4,), 100, 50, "seg.1")
    info = PartitionInfo(
        part=1, index=0, backups=("tcp://b:1",), host={"hostname": "h"}, shm_dir=Path("/dev/shm"),
        book={"num_parts": 2}, heartbeat_timeout=30.0, tensors=(ti,),
        structure={"indptr": Segment("seg.2", "int64", (51,))},
        deletions=Segment("seg.0", "int64", (1,)),
    )  # fmt: skip
    again = received(PartitionInfo, to_builtins(info))
    assert again.tensors == (ti,) and again.structure == info.structure
    assert again.deletions == info.deletions and str(again.shm_dir) == "/dev/shm"
    broken = to_builtins(info)
    del broken["book"]
    with pytest.raises(ArgumentError, match="PartitionInfo from a peer: book: missing"):
        received(PartitionInfo, broken)
    broken = to_builtins(info)
    broken["structure"]["indptr"]["shape"] = ["51"]
    with pytest.raises(
        ArgumentError, match=r"structure\[...\].shape\[0\]: Expected `int`, got `str`"
    ):
        received(PartitionInfo, broken)


@pytest.mark.parametrize("shape", [(50,), (50, 3)])
@pytest.mark.parametrize(
    "at",
    [
        slice(10, 30),
        np.arange(5, 25),  # one run
        np.r_[0:4, 9:15, 40:50],  # a few runs
        np.arange(0, 40, 2),  # 20 runs of one position
        np.arange(49, 9, -1),  # 40 runs (more than MAX_RUNS): gather, then scatter
        np.array([7, 3, 30, 31, 32, 0]),  # out of order
        np.empty(0, np.int64),
    ],
)
def test_rows_land_where_they_belong_however_the_positions_run(shape, at) -> None:
    from graphrun.store.routing import put_into, take_into

    rng = np.random.default_rng(0)
    src = rng.random((100, *shape[1:]))
    n = len(range(50)[at]) if isinstance(at, slice) else len(at)
    rows = rng.integers(0, 100, n)
    want = np.zeros(shape)
    want[at] = src[rows]
    got = np.zeros(shape)
    take_into(got, at, src, rows)
    np.testing.assert_array_equal(got, want)
    put = np.zeros(shape)
    put_into(put, at, src[rows])
    np.testing.assert_array_equal(put, want)


@pytest.mark.parametrize(
    ("dtype", "row"),
    [
        (np.float32, (100,)),
        (np.int64, ()),
        (np.bool_, (3,)),
        (np.uint8, (2, 5)),
        (np.float64, (7,)),
    ],
)
@pytest.mark.parametrize("layout", ["contiguous", "read-only", "strided"])
@pytest.mark.parametrize("compiled", ["", "1"])
def test_scattered_rows_match_numpy_for_every_dtype_and_layout(
    dtype, row, layout, compiled, monkeypatch
) -> None:
    """Positions of many runs go through the compiled gather-scatter with
    GRAPHRUN_COMPILED=1 (any dtype, row shape, read-only shared memory; a strided source
    falls back to numpy), through numpy without: as numpy's ``out[at] = src[rows]``."""
    from graphrun.store.routing import take_into

    monkeypatch.setenv("GRAPHRUN_COMPILED", compiled)
    rng = np.random.default_rng(1)
    src = (rng.random((400, *row)) * 200).astype(dtype)
    if layout == "read-only":
        src.flags.writeable = False
    elif layout == "strided":
        src = np.repeat(src, 2, axis=0)[::2]
        assert not src.flags.c_contiguous
    at = rng.permutation(1000)[:600]
    rows = rng.integers(0, 400, 600)
    want = np.zeros((1000, *row), dtype)
    want[at] = src[rows]
    got = np.zeros((1000, *row), dtype)
    take_into(got, at, src, rows)
    np.testing.assert_array_equal(got, want)
