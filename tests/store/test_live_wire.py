"""A live piece's new edges on the wire and in the log (issue 42, wire65): ``[2, m]`` src,
dst with their ids as the sequencer's ``(start, count)`` runs (``edge_ids``), no edge
types where the graph has one edge type; a piece or log record of the older form (ids
as a third row, edge types given) is still taken and replayed."""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
import pytest

from graphrun.errors import ArgumentError
from graphrun.store.live import LiveDelta, Piece, Rows
from graphrun.store.live_check import check_piece
from graphrun.store.live_log import PieceRecord, open_log, replay
from tests.store.test_live import E, N, edges_rows, schema


def _piece(version: int, src, dst, runs, dtype=np.int64, **kw) -> Piece:
    ends = Rows.of(np.asarray([src, dst], dtype))
    return Piece(version=version, new_edges=ends, edge_ids=runs, **kw)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_ids_as_runs_check_as_the_third_row_did(dtype):
    """``[2, m]`` and runs make the batch a ``[3, m]`` piece makes, ids and runs alike;
    no edge types on a graph of one: each new edge is type 0."""
    runs = [(E, 2), (E + 5, 1)]
    new = check_piece(_piece(1, [0, 1, 2], [3, 4, 3], runs, dtype), schema(), LiveDelta())
    old = Piece(version=1, new_edges=edges_rows([0, 1, 2], [3, 4, 3], [E, E + 1, E + 5]),
                edge_types=Rows.of(np.zeros(3, np.int32)))  # fmt: skip
    was = check_piece(old, schema(), LiveDelta())
    assert new.edges.tolist() == was.edges.tolist() == [[0, 1, 2], [3, 4, 3], [E, E + 1, E + 5]]
    assert new.edges.dtype == np.int64  # int32 ends widened
    assert not new.etypes.flags.writeable and not new.etypes.flags.owndata  # shared zeros
    assert new.etypes.tolist() == was.etypes.tolist() == [0, 0, 0]
    assert new.taken is not None
    assert [a.tolist() for a in new.taken[1]] == [[E, E + 5], [E + 2, E + 6]]
    runs = [(E + 3 * k, 1 + k % 2) for k in range(20)]  # past the few runs filled in a loop
    m = sum(c for _, c in runs)
    many = check_piece(_piece(2, [0] * m, [3] * m, runs), schema(), LiveDelta())
    assert many.edges[2].tolist() == [s + i for s, c in runs for i in range(c)]


@pytest.mark.parametrize(
    ("runs", "shape", "error"),
    [
        ([(E, 1)], (2, 2), "edge_ids: 1 ids for 2 new edges"),
        ([(E, 3)], (2, 2), r"edge_ids: a run's count is not in \[1, 2\]"),
        ([(E, 2), (E + 9, 0)], (2, 2), r"edge_ids: a run's count is not in \[1, 2\]"),
        ([(E, 1), (E + 1, 1), (E + 2, 1)], (2, 2), "edge_ids: 3 runs for 2 new edges"),
        ([(E - 1, 2)], (2, 2), r"edge_ids: a run is out of range \[20, "),
        ([(2**62, 2)], (2, 2), r"edge_ids: a run is out of range \[20, "),
        ([(2**64, 2)], (2, 2), r"edge_ids: runs must be \(start, count\) pairs of int64"),
        ([(E + 3, 1), (E, 1)], (2, 2), "edge_ids: runs overlap or are out of order"),
        ([(E, 2), (E + 1, 1)], (2, 3), "edge_ids: runs overlap or are out of order"),
        ([(E, 2)], (3, 2), r"new_edges: expected int64 \[2, m\], got int64 \(3, 2\)"),
        ([], (2, 2), "edge_ids: 0 ids for 2 new edges"),
        ([(E, 2)], (2, 2, np.int16), r"new_edges: expected int64 \[2, m\], got int16"),
    ],
)
def test_bad_edge_id_runs_are_refused_naming_the_field(runs, shape, error):
    """Every run is checked before an id is made of it: counts, range (no overflow),
    order; the ends are ``[2, m]`` int64 or int32 beside runs."""
    dtype = shape[2] if len(shape) > 2 else np.int64
    piece = Piece(version=1, new_edges=Rows.of(np.zeros(shape[:2], dtype)), edge_ids=runs)
    with pytest.raises(ArgumentError, match=error):
        check_piece(piece, schema(), LiveDelta())


def test_edge_types_left_out_are_refused_where_the_graph_has_several():
    two = dataclasses.replace(schema(), edge_types=(("_N", "_E", "_N"), ("_N", "_F", "_N")))
    with pytest.raises(ArgumentError, match=r"edge_types: need 2 \(one per new edge\)"):
        check_piece(_piece(1, [0, 1], [3, 4], [(E, 2)]), two, LiveDelta())
    given = _piece(1, [0, 1], [3, 4], [(E, 2)], edge_types=Rows.of(np.asarray([1, 0], np.int32)))
    assert check_piece(given, two, LiveDelta()).etypes.tolist() == [1, 0]


