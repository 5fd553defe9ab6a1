"""The write path of a partition's main server: a write forwarded to its replicas
(:mod:`graphrun.store.replicas`) and applied here while they apply it, and the loop's
turn that answers the writes waiting for the write-ahead log.

**Group commit across the turn, replicated too.** One turn of the server's loop
(``RpcServer.poll``: the requests already queued) applies its writes one after another;
each write that waits for the log (``AfterSync``) is parked. A primary's such write is
forwarded before it is applied and its replica's answer is *not* waited for then: the
next write of the turn is forwarded and applied at once. At the turn's end one
``fdatasync`` makes them all durable here (the replicas apply and sync meanwhile). So a
write is acknowledged only once durable on this server's disk and on every replica of
the write set (each answers a forwarded write after its own turn's sync); a turn of k
writes costs one sync instead of k (benchmarks/README.md, "Issue 42, seq42b"). A write
that does not wait for the log (``push``, ``init``, ...) is collected at once, as is one
refused here.

**The loop does not wait for the replicas.** The synced writes wait in a queue for
their replicas' answers while the loop serves what comes next (reads, the next turn's
writes); the loop's wait wakes on the replica links' sockets (``Turn.wake_on``), and each
turn's end answers, in order, the writes at the queue's head whose replicas all
answered (or gave up: one silent for :data:`~graphrun.store.replicas.REPLICA_WRITE_TIMEOUT`
leaves the write set). Before, every turn's end blocked the loop until they answered: a
read that came meanwhile waited for the replica's apply and ``fdatasync`` (a 10k-edge
batch's turn took the sequencer's loop 12–15 ms on a loaded box, 2 a batch).
A write's rest (``AfterSync.done``: a decision moves the head) runs when it is answered,
so nothing it makes visible is read before every copy holds it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphrun.errors import GraphrunError, StoreError
from graphrun.rpc.codec import Message, MsgKind, error_message
from graphrun.rpc.transport import RpcClient, error_type
from graphrun.store import live_ops, replicas
from graphrun.store.registry import AfterSync, Request, Response
from graphrun.store.replicas import REPLICA_WRITE_TIMEOUT
from graphrun.store.state import ServerState

log = logging.getLogger("graphrun.store")


#: a write's forwards to its replicas not yet answered (``Replication.send``)
Sent = list[tuple[str, RpcClient, int]]


@dataclass
class Parked:
    """A write parked in a :class:`Turn`: its sender, request, the rest of it after the
    sync, its answer's fields so far and its forwards whose answers it waits for."""

    peer: bytes
    msg: Message
    after: AfterSync
    extra: dict[str, object]
    sent: Sent = field(default_factory=list)
    sync: bool = True  # False: it waits for its replicas' answers only


def answered_later(resp: Response) -> Response:
    """``resp`` of a write that waits for its replicas' answers only
    (:data:`~graphrun.store.replicas.ANSWERED_LATER`), parked as one that waits for the
    log is (``Parked.sync`` False: it asks for no sync)."""
    return Response(after_sync=AfterSync(lambda: Response(resp.body, resp.tensors)))


@dataclass
class Waiting:
    """Parked writes synced here (or whose sync failed: ``failure``) that wait for their
    replicas' answers, and when their forwards were sent."""

    parked: list[Parked]
    failure: Exception | None
    since: float


