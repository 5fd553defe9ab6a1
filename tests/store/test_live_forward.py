"""A primary's forwarded live write (issue 42, replicas 2): its own log record is synced
while its replica applies the write, before the primary waits for the replica's answer
(store/server.py ``write``), and a log that fails there still answers the write with
the log's error at the turn's end."""

from __future__ import annotations

import os

import numpy as np
import pytest

from graphrun.errors import StoreError
from graphrun.rpc.codec import Message, MsgKind
from graphrun.store import live_ops, replicas
from graphrun.store.live import Piece, Rows
from graphrun.store.live_wire import piece_to_wire
from graphrun.store.registry import Request
from graphrun.store.server import ServerConfig, build_registry, load_main_state, make_handler
from graphrun.store.writes import Parked, Turn, write
from graphrun.testing.store import make_partition_dir


class Link:
    """A replica's link that answers at once, noting the primary's log syncs by then and
    every send and wait in order (``events``); ``refuse``: the fence's error instead."""

    def __init__(self, live: live_ops.LivePart) -> None:
        self.live, self.synced_at_wait, self.events = live, [], []
        self.refuse: set[int] = set()

    def send(self, op, body, tensors) -> int:
        self.events.append(("send", body["body"]["piece"]["version"]))
        return len(self.events)

    in_flight, sockets = 0, ()

    def take_in(self) -> None:
        pass

    def ready(self, rid) -> bool:
        return True

    def wait(self, rid, timeout=None):
        assert self.live.log is not None
        self.synced_at_wait.append(self.live.log.wal.syncs)
        self.events.append(("wait", rid))
        if rid in self.refuse:
            raise StoreError(f"{replicas.FENCED} this replica serves partition 1 now")

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
    turn.parked.append(Parked(b"peer", msg, resp.after_sync, {}))
    turn.end(lambda peer, m: answers.append(m))
    assert [m.kind for m in answers] == [MsgKind.ERROR]
    assert "could not be written" in str(answers[0].body)
    assert not live.delta.pending


def _msg(req: Request, rid: int) -> Message:
    return Message(MsgKind.REQUEST, req.op, rid, dict(req.body), req.tensors)


def test_a_turns_forwarded_writes_are_each_durable_on_both_before_answered(primary):
    """Group commit across the turn (store/writes.py): the turn's three prepares are
    each forwarded and applied at once, none answered; at the turn's end one sync, then
    the replica's answers (each after the sync), then the three answers, in order: no
    write is answered before it is on this server's disk and its replica's answer came."""
    state, live, link = primary
    turn, answers = Turn(state), []
    handle = make_handler(state, build_registry(), turn=turn)
    state.sessions.clear()
    before = live.log.wal.syncs
    for v in (1, 2, 3):
        assert handle(b"peer", _msg(_prepare(state, v), v)) is None
    assert link.events == [("send", 1), ("send", 2), ("send", 3)]  # none waited for yet
    assert len(live.delta.pending) == 3 and live.log.wal.syncs == before
    turn.end(lambda peer, m: answers.append((m, list(link.events), live.log.wal.syncs)))
    assert turn.syncs == 1 and live.log.wal.syncs == before + 1  # one sync for the turn
    assert link.synced_at_wait == [before + 1] * 3  # each replica answer after the sync
    for k, (m, events, syncs) in enumerate(answers):
        assert (m.kind, m.request_id, m.body["held"]) == (MsgKind.REPLY, k + 1, True)
        assert m.body["replicas"] == ["tcp://replica:1"] and syncs == before + 1
        assert events.count(("wait", k + 1)) == 1  # its replica answered before it


def test_a_write_a_promoted_replica_refused_is_answered_with_the_fence(primary):
    """The replica was promoted (a client failed over to it) while the turn's second
    write was in flight: that write is answered with the fence's error, not
    acknowledged, the first is, and this primary refuses every later request."""
    state, _, link = primary
    turn, answers = Turn(state), []
    handle = make_handler(state, build_registry(), turn=turn)
    state.sessions.clear()
    link.refuse = {2}
    for v in (1, 2):
        assert handle(b"peer", _msg(_prepare(state, v), v)) is None
    turn.end(lambda peer, m: answers.append(m))
    assert [m.kind for m in answers] == [MsgKind.REPLY, MsgKind.ERROR]
    assert replicas.FENCED in str(answers[1].body) and state.fenced
    with pytest.raises(StoreError, match=replicas.FENCED):
        handle(b"peer", _msg(_prepare(state, 3), 3))
