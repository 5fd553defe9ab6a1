"""ZeroMQ transport: a ROUTER server loop and a DEALER client with many requests in flight.

:class:`RpcServer` binds one ROUTER socket and calls ``handler(peer, request)`` for each
decoded request; whatever goes wrong with one message (garbage, wrong version, a
handler error) becomes an ERROR reply to that peer and one log line — the loop goes
on. :class:`RpcClient` talks to one server: :meth:`RpcClient.send` returns a request
id at once, :meth:`RpcClient.wait` collects that reply (other replies that arrive
meanwhile are kept), so any number of requests can be in flight. Every wait has a
deadline. Failures raise the :mod:`graphrun.errors` tree with the server address and
the operation name; a handshake refused for a wrong key raises ``AuthError`` and a
lost connection fails the requests in flight instead of letting them hang (each may or
may not have been applied), and the next one sent unless the client connected again
meanwhile: a server restarted on the address answers it (``RpcClient._news``). A client
with somewhere else to go (``give_up_if_refused``) takes a refused connect as the
answer instead of waiting out the timeout.

Sockets are not thread-safe: use one client per thread (or process).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from graphrun.errors import (
    ArgumentError,
    AuthError,
    GraphrunError,
    ProtocolError,
    RemoteError,
    RpcError,
    RpcTimeout,
    StoreError,
    UserError,
)
from graphrun.rpc.addresses import address_error, check_port
from graphrun.rpc.auth import REFUSED, KeyPair, RateLimitedLog, secure_client, secure_server
from graphrun.rpc.codec import (
    DEFAULT_LIMITS,
    Limits,
    Message,
    MsgKind,
    decode,
    encode,
    error_message,
    peek_request,
)
from graphrun.rpc.events import (
    AUTH_TEXT,
    FAIL_EVENTS,
    LOST_TEXT,
    REFUSED_EVENTS,
    REFUSED_TEXT,
    RETRIED_EVENTS,
)
from graphrun.rpc.guard import CHECK_S as GUARD_CHECK_S
from graphrun.rpc.guard import GuardedRouter, RouterLimits
from graphrun.rpc.waker import Waker

log = logging.getLogger("graphrun.rpc")

#: frames below this size are copied into zmq (cheaper than tracking a zero-copy buffer)
ZERO_COPY_THRESHOLD = 1 << 16
TURN_MAX = 64  # requests one RpcServer.poll serves back to back at most (a turn)
_POLLIN, _EVENTS, _SNDMORE = int(zmq.POLLIN), int(zmq.EVENTS), int(zmq.SNDMORE)  # plain ints:
# pyzmq's enums are slow to pass and to "|" (a request's loop pays them)

Handler = Callable[[bytes, Message], Message | None]


def send_frames(
    sock: zmq.Socket, frames: Sequence[Any], prefix: Sequence[bytes] = (), flags: int = 0
) -> None:
    """Send one multipart message; large frames go zero-copy (``copy=False``).

    With ``flags=zmq.NOBLOCK`` only the first frame can raise ``zmq.Again``: once it is
    queued, zmq guarantees the rest of the message goes too."""
    parts, flags = [*prefix, *frames], int(flags)
    last = len(parts) - 1
    for i, f in enumerate(parts):
        nbytes = f.nbytes if isinstance(f, _VIEWS) else len(f)
        more = _SNDMORE if i < last else 0
        sock.send(f, more | (flags if i == 0 else 0), copy=nbytes < ZERO_COPY_THRESHOLD)


_VIEWS = (np.ndarray, memoryview)  # (a tuple: isinstance of a union is slower)


def error_type(exc: BaseException) -> str:
    for cls in (ArgumentError, StoreError, ProtocolError, AuthError):
        if isinstance(exc, cls):
            return cls.__name__
    return "UserError" if isinstance(exc, UserError) else "RemoteError"


# Bad or failed requests: at most 10 lines a minute (a fuzzer made 6,248 lines in one run)
NOISY = RateLimitedLog(log)

_MONITORS = itertools.count()  # inproc names of re-armed monitors


class RpcServer:
    """A ROUTER socket serving ``handler``; CURVE-secured when ``keys`` is given; ``waker``
    ends a wait for requests early (:class:`Waker`)."""

    def __init__(
        self,
        address: str,
        handler: Handler,
        *,
        keys: KeyPair | None = None,
        limits: Limits = DEFAULT_LIMITS,
        name: str = "server",
        admit: Callable[[str], bool] | None = None,
        waker: Waker | None = None,
    ) -> None:
        self.handler = handler
        self._waker = waker
        self._woken = False
        self.limits = limits
        self.name = name
        # the Z85 public key of the request being handled (None without CURVE)
        self.current_user: str | None = None
        self.current_conn = -1  # the fd of the connection it came on (-1: none)
        self.on_disconnect: Callable[[int], None] | None = None  # a closed connection's fd
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        self._sock.ipv6 = "[" in address  # tcp://[::1]:P; off, IPv4 endpoints stay IPv4
        self._auth = secure_server(self._ctx, self._sock, keys, name, admit) if keys else None
        bounds = RouterLimits(
            limits.max_frames, limits.max_request_frame_bytes, limits.max_request_bytes
        )
        self._router = GuardedRouter(
            self._sock, bounds, keys is not None, name, NOISY.warning, REFUSED_EVENTS,
            self._log_refused,
        )  # fmt: skip
        self.guard = self._router.guard
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._alone = [(self._sock, _POLLIN)]  # zmq_poll's list when nothing else is waited on
        if waker is not None:
            self._poller.register(waker.fileno(), zmq.POLLIN)
        try:
            check_port(address)
            self._sock.bind(address)
        except ArgumentError:
            self.close()
            raise
        except zmq.ZMQError as exc:
            self.close()
            raise address_error("bind", address, exc) from exc
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.handled = 0

    def _log_refused(self, event: int, value: int) -> None:
        """Monitor events: a closed connection (``on_disconnect``), failed handshakes. A
        wrong or missing key is logged by the ZAP handler, which knows the peer's address
        (:func:`~graphrun.rpc.auth.secure_server`); a peer that closes before any greeting
        (a plain TCP connect, as readiness and Kubernetes ``tcpSocket`` probes do) is no
        attack, logged at DEBUG only; a garbled greeting is a (rate-limited) warning."""
        if event & zmq.EVENT_DISCONNECTED and self.on_disconnect is not None:
            self.on_disconnect(value)
        elif event & zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            REFUSED.warning("%s: refused a connection: protocol error in the handshake",
                            self.name)  # fmt: skip
        elif event & zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            log.debug("%s: a peer closed before the handshake (a TCP probe?)", self.name)

    def poll(self, timeout_ms: int, also: Sequence[Any] = ()) -> int:
        """Serve the requests that arrive within ``timeout_ms``; returns how many. The
        connection guard (:mod:`graphrun.rpc.guard`) checks in between, while waiting too.
        The last wait is rounded up to whole milliseconds: rounded down, the remaining
        fraction was spent polling with no timeout (dozens of turns of this loop at the
        end of every idle call, most of an idle server's CPU). A message on one of the
        sockets ``also`` (the caller's own, e.g. a primary's links to its replicas: it
        reads them) ends the wait as a wake does."""
        n = 0
        end = time.monotonic() + timeout_ms / 1000
        self._router.drain_events()
        self._woken = False
        for sock in also:
            self._poller.register(sock, zmq.POLLIN)
        try:
            while True:
                left_ms = 0 if n else max(0, math.ceil((end - time.monotonic()) * 1000))
                if n < TURN_MAX and self._wait(min(left_ms, int(GUARD_CHECK_S * 1000)), also):
                    frames, too_big = self._router.recv()
                    if self.on_disconnect is not None:  # a closed fd's end before a new one's
                        self._router.drain_events()
                    self._serve_one(frames, too_big)
                    n += 1
                elif n or self._woken or time.monotonic() >= end:
                    self._router.tick()
                    return n
                self._router.tick()
        finally:
            for sock in also:
                self._poller.unregister(sock)

    def _wait(self, timeout_ms: int, also: Sequence[Any] = ()) -> bool:
        """Whether a request arrived within ``timeout_ms``; a wake, or a message on one of
        ``also``, ends the wait early."""
        if self._waker is None and not also:  # (Socket.poll builds a Poller each time)
            return bool(zmq.zmq_poll(self._alone, timeout_ms))
        events = dict(self._poller.poll(timeout_ms))
        if self._waker is not None and self._waker.fileno() in events:
            self._waker.drain()
            self._woken = True
        if any(sock in events for sock in also):
            self._woken = True
        return self._sock in events

    def _serve_one(self, frames: list[Any], too_big: str = "") -> None:
        peer, payload = frames[0].bytes, frames[1:]
        if too_big:
            rid, op = peek_request(payload)
            NOISY.warning("%s: dropped a request from peer %s: %s", self.name, peer.hex(), too_big)
            self._reply(peer, error_message(rid, op, "ProtocolError", too_big))
            return
        self.current_user = _user_id(frames[-1]) if self._auth is not None else None
        self.current_conn = self._router.fd
        try:
            msg = decode(payload, self.limits)
        except ProtocolError as exc:
            rid, op = peek_request(payload) if payload else (0, "")
            NOISY.warning("%s: bad message from peer %s: %s", self.name, peer.hex(), exc)
            self._reply(peer, error_message(rid, op, "ProtocolError", str(exc)))
            return
        if msg.kind != MsgKind.REQUEST:
            NOISY.warning("%s: peer %s sent a %s, not a request", self.name, peer.hex(), msg.kind)
            text = f"expected a request, got {msg.kind.name}"
            self._reply(peer, error_message(msg.request_id, msg.op, "ProtocolError", text))
            return
        try:
            reply = self.handler(peer, msg)
        except GraphrunError as exc:
            NOISY.warning("%s: %s from peer %s failed: %s", self.name, msg.op, peer.hex(), exc)
            reply = error_message(msg.request_id, msg.op, error_type(exc), str(exc))
        except Exception as exc:  # a bug in a handler must not stop the server
            log.exception("%s: %s from peer %s crashed", self.name, msg.op, peer.hex())
            text = f"internal error: {type(exc).__name__}: {exc}"
            reply = error_message(msg.request_id, msg.op, "RemoteError", text)
        self.handled += 1
        if reply is not None:
            self._reply(peer, reply)

    def reply(self, peer: bytes, msg: Message) -> None:
        """Send ``msg`` to ``peer`` outside a handler call: the answer to a request the
        handler parked (returned None for), e.g. a parameter server's waiting pull."""
        self._reply(peer, msg)

    def _reply(self, peer: bytes, msg: Message) -> None:
        try:
            send_frames(self._sock, encode(msg), prefix=(peer,))
        except ProtocolError as exc:  # the handler produced something unsendable
            log.error("%s: cannot encode reply to %s: %s", self.name, msg.op, exc)
            err = error_message(msg.request_id, msg.op, "RemoteError", str(exc))
            send_frames(self._sock, encode(err), prefix=(peer,))
        except zmq.ZMQError as exc:  # peer gone: nothing to do
            log.info("%s: reply to %s dropped: %s", self.name, peer.hex(), exc)

    def serve_forever(
        self,
        should_stop: Callable[[], bool],
        on_tick: Callable[[], None] | None = None,
        tick_ms: int = 200,
        after_turn: Callable[[], None] | None = None,
        wake_on: Callable[[], Sequence[Any]] | None = None,
    ) -> None:
        """Serve until ``should_stop()``; call ``on_tick()`` about every ``tick_ms`` and
        ``after_turn()`` after each turn (:meth:`poll`), which also ends early when one
        of the sockets ``wake_on()`` names has a message."""
        next_tick = time.monotonic()
        while not should_stop():
            n = self.poll(tick_ms, wake_on() if wake_on is not None else ())
            if after_turn is not None and (n or wake_on is not None):
                after_turn()
            if on_tick is not None and time.monotonic() >= next_tick:
                on_tick()
                next_tick = time.monotonic() + tick_ms / 1000

    def close(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        self._router.close()
        self._sock.close(linger=1000)  # let the last replies (e.g. to "stop") go out
        self._ctx.term()


def _user_id(frame: Any) -> str | None:
    """The ZAP User-Id of a received frame: the sender's public key under CURVE."""
    try:
        return str(frame.get("User-Id"))
    except (zmq.ZMQError, AttributeError):
        return None


def _remote_error(msg: Message, address: str) -> GraphrunError:
    etype = msg.body.get("type", "RemoteError")
    text = str(msg.body.get("message", "unknown error"))
    if etype in ("ArgumentError", "StoreError", "UserError"):
        cls = {"ArgumentError": ArgumentError, "StoreError": StoreError, "UserError": UserError}
        return cls[etype](f"{msg.op} to {address}: {text}")
    rcls = {"ProtocolError": ProtocolError, "AuthError": AuthError}.get(etype, RemoteError)
    return rcls(text, address=address, kind=msg.op)


class RpcClient:
    """A DEALER connection to one server, with request ids and deadlines."""

    def __init__(
        self,
        address: str,
        *,
        keys: KeyPair | None = None,
        limits: Limits = DEFAULT_LIMITS,
        timeout: float = 30.0,
        context: zmq.Context | None = None,
        give_up_if_refused: bool = False,
    ) -> None:
        """``give_up_if_refused``: for a caller with somewhere else to go (a primary with
        replicas, an optional backup): a connect the server's host refuses (nothing listens)
        fails the requests at once with RpcError instead of waiting out their timeout. A
        host that does not answer at all still takes the timeout. Only until the first
        handshake succeeds (the server is there); see ``RETRIED_EVENTS``."""
        self.address = address
        self.limits = limits
        self.timeout = timeout
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.linger = 0
        self._sock.ipv6 = "[" in address  # tcp://[::1]:P; off, IPv4 endpoints stay IPv4
        if keys is not None:
            secure_client(self._sock, keys)
        self._watch_refused = give_up_if_refused
        self._refused = False  # the last connect failed at once (see give_up_if_refused)
        self._monitor = self._sock.get_monitor_socket(
            RETRIED_EVENTS if give_up_if_refused else FAIL_EVENTS
        )
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._ids = itertools.count(1)
        self._inflight: dict[int, str] = {}
        self._done: dict[int, Message | GraphrunError] = {}
        self._handshake_ok = False
        self._auth_failed = False
        self._handshake_resets = 0  # handshakes closed under it since the last that ended
        self._retry_after_reset = False
        self._told: tuple[type[RpcError], str] | None = None  # the last failure (_news)
        self.losses = 0  # connections lost after a handshake, as taken in (a new server?)
        # for the message of a timeout (_silence): a connection is up now, was ever up,
        # and finished its handshake
        self._connected = self._ever_connected = self._greeted = False
        try:
            self._sock.connect(address)
        except zmq.ZMQError as exc:
            self.close()
            raise address_error("connect", address, exc) from exc

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    def send(
        self,
        op: str,
        body: Mapping[str, Any] | None = None,
        tensors: Sequence[np.ndarray] = (),
        connect_timeout: float | None = None,
    ) -> int:
        """Send a request and return its id at once; with no connection to the server,
        wait ``connect_timeout`` for one (the client's timeout by default). A failure the
        connection's news tells (:meth:`_news`) fails it unsent, at its wait."""
        rid = next(self._ids)
        msg = Message(MsgKind.REQUEST, op, rid, dict(body or {}), tuple(tensors))
        frames = encode(msg)
        news = self._news()
        if news is not None:
            self._done[rid] = news[0](news[1], address=self.address, kind=op)
            return rid
        wait = self.timeout if connect_timeout is None else connect_timeout
        deadline = time.monotonic() + wait
        while True:  # a DEALER without a connected peer would block: never wait blindly
            if self._auth_failed:
                raise AuthError(AUTH_TEXT, address=self.address, kind=op)
            try:
                send_frames(self._sock, frames, flags=zmq.NOBLOCK)
                break
            except zmq.Again:
                if time.monotonic() > deadline:
                    raise RpcTimeout(
                        f"cannot send within {wait:g} s: no connection to the server",
                        address=self.address,
                        kind=op,
                    ) from None
                self._pump(0.02)
            except zmq.ZMQError as exc:
                raise RpcError(f"send failed ({exc})", address=self.address, kind=op) from exc
        self._inflight[rid] = op
        return rid

    def _news(self) -> tuple[type[RpcError], str] | None:
        """The connection's events, taken in before a request is sent: a loss among them
        fails the requests sent before, and the new one too (unsent: a session fails over
        at once) unless a connection was made again since. Read only at a wait, an idle
        client's loss failed the first request sent after its server was back."""
        self._told = None
        self._on_monitor()
        news, self._told = self._told, None
        return news

    @property
    def sockets(self) -> tuple[zmq.Socket, zmq.Socket]:
        """The connection's socket and its monitor's: a message on either is for
        :meth:`take_in` (a server's loop waits on them: ``RpcServer.poll``'s ``also``)."""
        return self._sock, self._monitor

    def take_in(self) -> None:
        """Read what arrived on :attr:`sockets` without blocking: replies (then
        :meth:`ready`) and the connection's events (a lost connection fails its requests)."""
        self._drain()
        self._on_monitor()

    def ready(self, rid: int) -> bool:
        """Whether :meth:`wait` for request ``rid`` would return (or raise) at once: its
        reply or error is here (the socket is read without blocking)."""
        if rid in self._inflight and not self._refused:
            self._drain()
        return rid not in self._inflight or self._refused

    def wait(self, rid: int, timeout: float | None = None) -> Message:
        """The reply to request ``rid``; raises the typed error the server sent."""
        op = self._inflight.get(rid)
        if op is None and rid not in self._done:
            raise ArgumentError(f"request id {rid}: not in flight on {self.address}")
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while rid not in self._done:
            if self._refused:
                self._fail_all(RpcError, REFUSED_TEXT)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                self._inflight.pop(rid, None)
                raise RpcTimeout(
                    f"no answer within {self.timeout if timeout is None else timeout:g} s"
                    f"{self._silence()}",
                    address=self.address,
                    kind=op or "",
                )
            self._pump(left)
        got = self._done.pop(rid)
        if self._watch_refused and (self._greeted or isinstance(got, Message)):
            self._unwatch_refused()  # the server is there
        if isinstance(got, GraphrunError):
            raise got
        return got

    def call(
        self,
        op: str,
        body: Mapping[str, Any] | None = None,
        tensors: Sequence[np.ndarray] = (),
        timeout: float | None = None,
    ) -> Message:
        return self.wait(self.send(op, body, tensors), timeout)

    def _pump(self, left: float) -> None:
        events = dict(self._poller.poll(max(1, int(left * 1000))))
        if self._sock in events:
            self._drain()
        if self._monitor in events:
            self._on_monitor()

    def _drain(self) -> None:
        while int(self._sock.get(_EVENTS)) & _POLLIN:  # (Socket.poll builds a Poller)
            self._on_reply(self._sock.recv_multipart(copy=False))

    def _silence(self) -> str:
        """Why a request got no answer, as far as this client can tell: the server was
        never reached, was reached but never completed the handshake (a stopped or
        swamped process: the kernel accepts its connections), or is connected and did
        not answer."""
        with contextlib.suppress(zmq.ZMQError):
            self._on_monitor()  # the connection's latest events
        if not self._connected and not self._ever_connected:
            return (
                ": never connected (no server listens at this address, or it is unreachable "
                "from here: not started yet, already stopped, another network namespace?)"
            )
        if not self._connected:
            return ": the connection is lost and no server accepts a new one (stopped?)"
        if not self._greeted:
            return (
                ": connected, but the server never completed the handshake (a stopped, "
                "hung or overloaded process?)"
            )
        return " (server overloaded, hung, or the request lost?)"

    def _unwatch_refused(self) -> None:
        """The server answered a handshake: stop watching for refused connects (a dead
        server's retries would fill the monitor; ``RETRIED_EVENTS``). The monitor is
        armed again without them, after the events so far are taken in."""
        self._on_monitor()
        self._watch_refused = self._refused = False
        self._poller.unregister(self._monitor)
        self._sock.disable_monitor()
        self._monitor.close(0)
        addr = f"inproc://graphrun-rpc-monitor-{os.getpid()}-{next(_MONITORS)}"
        self._monitor = self._sock.get_monitor_socket(FAIL_EVENTS, addr)
        self._poller.register(self._monitor, zmq.POLLIN)

    def _on_monitor(self) -> None:
        while int(self._monitor.get(_EVENTS)) & _POLLIN:
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_CONNECT_RETRIED:
                if self._retry_after_reset:
                    self._retry_after_reset = False
                elif self._watch_refused and not self._connected:
                    self._refused = True
                    self._fail_all(RpcError, REFUSED_TEXT)
            elif event == zmq.EVENT_CONNECTED:
                self._refused, self._told = False, None
                self._connected = self._ever_connected = True
                self._greeted = False
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._handshake_ok = self._greeted = True
                self._auth_failed = False
                self._handshake_resets = 0
            elif event == zmq.EVENT_DISCONNECTED and self._handshake_ok:
                self._connected, self._greeted, self.losses = False, False, self.losses + 1
                self._drain()  # replies that arrived before it (the answer to `stop`)
                self._fail_all(RpcError, LOST_TEXT)
            elif event == zmq.EVENT_DISCONNECTED:
                self._connected = self._greeted = False
            elif event & (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                self._fail_all(AuthError, AUTH_TEXT)  # a wrong key: a protocol error
            elif event & zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                # the connection closed before the handshake ended: a server refusing our
                # key may close it so (then every attempt does), or a server killed as we
                # joined (then the next attempt is refused: its clients fail over)
                if self._handshake_resets:
                    self._fail_all(AuthError, AUTH_TEXT)
                self._handshake_resets += 1
                self._retry_after_reset = True  # the retry it schedules is no refusal

    def _fail_all(self, cls: type[RpcError], text: str) -> None:
        self._told = cls, text
        for rid, op in self._inflight.items():
            self._done[rid] = cls(text, address=self.address, kind=op)
        self._inflight.clear()

    def _on_reply(self, frames: list[Any]) -> None:
        try:
            msg = decode(frames, self.limits)
        except ProtocolError as exc:
            rid, op = peek_request(frames)
            if rid in self._inflight:
                self._inflight.pop(rid)
                self._done[rid] = ProtocolError(f"bad reply: {exc}", address=self.address, kind=op)
            else:
                log.warning("bad reply from %s dropped: %s", self.address, exc)
            return
        if self._inflight.pop(msg.request_id, None) is None:
            return  # reply to a request we stopped waiting for
        if msg.kind == MsgKind.ERROR:
            self._done[msg.request_id] = _remote_error(msg, self.address)
        else:
            self._done[msg.request_id] = msg

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self._monitor.close(0)
        self._sock.close(0)
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
