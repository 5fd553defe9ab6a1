"""graphrun.train.sockets: a group's connections noted as it forms, shut when it breaks."""

from __future__ import annotations

import socket

from graphrun.train.sockets import opened, shut


def test_the_connections_opened_are_shut_and_the_peer_reads_their_end():
    listener = socket.create_server(("127.0.0.1", 0))
    noted: set[tuple[int, int]] = set()
    with opened(noted):  # as gloo's init: a listener and a connection
        mine = socket.create_connection(listener.getsockname(), timeout=10)
        own_listener = socket.create_server(("127.0.0.1", 0))
    peer, _ = listener.accept()  # opened outside: not noted
    try:
        assert {fd for fd, _ in noted} == {mine.fileno(), own_listener.fileno()}
        assert shut(noted) == 1  # the connection, not the listener
        peer.settimeout(10)
        assert peer.recv(1) == b""  # the end of the stream at once, not a timeout
        own_listener.settimeout(0.1)  # still listening
        probe = socket.create_connection(own_listener.getsockname(), timeout=10)
        probe.close()
    finally:
        for s in (mine, own_listener, peer, listener):
            s.close()


def test_a_socket_closed_since_is_left_alone_even_where_its_number_is_reused():
    listener = socket.create_server(("127.0.0.1", 0))
    noted: set[tuple[int, int]] = set()
    with opened(noted):
        gone = socket.create_connection(listener.getsockname(), timeout=10)
    peer_of_gone, _ = listener.accept()
    fd = gone.fileno()
    gone.close()
    other = socket.create_connection(listener.getsockname(), timeout=10)  # may take fd
    peer, _ = listener.accept()
    try:
        assert {n for n, _ in noted} == {fd}
        assert shut(noted) == 0
        other.sendall(b"x")
        peer.settimeout(10)
        assert peer.recv(1) == b"x"  # still connected
    finally:
        for s in (other, peer, peer_of_gone, listener):
            s.close()


def test_the_rendezvous_connections_are_not_noted():
    """The CURVE rendezvous's requests are not all safe to send twice: a connection to
    its port (a trainer reconnecting) or from it (trainer 0 serving) is never shut."""
    from graphrun.train.sockets import port_of

    rendezvous = socket.create_server(("127.0.0.1", 0))
    gloo = socket.create_server(("127.0.0.1", 0))
    port = rendezvous.getsockname()[1]
    assert port_of(f"127.0.0.1:{port}") == port and port_of("file:///tmp/x:1") is None
    noted: set[tuple[int, int]] = set()
    with opened(noted, port):
        client = socket.create_connection(rendezvous.getsockname(), timeout=10)
        served, _ = rendezvous.accept()
        pair = socket.create_connection(gloo.getsockname(), timeout=10)
    try:
        assert {fd for fd, _ in noted} == {pair.fileno()}
    finally:
        for s in (client, served, pair, rendezvous, gloo):
            s.close()
