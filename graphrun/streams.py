"""Bounded requests on the project's stream and seqpacket socket servers.

The store, parameter servers and rendezvous are ZeroMQ ROUTER servers, bounded by
:class:`graphrun.rpc.guard.GuardedRouter`. The other servers read plain sockets: the warm
server (:mod:`graphrun.machine.warm`, ``AF_UNIX`` ``SOCK_SEQPACKET``, one JSON request a
connection) and the probes' measuring servers (:mod:`graphrun.measure.auth`'s
``Acceptor``, TCP, one tagged header a connection). Both take a request the same way,
here: every connection accepted at once and read as its bytes come (a selector, never one
connection at a time), each within its own deadline from its accept, at most
``max_pending`` of them waiting (past it the oldest is closed), at most ``max_bytes`` of
a request; what does not decode (not JSON, nested past the parser's depth, not a JSON
object) is refused, never the end of the server.

This module sits at the bottom (the standard library only): ``graphrun.measure`` may
import nothing of graphrun above ``errors``/``files``, and the warm server is in
``graphrun.machine``; both import it from here.
"""

from __future__ import annotations

import json
import selectors
import socket
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StreamLimits:
    """What one connection may cost a stream server before its request is whole."""

    max_bytes: int  # of one request
    deadline_s: float  # from its accept to its whole request
    max_pending: int  # connections waiting for their request

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.deadline_s <= 0 or self.max_pending < 1:
            raise ValueError(f"stream limits must be positive: {self}")


class Pending:
    """Connections accepted and not yet whole, on ``sel`` (the server's selector, its data:
    this object): :meth:`accept` takes every connection the listener has, :meth:`expire`
    closes those past their deadline. A reader of a ready connection reads with
    :meth:`read` (a stream: bytes until ``want``) or takes it whole with :meth:`take`."""

    def __init__(self, sel: selectors.BaseSelector, limits: StreamLimits) -> None:
        self.sel, self.limits = sel, limits
        self._conns: dict[socket.socket, tuple[float, bytearray]] = {}  # oldest first

    def __len__(self) -> int:
        return len(self._conns)

    def __contains__(self, conn: object) -> bool:
        return conn in self._conns

    def accept(self, listener: socket.socket) -> list[socket.socket]:
        """Every connection waiting on ``listener`` (non-blocking), added; the new ones."""
        new = []
        for _ in range(self.limits.max_pending):  # then the pending connections' turn
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # out of descriptors: make room, the backlog holds the rest
                if self._conns:
                    self.drop(next(iter(self._conns)))
                break
            self.add(conn)
            new.append(conn)
        return [c for c in new if c in self._conns]

    def add(self, conn: socket.socket) -> None:
        """Wait for ``conn``'s request, within the deadline (the oldest closed past the bound)."""
        conn.setblocking(False)
        self._conns[conn] = (time.monotonic() + self.limits.deadline_s, bytearray())
        self.sel.register(conn, selectors.EVENT_READ, self)
        while len(self._conns) > self.limits.max_pending:
            self.drop(next(iter(self._conns)))

    def read(self, conn: socket.socket, want: int) -> bytes | None:
        """Read what ``conn`` has, up to ``want`` bytes in all (at most ``max_bytes``):
        the ``want`` bytes once there (``conn`` taken), else None (still waiting, or
        closed and dropped: ``conn in self`` tells)."""
        buf = self._conns[conn][1]
        want = min(want, self.limits.max_bytes)
        try:
            chunk = conn.recv(want - len(buf))
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            chunk = b""
        if not chunk:
            self.drop(conn)
            return None
        buf += chunk
        if len(buf) < want:
            return None
        self.take(conn)
        return bytes(buf)

    def take(self, conn: socket.socket) -> None:
        """Hand ``conn`` back to the server (no longer watched, still non-blocking)."""
        self.sel.unregister(conn)
        del self._conns[conn]

    def drop(self, conn: socket.socket) -> None:
        """Close ``conn`` unanswered."""
        self.take(conn)
        conn.close()

    def expire(self) -> int:
        """Close the connections past their deadline; how many."""
        now = time.monotonic()
        late = [c for c, (end, _) in self._conns.items() if end < now]
        for conn in late:
            self.drop(conn)
        return len(late)

    def close(self) -> None:
        for conn in list(self._conns):
            self.drop(conn)


def json_object(data: bytes) -> dict[str, Any]:
    """``data`` as a JSON object; ValueError for anything else, whatever the parser raised
    (bytes that are not UTF-8, nesting deeper than its recursion: a RecursionError)."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"a JSON {type(obj).__name__}, not an object")
    return obj
