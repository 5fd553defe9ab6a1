"""The socket monitor's events a client and a server watch, and what the client says of them.

libzmq tells a socket's connections' news (connected, handshake done or refused,
disconnected, a connect retried) on an inproc monitor socket, in order; the client
(:class:`~graphrun.rpc.transport.RpcClient`) reads them to fail its requests instead of
letting them hang; a server (:class:`~graphrun.rpc.transport.RpcServer`) watches the
refused handshakes to log them.
"""

from __future__ import annotations

import zmq

REFUSED_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)

FAIL_EVENTS = (
    REFUSED_EVENTS | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECTED
)

# A connect that failed at once (the host answered with a reset: nothing listens there; no
# route; a name that does not resolve): libzmq retries every ~100 ms, each time this event.
# A host that does not answer at all leaves the connect pending (CONNECT_DELAYED only).
# Watched only by a client that asked (RpcClient(give_up_if_refused=True)) and only until
# its first handshake: a monitor nobody reads fills up (2000 events) and then blocks the
# context's I/O thread, every socket of it (pyzmq 27 / libzmq 4.3.5, tried here).
RETRIED_EVENTS = FAIL_EVENTS | zmq.EVENT_CONNECT_RETRIED

REFUSED_TEXT = (
    "connection refused (no server listens at this address: the connect failed at once, "
    "a reset from its host, no route to it or a name that does not resolve)"
)
AUTH_TEXT = "handshake refused: this client does not hold the job key"
LOST_TEXT = "connection lost (server stopped or crashed?)"
