import msgpack
import numpy as np
import pytest
import zmq

from graphrun.errors import ArgumentError, AuthError, ProtocolError, RpcError, RpcTimeout
from graphrun.rpc import Limits, Message, MsgKind, RpcClient, RpcServer, new_keypair
from graphrun.rpc.auth import secure_client
from graphrun.rpc.codec import PROTOCOL_VERSION, decode
from graphrun.testing.threads import ServerThread


def handler(peer, msg):
    if msg.op == "echo":
        return Message(MsgKind.REPLY, msg.op, msg.request_id, msg.body, msg.tensors)
    if msg.op == "double":
        return Message(MsgKind.REPLY, msg.op, msg.request_id, {}, (msg.tensors[0] * 2,))
    if msg.op == "silent":
        return None
    if msg.op == "bad":
        raise ArgumentError("ids[3] = 99 is out of range [0, 10)")
    if msg.op == "crash":
        raise ZeroDivisionError("boom")
    raise ArgumentError(f"unknown op {msg.op!r}")


@pytest.fixture
def keys():
    return new_keypair()


@pytest.fixture
def server(keys):
    with ServerThread("tcp://127.0.0.1:0", handler, keys=keys, limits=Limits(max_frames=8)) as s:
        yield s


@pytest.fixture
def client(server, keys):
    with RpcClient(server.address, keys=keys, timeout=5) as c:
        yield c


def raw_socket(ctx, address, keys):
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    secure_client(s, keys)
    s.connect(address)
    return s


def recv_error(sock):
    assert sock.poll(5000), "no reply from the server"
    msg = decode(sock.recv_multipart())
    assert msg.kind == MsgKind.ERROR
    return msg


def test_round_trip_with_tensors(client):
    a = np.random.default_rng(0).random((1000, 16), dtype=np.float32)
    reply = client.call("echo", {"x": [1, "two"]}, (a, np.arange(3)))
    assert reply.body == {"x": [1, "two"]}
    np.testing.assert_array_equal(reply.tensors[0], a)
    np.testing.assert_array_equal(reply.tensors[1], np.arange(3))


def test_many_requests_in_flight_answered_in_any_order(client):
    ids = [client.send("double", {}, (np.full(4, i),)) for i in range(50)]
    assert client.in_flight == 50
    for i, rid in reversed(list(enumerate(ids))):
        np.testing.assert_array_equal(client.wait(rid).tensors[0], np.full(4, 2 * i))


def test_ipv6_loopback_binds_and_answers(keys):
    """The CLI takes tcp://[::1] as loopback, but no socket had ZMQ_IPV6 set: `graphrun ps
    --insecure --address tcp://[::1]:P` failed to bind (No such device)."""
    with (
        ServerThread("tcp://[::1]:0", handler, keys=keys) as s,
        RpcClient(s.address, keys=keys, timeout=5) as c,
    ):
        assert s.address.startswith("tcp://[::1]:")
        assert c.call("echo", {"a": 1}).body == {"a": 1}


def test_inproc_transport(keys):
    # inproc needs a shared context: the test client borrows the server's
    with (
        ServerThread("inproc://rpc-test", handler) as s,
        RpcClient(s.address, context=s.server._ctx, timeout=5) as c,
    ):
        assert c.call("echo", {"a": 1}).body == {"a": 1}


def test_handler_errors_are_typed_and_server_goes_on(client):
    with pytest.raises(ArgumentError, match=r"bad to tcp://.*out of range"):
        client.call("bad")
    with pytest.raises(RpcError, match=r"crash.*internal error: ZeroDivisionError"):
        client.call("crash")
    assert client.call("echo", {"ok": True}).body == {"ok": True}


def test_timeout_names_address_and_kind(client):
    with pytest.raises(RpcTimeout, match=r"silent to tcp://127\.0\.0\.1:\d+: no answer"):
        client.call("silent", timeout=0.2)
    assert client.in_flight == 0
    assert client.call("echo").body == {}


