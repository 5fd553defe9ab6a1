"""A primary's forwarded live write (issue 42, replicas 2): its own log record is synced
while its replica applies the write, before the primary waits for the replica's answer
(store/server.py ``write``), and a log that fails there still answers the write with
the log's error at the turn's end."""

from __future__ import annotations

import os

import numpy as np
import pytest

from graphrun.rpc.codec import Message, MsgKind
from graphrun.store import live_ops, replicas
from graphrun.store.live import Piece, Rows
from graphrun.store.live_wire import piece_to_wire
from graphrun.store.registry import AfterSync, Request, Response
from graphrun.store.server import (
    ServerConfig,
    Turn,
    build_registry,
    load_main_state,
    make_handler,
    write,
)
from graphrun.testing.store import make_partition_dir


class Link:
    """A replica's link that answers at once, noting the primary's log syncs by then."""

    def __init__(self, live: live_ops.LivePart) -> None:
        self.live, self.synced_at_wait = live, []

    def send(self, op, body, tensors) -> int:
        return 1

    def wait(self, rid):
        assert self.live.log is not None
        self.synced_at_wait.append(self.live.log.wal.syncs)

    def close(self) -> None:
        pass


@pytest.fixture
def primary(tmp_path):
    parts = make_partition_dir(tmp_path / "parts", 2)[1]
    (tmp_path / "live").mkdir()
    state = load_main_state(ServerConfig(parts, 1))
    live = live_ops.attach(state, lambda: np.empty(0, np.int64), None, 5.0, tmp_path / "live")
    link = Link(live)
    state.replication = replicas.Replication(None, 5.0)
    state.replication.links["tcp://replica:1"] = link  # type: ignore[assignment]
    try:
        yield state, live, link
    finally:
        live_ops.close(state)
        state.close()


def _prepare(state, version: int) -> Request:
    lo, hi = (int(x) for x in state.book.node_offsets[1:3])
    eid = state.book.num_edges + 10 * version + np.arange(2)
    piece = Piece(version=version, new_edges=Rows.of(np.vstack([[0, 1], [lo, hi - 1], eid])),
                  edge_types=Rows.of(np.zeros(2, np.int32)))  # fmt: skip
    body, tensors = piece_to_wire(piece)
    return Request("live_prepare", {"piece": body}, tuple(tensors))


def test_a_forwarded_write_is_synced_here_before_the_replica_is_waited_for(primary):
    state, live, link = primary
    before = live.log.wal.syncs
    resp, synced = write(state, _prepare(state, 1), live_ops.live_prepare)
    assert link.synced_at_wait == [before + 1] and synced  # while the replica applied it
    assert resp.after_sync is not None and resp.after_sync.done().body == {"held": True}


def test_a_log_failing_before_the_replica_is_waited_for_answers_at_the_turn_end(primary):
    """The early sync fails (the disk fails under the log): the write still waits for
    its replica, and the turn's end answers it with the log's error and drops its piece."""
    state, live, link = primary
    turn, answers = Turn(state), []
    read_only = os.open(os.devnull, os.O_RDONLY)
    os.dup2(read_only, live.log.wal._fd)  # the disk fails under the log
    os.close(read_only)
    req = _prepare(state, 1)
    resp, synced = write(state, req, live_ops.live_prepare)
    assert len(link.synced_at_wait) == 1 and resp.after_sync is not None and not synced
    msg = Message(MsgKind.REQUEST, "live_prepare", 1, dict(req.body), req.tensors)
    turn.parked.append((b"peer", msg, resp.after_sync, {}))
    turn.end(lambda peer, m: answers.append(m))
    assert [m.kind for m in answers] == [MsgKind.ERROR]
    assert "could not be written" in str(answers[0].body)
    assert not live.delta.pending


def test_a_synced_forwarded_write_is_answered_at_once_not_at_the_turn_end(primary):
    """Its record is synced and its replica answered: the handler answers it (a later
    write of the turn, with its own forward, does not hold it back); a write behind
    parked ones waits for the turn's end, in order."""
    state, _, link = primary
    turn = Turn(state)
    handle = make_handler(state, build_registry(), turn=turn)
    state.sessions.clear()
    req = _prepare(state, 1)
    got = handle(b"peer", Message(MsgKind.REQUEST, "live_prepare", 1, dict(req.body), req.tensors))
    assert got is not None and got.body["held"] is True and not turn.parked
    assert len(link.synced_at_wait) == 1  # its replica answered before it
    turn.parked.append((b"other", got, AfterSync(lambda: Response()), {}))  # one waits
    req = _prepare(state, 2)
    msg = Message(MsgKind.REQUEST, "live_prepare", 2, dict(req.body), req.tensors)
    assert handle(b"peer", msg) is None and len(turn.parked) == 2
