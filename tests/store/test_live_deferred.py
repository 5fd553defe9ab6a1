"""An unpromoted replica's delta (issue 42, replicas 2): pieces its primary forwarded are
taken without the checks that read the delta's index, and commits are indexed only
when something reads them, or once the replica is promoted (store/live.py ``deferred``,
store/live_check.py ``trusted``)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from graphrun.errors import ArgumentError
from graphrun.store.live import LiveDelta, Piece, Rows
from graphrun.store.live_check import check_piece
from tests.store.test_live import E, N, edges_rows, held, nodes_piece, schema


def _edge_piece(version: int, src, dst, eid, **kw) -> Piece:
    eid = np.asarray(eid, np.int64)
    types = Rows.of(np.zeros(len(eid), np.int32))
    return Piece(version=version, new_edges=edges_rows(src, dst, eid), edge_types=types, **kw)


def _same(a: LiveDelta, b: LiveDelta, dst: np.ndarray, v: int) -> bool:
    (ca, ea), (cb, eb) = a.in_edges(dst, v), b.in_edges(dst, v)
    return ca.tolist() == cb.tolist() and ea.tolist() == eb.tolist()


def test_a_deferred_delta_indexes_nothing_until_read_and_reads_the_same():
    """Commits into a deferred delta build no index (its merging thread is not woken);
    the first read indexes them and sees what an eager delta sees, at every version."""
    d, eager = LiveDelta(background=True, deferred=True), LiveDelta()
    dst = np.arange(5)
    rng = np.random.default_rng(3)
    try:
        for v in range(1, 21):
            eid = E + 10 * (v - 1) + np.arange(5)
            p = _edge_piece(v, rng.integers(0, N, 5), rng.integers(0, 5, 5), eid)
            held(d, p)
            held(eager, p)
        time.sleep(0.2)  # a woken merging thread would have indexed by now
        assert d.work == 0 and not d._runs
        assert all(_same(d, eager, dst, v) for v in (1, 7, 20))
        assert d.work > 0
    finally:
        d.close()


def test_a_deferred_delta_indexes_every_commit_once_its_server_serves():
    """``index_eagerly`` (the replica promoted): the commits so far and every later one
    are indexed by the merging thread without any read."""
    d = LiveDelta(background=True, deferred=True)
    try:
        held(d, _edge_piece(1, [0, 1], [2, 3], [E, E + 1]))
        assert d.work == 0
        d.index_eagerly()
        held(d, _edge_piece(2, [1], [4], [E + 2]))
        deadline = time.monotonic() + 60
        while d.work < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert d.work >= 3 and not d.deferred
    finally:
        d.close()


def test_a_trusted_piece_is_not_looked_up_in_the_index_and_an_untrusted_one_is():
    """A forwarded piece (trusted) whose edges end at a node committed in the delta is
    taken without reading the deferred index; checked (a client's piece), the same
    lookups run, and a piece the primary would have refused is refused."""
    d = LiveDelta(deferred=True)
    held(d, nodes_piece(1, [N]))  # a new node of partition 0
    into_new = _edge_piece(2, [0], [N], [E])
    b = check_piece(into_new, schema(), d, trusted=True)
    assert b.edges.shape == (3, 1) and d.work == 0  # nothing indexed
    assert check_piece(into_new, schema(), d).edges.shape == (3, 1)
    assert d.work > 0  # the check read the index
    unknown = _edge_piece(2, [0], [N + 1], [E])  # N + 1 is no node
    with pytest.raises(ArgumentError, match="not a node owned here"):
        check_piece(unknown, schema(), d)
    gone = Piece(version=3, deleted_edges=Rows.of(np.asarray([15], np.int64)))  # not owned
    with pytest.raises(ArgumentError, match="not an edge owned here"):
        check_piece(gone, schema(), d)
    with pytest.raises(ArgumentError, match="new_edges eid"):  # ranges are checked, trusted
        check_piece(_edge_piece(2, [0], [1], [3]), schema(), d, trusted=True)
    from graphrun.store.live import GROWTH_BLOCK, MAX_GROWTH_BLOCKS

    top = E + MAX_GROWTH_BLOCKS * GROWTH_BLOCK  # the first growth id past the range
    malformed = {  # a forward that is not what a primary sends: refused, trusted or not
        "new_edges eid: ids repeat": _edge_piece(2, [0, 1], [1, 2], [E + 1, E + 1]),
        "new_edges eid\\[1\\] = .* out of range": _edge_piece(2, [0, 1], [1, 2], [E, top]),
        "new_edges eid\\[0\\] = .* out of range": _edge_piece(2, [0, 1], [1, 2], [top, E]),
        "new_edges eid\\[0\\] = .* out of range ": _edge_piece(2, [0], [1], [E - 1]),
        "new_edges: expected int64": Piece(
            version=2, new_edges=Rows.of(np.zeros((3, 1), np.int32)),
            edge_types=Rows.of(np.zeros(1, np.int32)),
        ),
    }  # fmt: skip
    for match, piece in malformed.items():
        for trusted in (False, True):
            with pytest.raises(ArgumentError, match=match):
                check_piece(piece, schema(), d, trusted=trusted)


def test_a_trusted_piece_is_not_looked_up_in_the_taken_ids_and_an_untrusted_one_is():
    """Whether a piece's new ids are taken already is the primary's check too: a
    forwarded piece is held without it (the ids stay taken for a check once promoted)."""
    d = LiveDelta(deferred=True)
    held(d, nodes_piece(1, [N]), commit=False)
    again = nodes_piece(2, [N])
    with pytest.raises(ArgumentError, match="taken already"):
        check_piece(again, schema(), d)
    b = check_piece(again, schema(), d, trusted=True)
    assert b.nodes.tolist() == [N]
    assert d.taken_nodes.any_of(np.asarray([N]))


def test_a_received_piece_takes_its_frames_and_logs_the_same_bytes():
    """A received piece's arrays are its request's frames, not copies, though a zmq frame
    is writable (each is flagged read-only as the piece takes it); its log record is the
    same bytes as a copied piece's; partition 0's numbered piece keeps the arrays it
    builds, uncopied, too."""
    import msgspec
    import zmq

    from graphrun.rpc.codec import Message, MsgKind, decode, encode
    from graphrun.store.live_log import PieceRecord
    from graphrun.store.live_wire import PieceWire, numbered_piece, piece_from_wire, piece_to_wire
    from graphrun.store.registry import Request

    piece = _edge_piece(3, [0, 1], [2, 3], [E, E + 1])
    body, tensors = piece_to_wire(piece)
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://piece")
        b.connect("inproc://piece")
        a.send_multipart(encode(Message(MsgKind.REQUEST, "live_prepare", 1, body, tensors)))
        msg = decode(b.recv_multipart(copy=False))
    finally:
        a.close(0), b.close(0), ctx.term()
    frame = msg.tensors[body["new_edges"]]
    assert frame.flags.writeable  # as received: the piece must not copy it for that
    req = Request("live_prepare", msg.body, msg.tensors)
    got = piece_from_wire(req, req.args(PieceWire))
    edges = got.new_edges.array("new_edges")
    assert np.shares_memory(edges, frame) and not frame.flags.writeable
    assert edges.tolist() == piece.new_edges.array("e").tolist()
    enc = msgspec.msgpack.Encoder()
    assert enc.encode(PieceRecord(got)) == enc.encode(PieceRecord(piece))
    ends = np.asarray([[0, -1], [2, 3]], np.int64)  # the begin's piece: src, dst
    sent = (np.asarray([7], np.int64), ends, np.zeros(2, np.int32))
    wire = PieceWire(version=0, new_edges=1, edge_types=2)
    numbered = numbered_piece(Request("live_begin", {}, sent), wire, 5, [[(N, 1)]], [[(E, 2)]])
    assert numbered.new_edges.array("e").tolist() == [[0, N], [2, 3]]  # ids as runs
    assert numbered.edge_ids == [(E, 2)]
    assert isinstance(numbered.new_edges.data, memoryview)  # the array built, not a copy
    odd = np.frombuffer(bytes(1) + ends.tobytes(), np.uint8)[1:].view(np.int64).reshape(2, 2)
    assert not odd.flags.aligned  # as libzmq hands out a small frame over TCP
    got = piece_from_wire(Request("live_prepare", {}, (odd,)), PieceWire(version=4, new_edges=0))
    assert got.new_edges.array("e").flags.aligned and isinstance(got.new_edges.data, bytes)


def test_a_deferred_backlog_is_indexed_while_commits_go_on(monkeypatch):
    """The first read of a deferred delta (a compaction's, a failed-over client's) indexes
    its backlog outside the delta's lock: a commit meanwhile does not wait for it, and
    the read after sees both."""
    from graphrun.store import live as live_mod

    d, eager = LiveDelta(deferred=True), LiveDelta()
    for v in range(1, 11):
        p = _edge_piece(v, [v % N], [v % 5], [E + v])
        held(d, p)
        held(eager, p)
    building, release = threading.Event(), threading.Event()
    real = live_mod.build_run

    def slow(batches, compiled=False):
        if len(batches) == 10:  # the backlog's
            building.set()
            assert release.wait(30)
        return real(batches, compiled)

    monkeypatch.setattr(live_mod, "build_run", slow)
    reader = threading.Thread(target=lambda: d.runs)
    reader.start()
    assert building.wait(30)
    p = _edge_piece(11, [1], [2], [E + 11])
    held(d, p)  # returns while the backlog is being indexed
    held(eager, p)
    release.set()
    reader.join(30)
    assert not reader.is_alive()
    assert _same(d, eager, np.arange(5), 11) and d.work == 11
