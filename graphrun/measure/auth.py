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
connection within its own :data:`HEADER_SECONDS`, and closes anything whose header does
not verify unanswered, so idle strangers on the port never hold up a probe.
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

MAGIC = b"GRPB"
HEADER = struct.Struct("!4sIII")  # magic, step, sender, ping count
GO = b"G"
HEADER_SECONDS = 10.0  # a member sends its header as soon as it connects
MAX_PENDING = 128  # connections waiting for their header (strangers past it: oldest closed)
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
    else (a port scan, a health check, a stranger, one of a step already served) is
    closed unanswered. At most :data:`MAX_PENDING` connections wait for their header;
    past that the oldest is closed (a member sends its header as soon as it connects,
    so only strangers linger), and idle strangers never hold up a member."""

    def __init__(self, srv: socket.socket, key: bytes) -> None:
        self._srv, self._key = srv, key
        self._cond = threading.Condition()
        self._parked: dict[int, Parked] = {}
        self._below = 0  # headers of earlier steps are refused: those steps are served
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-accept", daemon=True)
        self._sel = selectors.DefaultSelector()
        self._pending: dict[socket.socket, tuple[float, bytearray]] = {}  # oldest first

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
                    if ready.fileobj is self._srv:
                        self._accept()
                    else:
                        self._read(ready.fileobj)  # type: ignore[arg-type]
                now = time.monotonic()
                for conn in [c for c, (end, _) in self._pending.items() if end < now]:
                    self._drop(conn)
        finally:
            for conn in list(self._pending):
                self._drop(conn)
            self._sel.close()

    def _accept(self) -> None:
        for _ in range(MAX_PENDING):  # then the pending connections' turn
            try:
                conn, _ = self._srv.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors: make room, the backlog holds the rest
                if self._pending:
                    self._drop(next(iter(self._pending)))
                return
            conn.setblocking(False)
            self._pending[conn] = (time.monotonic() + HEADER_SECONDS, bytearray())
            self._sel.register(conn, selectors.EVENT_READ)
            self._read(conn)  # a member's header is usually there already
            if len(self._pending) > MAX_PENDING:
                self._drop(next(iter(self._pending)))

    def _drop(self, conn: socket.socket) -> None:
        self._sel.unregister(conn)
        del self._pending[conn]
        conn.close()

    def _read(self, conn: socket.socket) -> None:
        _, buf = self._pending[conn]
        try:
            chunk = conn.recv(HEADER.size + TAG - len(buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        buf += chunk
        if len(buf) < HEADER.size + TAG:
            return
        self._sel.unregister(conn)
        del self._pending[conn]
        header, mac = bytes(buf[: HEADER.size]), bytes(buf[HEADER.size :])
        magic, step, who, count = HEADER.unpack(header)
        signed = hmac.compare_digest(mac, tag(self._key, b"hdr", header))
        with self._cond:
            if signed and magic == MAGIC and step >= self._below and step not in self._parked:
                conn.setblocking(True)
                self._parked[step] = Parked(conn, who, count, header)
                self._cond.notify_all()
                return
        conn.close()
