"""The trainers' rendezvous table, served over CURVE (no torch: ``graphrun rendezvous``
runs it alone in a small pod).

:class:`RendezvousServer` is a ZeroMQ ROUTER socket made a CURVE server with the job's key
pair (:func:`graphrun.rpc.auth.secure_server`): a peer without the job's secret key fails
the handshake, gets no answer and changes nothing. Trainer 0 serves it in a thread
(:func:`graphrun.train.rendezvous.key_store`), or ``graphrun rendezvous`` serves it apart
(the operator's ``<job>-rendezvous`` pod of an elastic job, so that losing trainer 0's
machine does not lose the place the others re-form at). Trainers reach it through
:class:`graphrun.train.rendezvous.KeyStore`.

Wire (every message is raw byte frames; nothing is unpickled)::

    request  [op, key, arg...]        op: set | get | add | cas | check | del | count
    reply    [status, value]          status: ok | missing | error (value: why)

Memory is bounded (:class:`Limits`): a key of at most ``max_key`` bytes, a value of at
most ``max_value``, at most ``max_keys`` keys and ``max_bytes`` of keys and values in
all; a request beyond them is answered ``error`` and changes nothing. A message is
received as the store's are (:class:`graphrun.rpc.guard.GuardedRouter`): ZeroMQ drops a
frame much larger than a key and a value (``MAXMSGSIZE``) before it is read, a message
of more than ``max_frames`` frames or :meth:`Limits.request_bytes` bytes is answered
``error`` and the rest of it thrown away frame by frame, and a connection holding more
than that of a message not yet whole is shut down (a key holder's message of 8,192
frames of 64 KiB took this server from 109 MiB to 1,070 MiB before). Requests waiting to
be read are bounded by ZeroMQ's receive high-water mark (:data:`RCVHWM` a peer) and by
that guard, and a peer that does not finish the CURVE handshake within 5 s is dropped
(:data:`graphrun.rpc.guard.HANDSHAKE_MS`). A request that is not one of the table's is
answered ``error`` with one (rate-limited) log line, and the server goes on.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import zmq

from graphrun.errors import ArgumentError, TableFull
from graphrun.rpc.auth import KeyPair, RateLimitedLog, secure_server
from graphrun.rpc.guard import CHECK_S, GuardedRouter, RouterLimits

NOISY = RateLimitedLog(logging.getLogger("graphrun.rendezvous"))

RCVHWM = 1000  # requests queued a peer, at most


@dataclass(frozen=True)
class Limits:
    """What the table may hold. A torch group of N trainers sets a few keys per rank
    and generation (addresses, counters, NCCL ids of 128 bytes): the defaults hold
    thousands of generations of hundreds of trainers."""

    max_keys: int = 100_000
    max_key: int = 1024  # bytes
    max_value: int = 64 * 1024  # bytes
    max_bytes: int = 64 * 1024 * 1024  # keys and values together
    max_frames: int = 64  # of one request: torch's wait() names a few keys

    def __post_init__(self) -> None:
        for name in ("max_keys", "max_key", "max_value", "max_bytes", "max_frames"):
            if getattr(self, name) < 1:
                raise ArgumentError(f"{name}: must be >= 1, got {getattr(self, name)}")

    def request_bytes(self) -> int:
        """The most one request may hold: a ``cas`` (a key, two values) or a ``check`` of
        ``max_frames`` keys, and the frames' few bytes of op and envelope."""
        return max(self.max_key + 2 * self.max_value, self.max_frames * self.max_key) + 64

    def router(self) -> RouterLimits:
        # a frame larger than a key and a value is never read into memory (the margin:
        # the CURVE handshake's own messages, a few hundred bytes, pass the same check)
        frame = self.max_key + self.max_value + 4096
        return RouterLimits(self.max_frames + 3, frame, self.request_bytes())