def header(**over):
    h = {"v": PROTOCOL_VERSION, "k": 1, "op": "echo", "id": 5, "b": {}, "t": []}
    h.update(over)
    return msgpack.packb(h)


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([b"\x00\x01garbage\xff"], "not valid msgpack"),
        ([header(v=2)], "protocol version 2"),
        ([header(t=[["float32", [100]]]), b"\x00" * 12], "frame has 12 bytes"),  # truncated
        ([header(t=[["float32", [1 << 45]]]), b""], "exceeds"),  # declared oversize
        ([header(), *([b"x"] * 20)], "frames exceed"),
        ([header(k=2)], "expected a request"),
    ],
)
def test_bad_input_to_live_server(server, client, keys, frames, match):
    ctx = zmq.Context()
    sock = raw_socket(ctx, server.address, keys)
    try:
        sock.send_multipart(frames)
        err = recv_error(sock)
        assert err.body["type"] == "ProtocolError"
        assert match in err.body["message"]
    finally:
        sock.close(0)
        ctx.term()
    assert client.call("echo", {"still": "serving"}).body == {"still": "serving"}


def test_wrong_version_reply_carries_request_id(server, keys):
    ctx = zmq.Context()
    sock = raw_socket(ctx, server.address, keys)
    sock.send_multipart([header(v=0, id=42)])
    assert recv_error(sock).request_id == 42
    sock.close(0)
    ctx.term()


def test_frame_beyond_hard_limit_drops_only_that_connection(keys):
    limits = Limits(max_request_frame_bytes=1 << 12)
    with ServerThread("tcp://127.0.0.1:0", handler, keys=keys, limits=limits) as s:
        # connection dropped by MAXMSGSIZE, or a timeout
        with RpcClient(s.address, keys=keys, timeout=1) as bad, pytest.raises(RpcError):
            bad.call("echo", {}, (np.zeros(1 << 14, np.uint8),))
        with RpcClient(s.address, keys=keys, timeout=5) as good:
            assert good.call("echo", {"n": 1}).body == {"n": 1}


@pytest.mark.parametrize("give_up_if_refused", [False, True])
def test_wrong_key_is_refused_and_server_goes_on(server, client, give_up_if_refused):
    with (
        RpcClient(
            server.address, keys=new_keypair(), timeout=5, give_up_if_refused=give_up_if_refused
        ) as intruder,
        pytest.raises(AuthError, match="does not hold the job key"),
    ):
        intruder.call("echo")
    assert client.call("echo", {"x": 1}).body == {"x": 1}


def test_a_connection_reset_in_the_handshake_is_lost_not_refused():
    """A server killed while a client joined looked like a refusal of the client's key
    (an AuthError, which no client fails over on): a trainer joining a primary store
    killed at that moment failed instead of joining its replica. One reset, then the
    port refuses (the server is gone): a lost connection; every handshake reset (a server
    closing on a key it refuses) stays a refusal (test_wrong_key_is_refused...)."""
    import socket
    import struct
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def reset_one_connection_and_go() -> None:
        conn, _ = listener.accept()
        conn.recv(10)  # the client's greeting has begun
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        listener.close()  # gone: the next attempt is refused
        conn.close()  # RST

    threading.Thread(target=reset_one_connection_and_go, daemon=True).start()
    address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    with RpcClient(address, keys=new_keypair(), timeout=5, give_up_if_refused=True) as c:
        with pytest.raises(RpcError, match="refused") as got:
            c.call("echo")
        assert not isinstance(got.value, AuthError)


def test_client_without_curve_is_refused(server, client):
    with (
        RpcClient(server.address, keys=None, timeout=1) as plain,
        pytest.raises((AuthError, RpcTimeout)),
    ):
        plain.call("echo")
    assert client.call("echo").body == {}


def test_server_gone_gives_clear_error(keys):
    s = ServerThread("tcp://127.0.0.1:0", handler, keys=keys).start()
    c = RpcClient(s.address, keys=keys, timeout=2)
    assert c.call("echo").body == {}
    rid = c.send("silent")
    s.stop()
    with pytest.raises(RpcError, match=r"connection lost|no answer"):
        c.wait(rid)
    with pytest.raises(RpcTimeout, match="the connection is lost and no server accepts"):
        c.call("echo", timeout=0.3)
    c.close()


