"""Bounding what one connection can make a server buffer: a message not yet whole.

libzmq hands a multipart message to the application only once its last frame is in, and
keeps every frame until then; ``ZMQ_MAXMSGSIZE`` bounds one frame, nothing bounds their
number. A key holder sending frame after frame with no end made a server buffer 2 GiB
before the application saw anything it could refuse (receiving frame by frame does not
help: no frame is readable before the last one has arrived).

:class:`ConnectionGuard` watches each TCP connection of a server from outside libzmq: the
kernel's count of the bytes received on it (``TCP_INFO``'s ``tcpi_bytes_received``)
less those still in its receive queue (``FIONREAD``: not read by libzmq yet, the
kernel's memory, bounded by ``tcp_rmem``) against the wire size of the messages libzmq
delivered from it (each message's ``ZMQ_SRCFD``; a frame's wire size is its length plus
its ZMTP header, plus the CURVE box under CURVE: exact, see :func:`wire_bytes`). When
nothing is left to read, the difference is the message in the making (plus the
handshake); whole requests a starved server's I/O thread has not read yet are not. A
connection's count is kept by its fd and checked against the peer's address and the
routing id of its messages: libzmq reuses a closed connection's fd at once, and the
closed one's end, read from the monitor after the next one's first messages were
counted, took their count with it (a client with four parked 512 KiB pulls was cut at
a 1 MiB limit under load). A connection past ``limit`` then — or past ``4 * limit``
while the server is busy and whole messages may wait in its queue — is shut down
(libzmq drops its partial message and the peer's requests in flight fail), and logged,
rate-limited; so is the largest connection while all of them together hold more than
``4 * limit`` with nothing to read.
The check runs every :data:`CHECK_S` seconds, so a connection can overshoot by what
arrives in that time. Most checks are one ``getsockopt`` a connection, on a socket object
kept for its fd while it is watched (made once: building one asks the kernel its family,
type and protocol): the bytes received, read or not, less those delivered bound what a
connection holds from above; only when that bound passes a limit (for one connection,
or for all together) are the unread bytes, the peer's address and the socket's backlog
asked, and the rule applied as above (a reused fd is told by its peer there, and by the
monitor's events, drained before every check). ``ipc://`` and ``inproc://``
connections (same machine, no TCP) are not watched.

:class:`GuardedRouter` is the one receiving side of every ROUTER socket a server runs (the
store's and parameter servers' :class:`~graphrun.rpc.transport.RpcServer`, the trainers'
:class:`~graphrun.rpc.rendezvous.RendezvousServer`): ``MAXMSGSIZE`` and the handshake's
deadline on the socket, this guard fed from the socket's monitor, and
:meth:`GuardedRouter.recv`, which reads a message frame by frame and past ``max_frames``
frames or ``max_bytes`` bytes throws the rest away, frame by frame, never kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import socket
import struct
import termios
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger("graphrun.rpc")

CHECK_S = 0.02  # a message in the making grows by what the link carries in this time
HANDSHAKE_MS = 5000  # a peer must finish the CURVE handshake this fast (libzmq: 30 s)
BUSY_FACTOR = 4
_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received (u64) in struct tcp_info (Linux >= 4.1)
_TCP_INFO_LEN = _BYTES_RECEIVED + 8  # what of struct tcp_info is asked for
_U64, _I32 = struct.Struct("Q"), struct.Struct("i")
# plain ints: pyzmq's enums are slow to pass and to "&" (a request's loop pays them)
_EVENTS, _POLLIN, _SRCFD = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.SRCFD)
_CURVE_BOX = 33  # "\x07MESSAGE" + 8-byte nonce + 16-byte MAC + 1 flags byte


def wire_bytes(n: int, curve: bool) -> int:
    """Bytes on the wire of one message frame of ``n`` bytes (ZMTP 3)."""
    body = n + _CURVE_BOX if curve else n
    return body + (2 if body <= 255 else 9)


@dataclass
class _Conn:
    peer: Any
    delivered: int = 0
    rid: bytes | None = None  # the ROUTER's routing id of its messages, once one came


def _tcp_socket(fd: int) -> socket.socket | None:
    """A socket object over ``fd`` if it is a TCP socket's (libzmq's: detach, never close
    it), or None."""
    if fd < 0:
        return None
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        return None
    if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
        return s
    s.detach()
    return None


def _received(s: socket.socket) -> int | None:
    """Bytes received on ``s`` (read from the kernel or not), or None if it is no TCP
    socket any more (closed, or its fd is something else's now)."""
    try:
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    return _U64.unpack_from(info, _BYTES_RECEIVED)[0] if len(info) == _TCP_INFO_LEN else None


def _read_and_peer(s: socket.socket) -> tuple[int, Any] | None:
    """(bytes received and read from the kernel, peer address) of TCP socket ``s``, or
    None if it is not one any more."""
    received = _received(s)
    if received is None:
        return None
    try:
        unread = _I32.unpack(fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0" * 4))[0]
        return received - unread, s.getpeername()
    except OSError:
        return None


def _detach_all(socks: dict[int, socket.socket]) -> None:
    """Let go of the socket objects kept over libzmq's fds without closing them."""
    for s in socks.values():
        s.detach()
    socks.clear()


def _shutdown(fd: int) -> None:
    if fd < 0:
        return
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        s.shutdown(socket.SHUT_RDWR)  # libzmq sees the end of the stream and drops it
    except OSError:
        pass
    finally:
        s.detach()


class ConnectionGuard:
    """The rule above for one server socket (fed its monitor events and messages)."""

    EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED

    def __init__(self, limit: int, curve: bool, name: str, warn: Callable[..., None]) -> None:
        self.limit, self.curve, self.name, self._warn = limit, curve, name, warn
        self._conns: dict[int, _Conn] = {}
        # a socket object over each watched fd (one with a record), kept while it is
        # watched: detached when dropped, never closed (libzmq's fds)
        self._socks: dict[int, socket.socket] = {}
        self._release = weakref.finalize(self, _detach_all, self._socks)
        self._closed = False
        self._next = 0.0
        self.cut = 0  # connections shut down so far

    def close(self) -> None:
        """Let go of the watched fds (the socket objects over them, not closed) and watch
        no more (a socket object made later would close its fd when collected)."""
        self._release()
        self._conns.clear()
        self._closed = True

    def _drop(self, fd: int) -> None:
        self._conns.pop(fd, None)
        s = self._socks.pop(fd, None)
        if s is not None:
            s.detach()

    def _conn(self, fd: int) -> _Conn | None:
        """The connection on ``fd``, new if unknown or if the fd is another peer's now."""
        kept = self._socks.get(fd)
        s = kept if kept is not None or self._closed else _tcp_socket(fd)
        got = None if s is None else _read_and_peer(s)
        if s is None or got is None:
            if s is not None and s is not kept:
                s.detach()
            self._drop(fd)
            return None
        self._socks[fd] = s
        conn = self._conns.get(fd)
        if conn is None or conn.peer != got[1]:
            conn = self._conns[fd] = _Conn(got[1])
        return conn

    def on_event(self, event: int, value: int) -> None:
        """A monitor event. The events come after the messages libzmq delivered before
        them: a closed connection's end may be read after messages of the next one on
        its fd (whose count it must not take with it), so an end is applied only where
        the fd no longer carries the connection that the count is of."""
        if event & zmq.EVENT_ACCEPTED:  # (a message may have made it known already)
            self._conn(value)
        elif event & (zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED):
            conn = self._conns.get(value)
            got = None if conn is None else _read_and_peer(self._socks[value])
            if conn is not None and (got is None or got[1] != conn.peer):
                self._drop(value)

    def _sender(self, fd: int, rid: bytes) -> _Conn | None:
        """The record of the connection on ``fd`` that sent routing id ``rid``: a record
        of another routing id is an earlier connection's on that fd, whose end was not
        read yet (looked up then, as is a record no message named yet)."""
        conn = self._conns.get(fd)
        if conn is None or conn.rid != rid:
            conn = self._conn(fd)
            if conn is not None:
                conn.rid = rid
        return conn

    def on_message(self, frames: Sequence[Any]) -> int:
        """Count a message received from a ROUTER (``frames[0]``: the peer's routing id);
        returns the fd of its connection (-1: none, e.g. inproc)."""
        fd = srcfd(frames[1]) if len(frames) >= 2 else -1
        if fd >= 0:
            conn = self._sender(fd, _bytes(frames[0]))
            if conn is not None:
                conn.delivered += self._wire_size(frames)
        return fd

    def _wire_size(self, frames: Sequence[Any]) -> int:
        """:func:`wire_bytes` of the frames after the routing id, summed (inline: a
        request's loop pays it)."""
        box, n = (_CURVE_BOX if self.curve else 0), 0
        for f in frames[1:]:
            body = len(f) + box
            n += body + (2 if body <= 255 else 9)
        return n

    def on_dropped(self, fd: int, rid: bytes, nbytes: int) -> None:
        """Count a frame received from ``rid`` and thrown away (not part of a delivered
        message)."""
        conn = self._sender(fd, rid) if fd >= 0 else None
        if conn is not None:
            conn.delivered += wire_bytes(nbytes, self.curve)

    def pending(self) -> dict[int, int]:
        """Bytes received on each connection (by fd) and not delivered in a message."""
        out = {}
        for fd, conn in list(self._conns.items()):
            got = _read_and_peer(self._socks[fd])
            if got is None or got[1] != conn.peer:  # closed, or the fd is another's now
                self._drop(fd)
                continue
            out[fd] = got[0] - conn.delivered
        return out

    def _within_limits(self) -> bool:
        """Whether no connection can be past a limit, by one ``getsockopt`` each: what one
        holds is at most its bytes received, read or not, less those delivered. A count
        below zero is a record of a connection gone from its fd (:meth:`pending` drops it)."""
        total, limit = 0, self.limit
        for fd, conn in self._conns.items():
            received = _received(self._socks[fd])
            if received is None:  # closed, or its fd is no TCP socket's now
                return False
            held = received - conn.delivered
            if not 0 <= held <= limit:
                return False
            total += held
        return total <= BUSY_FACTOR * limit

    def due(self) -> bool:
        """Whether it is time for :meth:`tick` (every ``CHECK_S``)."""
        return time.monotonic() >= self._next

    def tick(self, readable: Callable[[], bool]) -> None:
        """Check every connection (``readable()``: whether a message waits to be read):
        the rule (module doc) only where the cheap bound leaves it in doubt."""
        self._next = time.monotonic() + CHECK_S
        if not self._conns or self._within_limits():
            return
        pending = self.pending()
        busy = readable()  # after the counts: a message whole before them is read by now
        limit = self.limit * (BUSY_FACTOR if busy else 1)
        over = [fd for fd, n in pending.items() if n > limit]
        if not busy:
            total, by_size = sum(pending.values()), sorted(pending, key=pending.__getitem__)
            while by_size and total > BUSY_FACTOR * self.limit:
                fd = by_size.pop()
                total -= pending[fd]
                over.append(fd)
        for fd in dict.fromkeys(over):
            peer = self._conns[fd].peer
            self._warn(
                "%s: cut the connection from %s: %d bytes of a message not yet whole "
                "(limit %d)", self.name, peer[0], pending[fd], limit,
            )  # fmt: skip
            _shutdown(fd)
            self._drop(fd)
            self.cut += 1


@dataclass(frozen=True)
class RouterLimits:
    """What one message to a ROUTER server may be: frames after the routing id, the
    largest frame (``MAXMSGSIZE``, before the CURVE handshake too) and the bytes of all
    its frames (whole, or in the making: the guard's limit)."""

    max_frames: int
    max_frame_bytes: int
    max_bytes: int


class GuardedRouter:
    """The bounded receiving side of the ROUTER socket ``sock`` (module doc); ``events``:
    more monitor events the owner wants (handed to ``on_event``)."""

    def __init__(
        self,
        sock: zmq.Socket,
        limits: RouterLimits,
        curve: bool,
        name: str,
        warn: Callable[..., None],
        events: int = 0,
        on_event: Callable[[int, int], None] | None = None,
    ) -> None:
        self.sock, self.limits, self._on_event = sock, limits, on_event
        sock.setsockopt(zmq.MAXMSGSIZE, limits.max_frame_bytes)
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        self.guard = ConnectionGuard(limits.max_bytes, curve, name, warn)
        self.fd = -1  # the fd of the connection the last message came on (-1: none)
        self.monitor = sock.get_monitor_socket(events | ConnectionGuard.EVENTS)  # before bind

    def drain_events(self) -> None:
        """The monitor's events so far: connections for the guard, the rest the owner's
        (asked by ``ZMQ_EVENTS``: a ``poll`` builds a poller each time)."""
        while int(self.monitor.get(_EVENTS)) & _POLLIN:
            ev = recv_monitor_message(self.monitor)
            event, value = int(ev["event"]), int(ev["value"])
            self.guard.on_event(event, value)
            if self._on_event is not None:
                self._on_event(event, value)

    def tick(self) -> None:
        """The guard's check, when it is due (call at least every :data:`CHECK_S`)."""
        if self.guard.due():  # the connections it knows first (monitor events)
            self.drain_events()
            self.guard.tick(self._readable)

    def _readable(self) -> bool:
        return bool(int(self.sock.get(_EVENTS)) & _POLLIN)

    def recv(self) -> tuple[list[Any], str]:
        """One message (``frames[0]``: the routing id), frame by frame, and what is wrong
        with its size ("" if nothing): past ``max_frames`` frames or ``max_bytes`` bytes
        the rest is received and thrown away frame by frame (never kept)."""
        sock, lim = self.sock, self.limits
        frames = [sock.recv(copy=False)]
        size = 0
        while frames[-1].more:
            frame = sock.recv(copy=False)
            frames.append(frame)
            size += len(frame)
            if len(frames) > lim.max_frames + 1 or size > lim.max_bytes:
                fd = srcfd(frame)
                while frame.more:  # the rest of it: counted, not kept
                    frame = sock.recv(copy=False)
                    self.guard.on_dropped(fd, _bytes(frames[0]), len(frame))
                self.fd = self.guard.on_message(frames)
                if size > lim.max_bytes:
                    return frames, f"{size}+ bytes exceed the limit of {lim.max_bytes}"
                return frames, f"{len(frames) - 1}+ frames exceed the limit of {lim.max_frames}"
        self.fd = self.guard.on_message(frames)
        return frames, ""

    def close(self) -> None:
        """Stop the monitor (before the socket closes)."""
        with contextlib.suppress(zmq.ZMQError):
            self.sock.disable_monitor()
        self.monitor.close(0)
        self.guard.close()


def _bytes(frame: Any) -> bytes:
    return frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame)


def srcfd(frame: Any) -> int:
    """The file descriptor of the connection a frame came in on (-1: none, e.g. inproc)."""
    try:
        return int(frame.get(_SRCFD))
    except (zmq.ZMQError, AttributeError, TypeError):
        return -1
