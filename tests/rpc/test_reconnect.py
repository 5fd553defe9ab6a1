"""A client whose server went away and came back on the same address: the loss fails the
requests that were in flight then (each may or may not have been applied), not the
first one sent once the client is connected again (issue 42: that one failed
"connection lost" though the restarted server answered it). Real sockets."""

from __future__ import annotations

import time

import psutil
import pytest

from graphrun.errors import RpcError, RpcTimeout
from graphrun.rpc import Message, MsgKind, RpcClient, new_keypair
from graphrun.testing.threads import ServerThread


def handler(peer, msg):
    """``silent``: no answer; ``slow``: answered after 0.2 s (a request's loss, read at
    its wait, then comes before its answer, whatever the threads' turns)."""
    if msg.op == "silent":
        return None
    if msg.op == "slow":
        time.sleep(0.2)
    return Message(MsgKind.REPLY, msg.op, msg.request_id, msg.body)


@pytest.fixture
def keys():
    return new_keypair()


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def wait_reconnected(port: int, timeout: float = 10.0) -> None:
    """Wait until this process holds an established TCP connection to ``port`` (the
    client's, made again by libzmq in the background), and a moment for libzmq's
    event of it: the client itself is not asked (asking would read its events)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        conns = psutil.Process().net_connections(kind="tcp")
        if any(c.raddr and c.raddr.port == port and c.status == "ESTABLISHED" for c in conns):
            time.sleep(0.2)
            return
        time.sleep(0.05)
    raise AssertionError(f"the client did not connect to port {port} again")


def test_the_first_request_after_the_server_restarted_is_answered(keys):
    """Stopped and started again on its port: the request in flight through the stop
    fails ("connection lost": its fate is unknown), the next one is answered."""
    s = ServerThread("tcp://127.0.0.1:0", handler, keys=keys).start()
    address = s.address
    try:
        with RpcClient(address, keys=keys, timeout=5) as c:
            assert c.call("echo", {"a": 1}).body == {"a": 1}
            before = c.send("silent")  # in flight when the server stops
            s.stop()
            s = ServerThread(address, handler, keys=keys).start()
            wait_reconnected(port_of(address))
            assert c.call("slow", {"a": 2}).body == {"a": 2}
            with pytest.raises(RpcError, match="connection lost"):
                c.wait(before)
            assert c.call("echo", {"a": 3}).body == {"a": 3}
    finally:
        s.stop()


def test_an_idle_client_restarted_twice_is_answered_each_time(keys):
    """No request in flight when the server goes (the loss tells no request)."""
    s = ServerThread("tcp://127.0.0.1:0", handler, keys=keys).start()
    address = s.address
    try:
        with RpcClient(address, keys=keys, timeout=5) as c:
            for k in range(3):
                assert c.call("slow", {"k": k}).body == {"k": k}
                s.stop()
                s = ServerThread(address, handler, keys=keys).start()
                wait_reconnected(port_of(address))
    finally:
        s.stop()


def test_a_server_lost_and_not_back_fails_the_next_request_at_once(keys):
    """What the session's failover relies on: the loss, not yet told to any request,
    fails the next one as "connection lost" (not a timeout), and the request is not
    left in flight."""
    s = ServerThread("tcp://127.0.0.1:0", handler, keys=keys).start()
    with RpcClient(s.address, keys=keys, timeout=30) as c:
        assert c.call("echo").body == {}
        s.stop()
        time.sleep(0.3)  # the client's event of the loss
        with pytest.raises(RpcError, match="connection lost") as got:
            c.call("echo")
        assert not isinstance(got.value, RpcTimeout)
        assert c.in_flight == 0
