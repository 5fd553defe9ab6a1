"""The trainers' rendezvous over CURVE: a ``torch.distributed.Store`` only key holders reach.

``torch.distributed``'s own TCPStore accepts anyone who can connect: a stranger on the
pod network could read the trainers' addresses, add keys or stall the rendezvous. Here
trainer 0 serves the store (:class:`RendezvousServer`, a ZeroMQ ROUTER socket made a
CURVE server with the job's key pair, :mod:`graphrun.rpc.rendezvous`), or
``graphrun rendezvous`` serves it apart and no trainer does (``hosts.rendezvous_external``:
the operator's rendezvous pod of an elastic job). Every trainer talks to it through
:class:`KeyStore`, a ``torch.distributed.Store`` whose requests go over a CURVE client
socket with the same pair. A peer without the job's
secret key fails the CURVE handshake: it gets no answer and changes nothing.

Wire (every message is raw byte frames; nothing is unpickled)::

    request  [op, key, arg...]        op: set | get | add | cas | check | del | count
    reply    [status, value]          status: ok | missing | error (raised: RemoteError)

``get`` and ``wait`` poll (the server never blocks on a key), until the store's timeout.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import zmq

from graphrun.errors import RemoteError, RpcTimeout
from graphrun.rpc.auth import KeyPair, secure_client
from graphrun.rpc.rendezvous import RendezvousServer

__all__ = ["KeyStore", "RendezvousServer", "key_store"]

POLL_S = 0.02


class KeyStore(dist.Store):
    """A ``torch.distributed.Store`` over the CURVE rendezvous (one per trainer)."""

    def __init__(self, address: str, keys: KeyPair, timeout_s: float = 300.0) -> None:
        super().__init__()
        self._address, self._keys, self._timeout_s = address, keys, timeout_s
        self._ctx = zmq.Context()
        self._lock = threading.Lock()
        self._sock = self._connect()

    def _connect(self) -> zmq.Socket:
        sock = self._ctx.socket(zmq.REQ)
        sock.linger = 0
        sock.ipv6 = "[" in self._address
        # a send waits too: with no pipe (a handshake the server refused drops it until
        # the reconnect) a REQ socket's send blocks for ever
        sock.sndtimeo = int(min(1.0, self._timeout_s) * 1000)
        secure_client(sock, self._keys)
        sock.connect(self._address)
        return sock

    def _call(self, *frames: bytes) -> tuple[bytes, bytes]:
        deadline = time.monotonic() + self._timeout_s
        with self._lock:
            while True:
                try:
                    self._sock.send_multipart(list(frames))
                    answered = self._sock.poll(int(min(1.0, self._timeout_s) * 1000), zmq.POLLIN)
                except zmq.Again:  # not even sent: no answer, as below
                    answered = 0
                if answered:
                    status, value = self._sock.recv_multipart()
                    if status == b"error":  # malformed, or beyond the table's limits
                        raise RemoteError(value.decode(errors="replace"),
                                          address=self._address, kind="rendezvous")  # fmt: skip
                    return status, value
                self._sock.close()  # a REQ socket waits for its answer: start afresh
                self._sock = self._connect()
                if time.monotonic() > deadline:
                    raise RpcTimeout(
                        f"no answer within {self._timeout_s:g}s (a job key mismatch looks "
                        "the same: the rendezvous answers only the job's key)",
                        address=self._address, kind="rendezvous",
                    )  # fmt: skip

    def _until(self, *frames: bytes) -> bytes:
        deadline = time.monotonic() + self._timeout_s
        while True:
            status, value = self._call(*frames)
            if status == b"ok":
                return value
            if time.monotonic() > deadline:
                raise RpcTimeout(
                    f"{frames[0].decode()} {frames[1:]!r}: not set within {self._timeout_s:g}s",
                    address=self._address, kind="rendezvous",
                )  # fmt: skip
            time.sleep(POLL_S)

    # --- torch.distributed.Store ---------------------------------------------------------

    def set(self, key: str, value: Any) -> None:
        self._call(b"set", key.encode(), as_bytes(value))

    def get(self, key: str) -> bytes:
        return self._until(b"get", key.encode())

    def add(self, key: str, amount: int) -> int:
        return int(self._call(b"add", key.encode(), str(int(amount)).encode())[1])

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._call(b"cas", key.encode(), as_bytes(expected), as_bytes(desired))[1]

    def check(self, keys: list[str]) -> bool:
        return self._call(b"check", *(k.encode() for k in keys))[0] == b"ok"

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._until(b"check", *(k.encode() for k in keys))

    def delete_key(self, key: str) -> bool:
        return self._call(b"del", key.encode())[0] == b"ok"

    def num_keys(self) -> int:
        return int(self._call(b"count", b"")[1])

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout_s = timeout.total_seconds()

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()


def as_bytes(value: Any) -> bytes:
    """A value set in or read from a torch ``Store`` as bytes (torch gives bytes, a str
    or a list of ints, as it passes ``std::vector<uint8_t>``)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return bytes(value)  # a list of ints, as torch passes std::vector<uint8_t>


@contextlib.contextmanager
def key_store(
    rendezvous: str, rank: int, keys: KeyPair, timeout_s: float, serve: bool | None = None
) -> Iterator[KeyStore]:
    """The trainers' store at ``host:port``: trainer 0 serves it on that port (every
    interface: CURVE, not the address, keeps strangers out), every trainer joins it.
    ``serve``: whether this trainer serves it (default: rank 0; never a joiner)."""
    host, _, port = rendezvous.rpartition(":")
    own = KeyPair(keys.public, keys.secret)  # the job's pair, never a shared store's server
    serving = rank == 0 if serve is None else serve
    server = RendezvousServer(f"tcp://*:{port}", own) if serving else None
    store = KeyStore(f"tcp://{host}:{port}", own, timeout_s)
    try:
        yield store
    finally:
        store.close()
        if server is not None:
            server.close()