@dataclass
class Turn:
    """The writes of one turn of the server's loop that wait for its write-ahead log
    (:class:`~graphrun.store.registry.AfterSync`): one sync for them all at the turn's
    end (``RpcServer.serve_forever``'s ``after_turn``); then they wait, in order, for
    their replicas' answers (a primary's forwarded writes: sent and applied during the
    turn, so the replicas' applies and syncs overlap this server's and each other's)
    while the loop goes on, and are answered once they came. A write is acknowledged only
    once durable here and on every replica of the write set; one a promoted replica
    refused is answered with the fence's error."""

    state: ServerState
    parked: list[Parked] = field(default_factory=list)
    waiting: deque[Waiting] = field(default_factory=deque)
    syncs: int = 0  # group syncs done

    def end(self, reply: Callable[[bytes, Message], None]) -> None:
        """The turn's end: sync the parked writes, then answer every write whose
        replicas answered (this turn's or an earlier one's)."""
        parked, self.parked = self.parked, []
        if parked:
            failure: Exception | None = None
            if any(p.sync for p in parked):
                try:
                    live_ops.sync(self.state)
                    self.syncs += 1
                except GraphrunError as exc:
                    failure = exc
            self.waiting.append(Waiting(parked, failure, time.monotonic()))
        self._answer(reply, block=False)

    def wake_on(self) -> list[Any]:
        """What the loop's wait wakes on while writes wait: the sockets of the replica
        links whose answers they need."""
        rep = self.state.replication
        if not self.waiting or rep is None:
            return []
        return [s for link in rep.links.values() if link.in_flight for s in link.sockets]

    def finish(self, reply: Callable[[bytes, Message], None]) -> None:
        """Answer every waiting write, waiting for its replicas (the server stops)."""
        self._answer(reply, block=True)

    def _answer(self, reply: Callable[[bytes, Message], None], block: bool) -> None:
        if not self.waiting:  # (every idle turn of the loop comes here)
            return
        rep = self.state.replication
        if rep is not None:
            for link in rep.links.values():
                link.take_in()
        while self.waiting:
            head = self.waiting[0]
            waited = time.monotonic() - head.since
            sent = [s for p in head.parked for s in p.sent]
            pending = sent and rep is not None and not rep.answered(sent)
            if pending and not block and waited < REPLICA_WRITE_TIMEOUT:
                return
            self.waiting.popleft()
            fences = [settle(self.state, p.sent, waited=waited) for p in head.parked]
            for p, fence in zip(head.parked, fences, strict=True):
                self._reply(p, fence, head.failure if p.sync else None, reply)

    def _reply(
        self,
        p: Parked,
        fence: StoreError | None,
        failure: Exception | None,
        reply: Callable[[bytes, Message], None],
    ) -> None:
        err = fence or failure  # fenced, or a drop not recorded: applied, never acknowledged
        try:
            if fence is None and failure is not None:
                p.after.failed()
            elif err is None:
                resp = p.after.done()
        except GraphrunError as exc:
            err = exc
        except Exception as exc:  # a bug must not stop the server (as in a handler)
            log.exception("%s after the log's sync crashed", p.msg.op)
            err = exc
        msg = p.msg
        if err is not None:
            reply(p.peer, error_message(msg.request_id, msg.op, error_type(err), str(err)))
        else:
            body = {**resp.body, **p.extra, **(_write_set(self.state) if p.sent else {})}
            reply(p.peer, Message(MsgKind.REPLY, msg.op, msg.request_id, body, resp.tensors))


def settle(
    state: ServerState, sent: Sent, applied: bool = True, waited: float = 0.0
) -> StoreError | None:
    """Collect the replicas' answers to a write ``applied`` here (or refused here:
    :meth:`Replication.collect`; sent ``waited`` seconds ago); the fence's error if a
    promoted replica refused it (this primary is fenced then), or the error of a drop
    that could not be recorded (the write is not acknowledged either)."""
    if not sent or state.replication is None:
        return None
    try:
        state.replication.collect(state.part, sent, applied, waited)
    except StoreError as exc:
        state.fenced = state.fenced or replicas.is_fenced(exc)
        return exc
    return None


def _write_set(state: ServerState) -> dict[str, object]:
    """The primary's write set now, as an answer names it (clients forget the rest)."""
    return {} if state.replication is None else {"replicas": state.replication.addresses}


def forward(
    state: ServerState, req: Request, handler: Callable[[ServerState, Request], Response]
) -> tuple[Response, Sent]:
    """Send write ``req`` to the replicas (store/replicas.py) and apply it here while they
    do; returns the response and the forwards still to be collected (:func:`settle`:
    the turn's end does, after its sync, for a write that waits for the log). A write
    refused here is collected at once and raised."""
    rep = state.replication if state.replication and state.replication.links else None
    sent = rep.send(state.part, req) if rep is not None else []
    try:
        resp = replicas.apply_write(state, req, lambda r: handler(state, r))
    except BaseException:
        settle(state, sent, applied=False)  # fenced or not, it answers its own error
        raise
    if state.replica and not state.promoted:
        why = f"replica of partition {state.part} took a client's write: promoted"
        live_ops.promote(state, why)
    return resp, sent


def raise_fence(fence: StoreError | None) -> None:
    """Raise :func:`settle`'s fence (the write is answered with it)."""
    if fence is not None:
        raise fence


def with_write_set(state: ServerState, resp: Response) -> Response:
    """``resp`` naming the primary's write set now (clients forget the rest)."""
    if state.replication is None:
        return resp
    return Response({**resp.body, **_write_set(state)}, resp.tensors, resp.after_sync)


def write(
    state: ServerState, req: Request, handler: Callable[[ServerState, Request], Response]
) -> tuple[Response, bool]:
    """Apply write ``req`` here and on the replicas outside a loop's turn (the sequencer's
    own aborts): :func:`forward`, this server's log synced while the replicas finish,
    then their answers. Returns the response and whether its record is synced already."""
    resp, sent = forward(state, req, handler)
    synced = False
    if sent and resp.after_sync is not None:
        with contextlib.suppress(StoreError):  # a failed log fails the caller's sync too
            live_ops.sync(state)
            synced = True
    raise_fence(settle(state, sent))
    return with_write_set(state, resp), synced