def test_bad_reply_from_server_is_protocol_error(keys):
    def liar(peer, msg):
        return Message(MsgKind.REPLY, msg.op, msg.request_id, {}, (np.zeros(3),))

    with (
        ServerThread("tcp://127.0.0.1:0", liar) as s,
        RpcClient(s.address, timeout=5, limits=Limits(max_frames=1)) as c,
        pytest.raises(ProtocolError, match="bad reply"),
    ):
        c.call("x")


def test_send_after_refused_handshake_does_not_block(server, client):
    import time

    with RpcClient(server.address, keys=new_keypair(), timeout=3) as intruder:
        time.sleep(0.5)  # the handshake fails before anything is sent
        for _ in range(2):
            with pytest.raises((AuthError, RpcTimeout)):
                intruder.call("echo")
    assert client.call("echo").body == {}


def test_no_server_at_all_times_out():
    with RpcClient("tcp://127.0.0.1:1", timeout=0.3) as c, pytest.raises(RpcTimeout):
        c.call("echo")


@pytest.mark.parametrize("address", ["garbage", "nosuch://127.0.0.1:1"])
def test_malformed_address_is_an_argument_error(address):
    with pytest.raises(ArgumentError, match="not a valid ZeroMQ address"):
        RpcServer(address, handler)
    with pytest.raises(ArgumentError, match="not a valid ZeroMQ address"):
        RpcClient(address)


def test_address_in_use_is_an_rpc_error(server):
    with pytest.raises(RpcError, match="cannot bind"):
        RpcServer(server.address, handler)


def test_the_reply_to_a_request_that_stops_the_server_arrives(keys):
    """`stop` was answered "connection lost": the disconnect was seen before the reply."""
    import threading

    for _ in range(15):
        server = RpcServer("tcp://127.0.0.1:0", handler, keys=keys)
        done = threading.Event()

        def serve(s=server, d=done):
            while not d.is_set():
                if s.poll(50):
                    d.set()  # answered one request: close at once, as `stop` does
            s.close()

        t = threading.Thread(target=serve)
        t.start()
        with RpcClient(server.address, keys=keys, timeout=5) as c:
            assert c.call("echo", {"bye": 1}).body == {"bye": 1}
        t.join(10)


@pytest.mark.timeout(60)
def test_a_wake_ends_the_wait_for_requests_at_once(keys):
    """A server waiting out a long tick stops as soon as it is woken (tests stop their
    store threads this way instead of waiting a tick each)."""
    import threading

    from graphrun.rpc.transport import Waker

    waker, stop = Waker(), threading.Event()
    srv = RpcServer("tcp://127.0.0.1:0", handler, keys=keys, waker=waker)
    t = threading.Thread(target=srv.serve_forever, args=(stop.is_set,), kwargs={"tick_ms": 600_000})
    try:
        t.start()
        with RpcClient(srv.address, keys=keys, timeout=10) as c:  # it serves while waiting
            assert c.call("echo", {"a": 1}).body == {"a": 1}
        stop.set()
        waker.wake()
        t.join(30)  # the tick is 10 minutes
        assert not t.is_alive()
    finally:
        stop.set()
        waker.wake()
        t.join(30)
        srv.close()
        waker.close()


def test_an_idle_poll_waits_out_its_timeout_without_spinning(keys, monkeypatch):
    """Idle, ``poll`` sleeps in waits of at most the guard's check each and waits
    without a timeout at most once, at its end: the last fraction of a millisecond,
    rounded down, was polled for in a loop (some 40 turns a 200 ms call on this box)."""
    srv = RpcServer("tcp://127.0.0.1:0", handler, keys=keys)
    waits: list[int] = []
    wait = srv._wait

    def counted(timeout_ms: int, *also) -> bool:
        waits.append(timeout_ms)
        return wait(timeout_ms, *also)

    monkeypatch.setattr(srv, "_wait", counted)
    try:
        for _ in range(3):
            assert srv.poll(100) == 0
    finally:
        srv.close()
    assert waits.count(0) <= 3, f"waits without a timeout: {waits.count(0)} of {waits}"
    assert max(waits) == 20


