"""The probes' key and their connections' first messages, tagged with it.

Both probes — the Kubernetes probe's members (:mod:`graphrun.measure.member`) and the
host probe's servers (:mod:`graphrun.measure.host` ``sink``/``echo``, run by
:mod:`graphrun.measure.probe`) — open a measuring connection the same way::

    client -> server   HEADER: magic "GRPB", step, sender index, ping count (!4sIII),
                       and its tag
    server -> client   "G" and a tag, once the server has reached that step

A tag is HMAC-SHA256 under the probe's key (at least :data:`KEY_BYTES` random bytes,
fresh for every probe) of the message's role, the header and the message: no one
without the key can take a client's place or answer for a server, and a header of
another step is refused. An :class:`Acceptor` accepts and reads headers all at once, each
connection within its own :data:`HEADER_SECONDS` (:mod:`graphrun.streams`, as the warm
server reads its requests), and closes anything whose header does not verify unanswered,
so idle strangers on the port never hold up a probe. What a key holder's header may ask
is bounded too: at most :data:`MAX_PINGS` pings, a step below the probe's count of steps,
one connection parked a sender and :data:`MAX_PARKED` in all; past them it is closed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass

from graphrun.streams import Pending, StreamLimits

MAGIC = b"GRPB"
HEADER = struct.Struct("!4sIII")  # magic, step, sender, ping count
GO = b"G"
HEADER_SECONDS = 10.0  # a member sends its header as soon as it connects
MAX_PENDING = 128  # connections waiting for their header (strangers past it: oldest closed)
MAX_PARKED = 256  # connections parked for their step (one a sender: a member a peer)
MAX_PINGS = 100_000  # a header's ping count
BACKLOG = 128
KEY_ENV = "GRAPHRUN_PROBE_KEY"  # the probe's key, hex
KEY_BYTES = 32
TAG = 32  # bytes of an HMAC-SHA256 tag


def tag(key: bytes, role: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 under ``key`` of ``role`` (b"hdr", b"go", b"ans") and ``parts``."""
    return hmac.new(key, b"|".join((role, *parts)), hashlib.sha256).digest()


def parse_key(text: str, where: str = KEY_ENV) -> bytes:
    """The probe's key from its hex form; ValueError naming ``where``."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError(f"{where}: not hex") from None
    if len(key) < KEY_BYTES:
        raise ValueError(f"{where}: {len(key)} bytes, a probe key has at least {KEY_BYTES}")
    return key


def new_key() -> bytes:
    """A fresh probe key."""
    return secrets.token_bytes(KEY_BYTES)


def left(deadline: float) -> float:
    """Seconds to ``deadline`` (``time.monotonic``), never quite zero (a socket timeout)."""
    return max(deadline - time.monotonic(), 0.001)


def recv_exactly(conn: socket.socket, size: int) -> bytes:
    out = b""
    while len(out) < size:
        chunk = conn.recv(size - len(out))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        out += chunk
    return out


def hello(conn: socket.socket, key: bytes, step: int, sender: int, count: int) -> bytes | None:
    """The client's side: send the tagged header, wait for the server's go (within the
    socket's timeout); the header, or None when the go does not carry the key."""
    header = HEADER.pack(MAGIC, step, sender, count)
    conn.sendall(header + tag(key, b"hdr", header))
    go = recv_exactly(conn, 1 + TAG)
    return header if hmac.compare_digest(go, GO + tag(key, b"go", header)) else None


def say_go(conn: socket.socket, key: bytes, header: bytes) -> None:
    """The server's side, once it takes a parked connection: its tagged go."""
    conn.sendall(GO + tag(key, b"go", header))


@dataclass
class Parked:
    """A sender's connection that waits for its step (the header already read)."""

    conn: socket.socket
    sender: int
    count: int
    header: bytes


class Acceptor:
    """Accepts connections on ``srv`` in a thread, reading every header at once (a
    selector), each connection within its own :data:`HEADER_SECONDS`: a connection whose
    header carries the probe's tag is parked by its step until :meth:`take`, anything
    else (a port scan, a health check, a stranger, one of a step already served or not
    below ``steps``, a second of one sender, a count past :data:`MAX_PINGS`) is closed
    unanswered. At most :data:`MAX_PENDING` connections wait for their header; past that
    the oldest is closed (a member sends its header as soon as it connects, so only
    strangers linger), and idle strangers never hold up a member. At most
    :data:`MAX_PARKED` connections are parked."""

    def __init__(self, srv: socket.socket, key: bytes, steps: int = 1 << 32) -> None:
        self._srv, self._key, self._steps = srv, key, steps
        self._cond = threading.Condition()
        self._parked: dict[int, Parked] = {}
        self._below = 0  # headers of earlier steps are refused: those steps are served
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-accept", daemon=True)
        self._sel = selectors.DefaultSelector()
        self._pending = Pending(self._sel, StreamLimits(HEADER.size + TAG, HEADER_SECONDS,
                                                        MAX_PENDING))  # fmt: skip

    def __enter__(self) -> Acceptor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._cond:
            for waiting in self._parked.values():
                waiting.conn.close()
            self._parked.clear()

    def take(self, step: int, deadline: float) -> Parked | None:
        """The connection of ``step`` once its sender came, or None at ``deadline``."""
        with self._cond:
            self._below = max(self._below, step)
            self._cond.wait_for(lambda: step in self._parked, timeout=left(deadline))
            got = self._parked.pop(step, None)
            if got is not None:
                self._below = step + 1
            return got

    def _run(self) -> None:
        self._srv.setblocking(False)
        self._sel.register(self._srv, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for ready, _ in self._sel.select(timeout=0.1):
                    conn = ready.fileobj
                    assert isinstance(conn, socket.socket)
                    if conn is self._srv:
                        for new in self._pending.accept(conn):
                            self._read(new)  # a member's header is usually there already
                    elif conn in self._pending:
                        self._read(conn)
                self._pending.expire()
        finally:
            self._pending.close()
            self._sel.close()

    def _read(self, conn: socket.socket) -> None:
        got = self._pending.read(conn, HEADER.size + TAG)
        if got is None:
            return
        header, mac = got[: HEADER.size], got[HEADER.size :]
        magic, step, who, count = HEADER.unpack(header)
        signed = hmac.compare_digest(mac, tag(self._key, b"hdr", header))
        with self._cond:
            if signed and magic == MAGIC and self._admits(step, who, count):
                conn.setblocking(True)
                self._parked[step] = Parked(conn, who, count, header)
                self._cond.notify_all()
                return
        conn.close()

    def _admits(self, step: int, sender: int, count: int) -> bool:
        """Whether a signed header may park (under ``_cond``)."""
        return (
            self._below <= step < self._steps
            and step not in self._parked
            and count <= MAX_PINGS
            and len(self._parked) < MAX_PARKED
            and all(p.sender != sender for p in self._parked.values())
        )
