"""ZeroMQ addresses: checked before a socket binds or connects to them (libzmq takes
some malformed ones silently: a TCP port modulo 65536), and a bind's or connect's
failure named as the caller's mistake or the network's."""

from __future__ import annotations

import zmq

from graphrun.errors import ArgumentError, GraphrunError, RpcError


def check_address(address: str) -> None:
    """ArgumentError for an address no socket could bind or connect: not a ZeroMQ address
    (``tcp://``, ``ipc://``, ``inproc://``), or a TCP port out of range."""
    scheme, sep, rest = address.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest:
        raise ArgumentError(f"address: {address!r} is not a valid ZeroMQ address (tcp://HOST:PORT)")
    if scheme == "tcp" and ":" not in rest:
        raise ArgumentError(f"address: {address!r} has no port (tcp://HOST:PORT)")
    check_port(address)


def check_port(address: str) -> None:
    """libzmq takes a TCP port modulo 65536 (99999 bound 34463): refuse it instead."""
    if not address.startswith("tcp://") or ":" not in address[6:]:
        return
    port = address.rsplit(":", 1)[1]
    if port != "*" and not (port.isdigit() and int(port) <= 65535):
        raise ArgumentError(f"address: {address!r} has port {port!r}, not in 0..65535 or *")


def address_error(verb: str, address: str, exc: zmq.ZMQError) -> GraphrunError:
    """A malformed address is the caller's mistake; anything else (in use, ...) an RpcError."""
    if exc.errno in (zmq.EINVAL, zmq.EPROTONOSUPPORT):
        return ArgumentError(f"address: cannot {verb} to {address!r}, not a valid ZeroMQ address")
    return RpcError(f"cannot {verb} ({exc})", address=address)
