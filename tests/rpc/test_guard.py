"""The connection guard: what one connection can make a server buffer is bounded, though
libzmq keeps a multipart message whole before the application sees any of it."""

from __future__ import annotations

import socket
import struct
import time

import numpy as np
import pytest
import zmq

from graphrun.rpc import Limits, Message, MsgKind, RpcClient, new_keypair
from graphrun.rpc.auth import secure_client
from graphrun.rpc.codec import encode
from graphrun.rpc.guard import wire_bytes
from graphrun.testing.threads import ServerThread


def echo(peer, msg):
    return Message(MsgKind.REPLY, msg.op, msg.request_id, msg.body, msg.tensors)


def _wait_for(what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_the_wire_size_of_delivered_messages_is_counted_exactly(curve):
    keys = new_keypair() if curve else None
    with ServerThread("tcp://127.0.0.1:0", echo, keys=keys) as st:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        if keys is not None:
            secure_client(sock, keys)
        sock.connect(st.address)
        try:
            sizes = [0, 1, 188, 189, 222, 223, 253, 254, 300, 70_000, 1 << 20]
            for i, n in enumerate(sizes * 3):
                t = np.zeros(n, np.uint8)
                msg = Message(MsgKind.REQUEST, "echo", i, {"pad": "x" * (i * 7 % 300)}, (t,))
                sock.send_multipart(encode(msg))
                assert sock.poll(5000)
                sock.recv_multipart()
            guard = st.server.guard
            _wait_for(lambda: guard.pending())
            # all that is left: the handshake (greeting, READY / CURVE commands)
            assert all(0 <= n < 1024 for n in guard.pending().values()), guard.pending()
        finally:
            sock.close(0)
            ctx.term()
    assert wire_bytes(0, False) == 2 and wire_bytes(256, False) == 265
    assert wire_bytes(222, True) == 257 and wire_bytes(223, True) == 265


def _zmtp_null_dealer(address: str) -> socket.socket:
    """A raw TCP peer speaking ZMTP 3.0 (NULL mechanism) as a DEALER: it can send frames
    of a message that never ends, which libzmq's own sockets never do."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0")
    s.sendall(greeting + b"\0" * 32)
    got = b""
    while len(got) < 64:
        got += s.recv(64 - len(got))
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    s.sendall(bytes([0x04, len(body)]) + body)
    return s


def test_a_message_that_never_ends_is_cut_and_the_server_goes_on():
    """A key holder sending frame after frame without an end made the server buffer
    gigabytes (libzmq keeps the message until its last frame; MAXMSGSIZE bounds one
    frame); the guard cuts the connection past the request limit."""
    limits = Limits(max_request_bytes=1 << 20)
    with ServerThread("tcp://127.0.0.1:0", echo, limits=limits) as st:
        raw = _zmtp_null_dealer(st.address)
        # the cut shuts the server's side down; with the kernel's buffers full, a send
        # may then wait for its timeout rather than see the reset: do not wait 10 s
        raw.settimeout(2)
        frame = b"\x03" + struct.pack(">Q", 1 << 16) + b"x" * (1 << 16)  # MORE | LONG
        sent, cut = 0, False
        try:
            while sent < 512 << 20:
                raw.sendall(frame)
                sent += len(frame)
        except OSError:  # reset by the server
            cut = True
        finally:
            raw.close()
        assert cut, f"{sent} bytes of one message accepted"
        _wait_for(lambda: st.server.guard.cut == 1)
        with RpcClient(st.address, timeout=5) as c:  # and it serves on
            assert c.call("echo", {"x": 1}).body == {"x": 1}