class RendezvousServer:
    """The key-value table the trainers meet at, served in a thread until :meth:`close`."""

    def __init__(self, bind: str, keys: KeyPair, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        self._sock.ipv6 = "[" in bind  # tcp://[::1]:P; off, IPv4 endpoints stay IPv4
        self._sock.rcvhwm = RCVHWM
        self._auth = secure_server(self._ctx, self._sock, keys, name="rendezvous")
        self._router = GuardedRouter(
            self._sock, self.limits.router(), True, "rendezvous", NOISY.warning
        )
        try:
            self._sock.bind(bind)
        except zmq.ZMQError as exc:
            self._router.close()
            self._sock.close()
            self._auth.stop()
            self._ctx.term()
            raise ArgumentError(f"cannot bind {bind!r} ({exc})") from None
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._data: dict[bytes, bytes] = {}
        self._bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rendezvous", daemon=True)
        self._thread.start()

    def _put(self, key: bytes, value: bytes) -> None:
        lim, old = self.limits, self._data.get(key)
        if len(key) > lim.max_key:
            raise TableFull(f"key of {len(key)} bytes, more than {lim.max_key}")
        if len(value) > lim.max_value:
            raise TableFull(f"value of {len(value)} bytes, more than {lim.max_value}")
        if old is None and len(self._data) >= lim.max_keys:
            raise TableFull(f"{lim.max_keys} keys already")
        size = self._bytes + len(value) + (len(key) if old is None else -len(old))
        if size > lim.max_bytes:
            raise TableFull(f"more than {lim.max_bytes} bytes of keys and values")
        self._data[key] = value
        self._bytes = size

    def _answer(self, op: bytes, args: list[bytes]) -> list[bytes]:
        d = self._data
        if op == b"set":
            self._put(args[0], args[1])
        elif op == b"get":
            return [b"ok", d[args[0]]] if args[0] in d else [b"missing", b""]
        elif op == b"add":
            value = int(d.get(args[0], b"0")) + int(args[1])
            self._put(args[0], str(value).encode())
            return [b"ok", d[args[0]]]
        elif op == b"cas":  # compare_set: set to args[2] if it is args[1] (or absent and "")
            current = d.get(args[0])
            if (current is None and args[1] == b"") or current == args[1]:
                self._put(args[0], args[2])
            return [b"ok", d.get(args[0], args[1])]
        elif op == b"check":
            return [b"ok" if all(k in d for k in args) else b"missing", b""]
        elif op == b"del":
            old = d.pop(args[0], None)
            if old is None:
                return [b"missing", b""]
            self._bytes -= len(args[0]) + len(old)
        elif op == b"count":
            return [b"ok", str(len(d)).encode()]
        else:
            return [b"error", b"unknown op"]
        return [b"ok", b""]

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            ready = poller.poll(int(CHECK_S * 1000))
            self._router.tick()
            if ready:
                self._serve_one(*self._router.recv())

    def _serve_one(self, frames: list[zmq.Frame], too_big: str) -> None:
        # [identity, b"", op, args...] from a REQ socket
        if len(frames) < 3:
            return
        head = [frames[0].bytes, frames[1].bytes]
        if too_big:
            NOISY.warning("rendezvous: refused a request from %s: %s", head[0].hex(), too_big)
            self._sock.send_multipart([*head, b"error", f"refused: {too_big}".encode()])
            return
        op, args = frames[2].bytes, [f.bytes for f in frames[3:]]
        try:
            reply = self._answer(op, args)
        except (IndexError, ValueError):
            NOISY.warning("rendezvous: a malformed %r request from %s", op[:16], head[0].hex())
            reply = [b"error", b"malformed request"]
        except TableFull as exc:
            reply = [b"error", f"rendezvous full: {exc}".encode()]
        self._sock.send_multipart([*head, *reply])

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server thread ends (after :meth:`close` from elsewhere) or
        ``timeout`` passes; True when it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._router.close()
        self._sock.close()
        self._auth.stop()
        self._ctx.term()
