"""The connection guard: what one connection can make a server buffer is bounded, though
libzmq keeps a multipart message whole before the application sees any of it."""

from __future__ import annotations

import gc
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest
import zmq

from graphrun.rpc import Limits, Message, MsgKind, RpcClient, new_keypair
from graphrun.rpc.auth import secure_client
from graphrun.rpc.codec import encode
from graphrun.rpc.guard import ConnectionGuard, wire_bytes
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


def _read(s: socket.socket, n: int) -> None:
    while n:
        n -= len(s.recv(min(n, 1 << 16)))


def test_what_the_kernel_holds_unread_is_not_counted_as_a_message_in_the_making():
    """Bytes still in the kernel's receive queue (libzmq's I/O thread has not read them: a
    starved server) are not what the server buffers: whole requests sent back to back
    counted as a message in the making. What is read counts as before."""
    cuts: list[object] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # the 3 MiB fit
        with socket.create_connection(listener.getsockname(), timeout=10) as client:
            server, _ = listener.accept()
            with server:
                guard = ConnectionGuard(1 << 20, False, "test", lambda *a: cuts.append(a))
                guard.on_event(zmq.EVENT_ACCEPTED, server.fileno())
                client.sendall(b"x" * (3 << 20))
                _wait_for(lambda: _received(server) == 3 << 20)
                guard.tick(lambda: False)
                assert guard.pending() == {server.fileno(): 0} and not cuts
                _read(server, 3 << 19)  # 1.5 MiB now in the server's hands, never delivered
                assert guard.pending() == {server.fileno(): 3 << 19}
                guard.tick(lambda: False)
                assert guard.cut == 1 and len(cuts) == 1


def _received(s: socket.socket) -> int:
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("Q", info, 128)[0]  # tcpi_bytes_received


class _Part(bytes):
    """A received frame as the guard reads it: its bytes and the fd it came on."""

    fd = -1

    def get(self, option: int) -> int:
        assert option == zmq.SRCFD
        return self.fd


def _deliver(guard: ConnectionGuard, client: socket.socket, server: socket.socket,
             rid: bytes, n: int) -> None:  # fmt: skip
    """A message of one ``n``-byte frame from ``client``, read whole and delivered."""
    body = _Part(b"m" * n)
    body.fd = server.fileno()
    sending = threading.Thread(target=client.sendall, args=(b"h" * wire_bytes(n, False),))
    sending.start()
    _read(server, wire_bytes(n, False))
    sending.join()
    guard.on_message([rid, body])


def _on_fd(listener: socket.socket, fd: int) -> socket.socket:
    accepted, _ = listener.accept()
    with accepted:
        return socket.socket(fileno=os.dup2(accepted.fileno(), fd))


def test_a_closed_connections_late_end_keeps_the_count_of_the_next_on_its_fd():
    """The parameter server's parked pulls were cut under load: the connection before
    them (a good request) had ended on the same fd, and its end, read from the monitor
    after their messages had been counted, took their count with it: 1 MiB delivered
    looked not yet whole. A routing id the record has not seen looks the fd up again, and
    an end is applied only where the fd no longer carries the record's connection."""
    cuts: list[object] = []
    guard = ConnectionGuard(1 << 20, False, "test", lambda *a: cuts.append(a))
    fd = 1000  # both connections' (libzmq's accepted fds are reused as the kernel's are)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with socket.create_connection(listener.getsockname(), timeout=10) as first:
            s1 = _on_fd(listener, fd)
            guard.on_event(zmq.EVENT_ACCEPTED, fd)
            _deliver(guard, first, s1, b"r1", 100)
            s1.close()
        second = socket.create_connection(listener.getsockname(), timeout=10)
        with second, _on_fd(listener, fd) as s2:  # the first's fd
            for _ in range(3):  # delivered before the first's end is read
                _deliver(guard, second, s2, b"r2", 512 << 10)
            guard.on_event(zmq.EVENT_DISCONNECTED, fd)  # the first's end, late
            guard.on_event(zmq.EVENT_ACCEPTED, fd)
            guard.tick(lambda: False)
            assert not cuts and guard.pending() == {fd: 0}
            second.sendall(b"x" * (3 << 19))  # what is read and not delivered counts
            _read(s2, 3 << 19)
            guard.tick(lambda: False)
            assert len(cuts) == 1 and guard.cut == 1
        guard.on_event(zmq.EVENT_DISCONNECTED, fd)  # its own end, now closed
        assert guard.pending() == {}


def test_the_guard_never_closes_the_fds_it_watches():
    """The guard keeps a socket object over each watched fd (libzmq's): dropped, closed
    or let go uncollected, it must leave the fd open (a closed fd would end a peer's
    connection behind libzmq's back, or another socket's that took the number)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=10)
        server, _ = listener.accept()
        with client, server:
            for close in (False, True):
                guard = ConnectionGuard(1 << 20, False, "test", lambda *a: None)
                guard.on_event(zmq.EVENT_ACCEPTED, server.fileno())
                guard.tick(lambda: False)
                assert list(guard.pending()) == [server.fileno()]
                if close:
                    guard.close()
                    guard.on_event(zmq.EVENT_ACCEPTED, server.fileno())  # watches no more
                    assert guard.pending() == {}
                del guard
                gc.collect()
                client.sendall(b"still open")
                _read(server, 10)


def test_the_largest_is_cut_while_all_together_hold_too_much():
    """Each connection below the limit, all of them together above ``BUSY_FACTOR`` times
    it: the largest is cut, and only it (the check's cheap bound, each one's bytes
    received less delivered, must not pass this by)."""
    cuts: list[tuple] = []
    guard = ConnectionGuard(1 << 20, False, "test", lambda *a: cuts.append(a))
    sizes = [900 << 10] * 4 + [950 << 10]  # 4.55 MiB in all, against 4 MiB
    with socket.create_server(("127.0.0.1", 0)) as listener:
        pairs = []
        try:
            for n in sizes:
                client = socket.create_connection(listener.getsockname(), timeout=10)
                server, _ = listener.accept()
                pairs.append((client, server))
                guard.on_event(zmq.EVENT_ACCEPTED, server.fileno())
                sending = threading.Thread(target=client.sendall, args=(b"x" * n,))
                sending.start()
                _read(server, n)  # read (as libzmq would), never delivered
                sending.join()
            guard.tick(lambda: False)
            assert guard.cut == 1 and len(cuts) == 1
            assert set(guard.pending()) == {s.fileno() for _, s in pairs[:-1]}
        finally:
            for client, server in pairs:
                client.close()
                server.close()