class _OldPiece(msgspec.Struct, frozen=True, kw_only=True, tag="piece"):
    """A piece record's piece as graphrun wrote it before wire65 (no ``edge_ids``)."""

    version: int
    new_nodes: Rows | None = None
    node_types: Rows | None = None
    node_orig: Rows | None = None
    node_features: dict[str, Rows] = msgspec.field(default_factory=dict)
    new_edges: Rows | None = None
    edge_types: Rows | None = None
    edge_features: dict[str, Rows] = msgspec.field(default_factory=dict)
    deleted_edges: Rows | None = None
    updates: dict[str, tuple[Rows, Rows]] = msgspec.field(default_factory=dict)


class _OldRecord(msgspec.Struct, frozen=True, tag="piece"):
    piece: _OldPiece
    seq: str = ""
    seq_replicas: list[str] = msgspec.field(default_factory=list)


def test_old_piece_records_replay_beside_new_ones_and_new_ones_are_smaller(tmp_path):
    """A log holding a record of the older form (ids as a third row, edge types given)
    and one of the new form replays both; 5000 new edges take 16 bytes each in the new
    record, 28 in the old."""
    m = 5000
    src, dst = np.arange(m) % 5, np.arange(m) % 5
    old = _OldRecord(_OldPiece(version=1, new_edges=edges_rows(src, dst, E + np.arange(m)),
                               edge_types=Rows.of(np.zeros(m, np.int32))))  # fmt: skip
    new = PieceRecord(_piece(2, src, dst, [(E + m, m)]))
    enc = msgspec.msgpack.Encoder()
    old_bytes, new_bytes = enc.encode(old), enc.encode(new)
    assert 28 * m < len(old_bytes) < 28 * m + 512 and 16 * m < len(new_bytes) < 16 * m + 512
    log = open_log(tmp_path, 0, 0)
    log.wal.append(1, old_bytes, sync=True)
    log.write(new)
    log.close()
    log = open_log(tmp_path, 0, 0)
    delta = LiveDelta()
    try:
        replay(log, delta, schema(), None)
    finally:
        log.close()
    assert sorted(delta.pending) == [1, 2]
    delta.commit(1), delta.commit(2)
    eids = np.sort(delta.in_edges(np.arange(5), 2)[1][2])
    assert eids.tolist() == (E + np.arange(2 * m)).tolist()


def test_a_begin_s_piece_keeps_its_frame_unless_new_nodes_are_among_its_ends():
    """Partition 0's piece numbered by the sequencer: the ends as sent (the frame, not
    a copy) and the edge ids as its runs; ends naming the batch's new nodes are a copy,
    renumbered; a piece naming edge ids of its own is refused."""
    from graphrun.store.live_wire import PieceWire, numbered_piece
    from graphrun.store.registry import Request

    ends = np.asarray([[0, 1], [2, 3]], np.int64)
    ends.setflags(write=False)
    req = Request("live_begin", {}, (np.empty(0, np.int64), ends))
    wire = PieceWire(version=0, new_edges=1)
    got = numbered_piece(req, wire, 5, [[]], [[(E, 1), (E + 7, 1)]])
    assert np.shares_memory(got.new_edges.array("e"), ends)
    assert got.edge_ids == [(E, 1), (E + 7, 1)] and got.edge_types is None
    assert check_piece(got, schema(), LiveDelta()).edges[2].tolist() == [E, E + 7]
    new = np.asarray([[0, -1], [2, 3]], np.int32)
    req = Request("live_begin", {}, (np.asarray([9], np.int64), new))
    got = numbered_piece(req, wire, 5, [[(N, 1)]], [[(E, 2)]])
    assert got.new_edges.array("e").tolist() == [[0, N], [2, 3]] and new[0, 1] == -1
    assert got.new_edges.dtype == "int64"  # renumbered into a copy: growth ids widened
    mine = PieceWire(version=0, new_edges=1, edge_ids=[(E, 2)])
    with pytest.raises(ArgumentError, match=r"piece\.edge_ids is the sequencer's to fill"):
        numbered_piece(req, mine, 5, [[(N, 1)]], [[(E, 2)]])


def test_ends_are_int32_only_where_every_node_id_of_the_graph_fits():
    """Base ids, growth ids (``MAX_GROWTH_BLOCKS`` blocks past the base) and a begin's
    ``-(k + 1)``: a graph whose largest growth id passes int32 sends int64 ends."""
    from graphrun.store.live import GROWTH_BLOCK, MAX_GROWTH_BLOCKS
    from graphrun.store.live_wire import end_dtype

    top = np.iinfo(np.int32).max
    most = top - MAX_GROWTH_BLOCKS * GROWTH_BLOCK  # base nodes: growth ids below top
    assert end_dtype(most) is np.int32 and end_dtype(most + 1) is np.int64
    assert end_dtype(2**40) is np.int64