def test_a_timeout_says_whether_the_server_was_ever_reached(keys, server):
    """A join to stores already stopped timed out as "no answer ... (server down,
    overloaded or unreachable?)" whatever happened: the message says which it was."""
    import socket

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with (
        RpcClient(f"tcp://127.0.0.1:{port}", keys=keys, timeout=0.5) as c,
        pytest.raises(RpcTimeout, match=r"join to .*: no answer within 0\.5 s: never connected"),
    ):
        c.call("join")
    # the kernel accepts, nothing speaks: a stopped (SIGSTOP) or hung server
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        addr = f"tcp://127.0.0.1:{mute.getsockname()[1]}"
        with (
            RpcClient(addr, keys=keys, timeout=0.5) as c,
            pytest.raises(RpcTimeout, match="connected, but the server never completed the hand"),
        ):
            c.call("join")
    # connected and secured, no answer: the handler kept the request
    with RpcClient(server.address, keys=keys, timeout=5) as c:
        assert c.call("echo").body == {}
        with pytest.raises(RpcTimeout, match=r"no answer within 0\.3 s \(server overloaded"):
            c.call("silent", timeout=0.3)


def _free_port() -> int:
    import socket

    with socket.socket() as free:  # closed again: nothing listens on it
        free.bind(("127.0.0.1", 0))
        return int(free.getsockname()[1])


@pytest.mark.timeout(60)  # a hang detector: the calls below would wait 600 s
def test_a_refused_connect_with_somewhere_else_to_go_gives_up_at_once(keys):
    """A re-joining trainer waited 5 s for its own machine's dead primary and 3 s for a dead
    replica, one after the other, although their host refused the connects. A client
    with somewhere else to go (``give_up_if_refused``) takes the refusal as the answer."""
    addr = f"tcp://127.0.0.1:{_free_port()}"
    with RpcClient(addr, keys=keys, timeout=600, give_up_if_refused=True) as c:
        for _ in range(2):  # the refusal stands for the next request too
            with pytest.raises(RpcError, match=f"join to {addr}: connection refused") as err:
                c.call("join")
            assert type(err.value) is RpcError  # not a timeout
    # with nowhere else to go a refusal changes nothing: the timeout, "never connected"
    with (
        RpcClient(addr, keys=keys, timeout=0.5) as c,
        pytest.raises(RpcTimeout, match=r"join to .*: no answer within 0\.5 s: never connected"),
    ):
        c.call("join")


def test_a_silent_host_still_takes_the_timeout_with_somewhere_else_to_go(keys):
    """No reset, no answer (a full accept queue drops the SYNs, as a host that is off or
    cut off does): not a refusal, so the wait is the timeout as before."""
    import socket

    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        queued = []
        try:
            for _ in range(4):  # fill the accept queue (never accepted)
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                queued.append(s)
            addr = f"tcp://127.0.0.1:{port}"
            with (
                RpcClient(addr, keys=keys, timeout=0.5, give_up_if_refused=True) as c,
                pytest.raises(RpcTimeout, match=r"no answer within 0\.5 s: never connected"),
            ):
                c.call("join")
        finally:
            for s in queued:
                s.close()


@pytest.mark.timeout(60)
def test_a_client_that_got_through_stops_watching_for_refusals(keys):
    """Once the server answered, a refused reconnect is not taken as the answer: the
    watch ends (a monitor of every ~100 ms retry that nobody reads would fill up and stop
    the context's I/O thread) and a lost server is told as before."""
    srv = ServerThread("tcp://127.0.0.1:0", handler, keys=keys).start()
    try:
        c = RpcClient(srv.address, keys=keys, timeout=0.5, give_up_if_refused=True)
        assert c.call("echo", {"a": 1}).body == {"a": 1}
    finally:
        srv.stop()
    with c:
        with pytest.raises(RpcError) as err:  # lost in flight, or timed out
            c.call("echo")
        assert "refused" not in str(err.value)
        with pytest.raises(RpcTimeout, match=r"no answer within 0\.5 s: the connection is lost"):
            c.call("echo")
