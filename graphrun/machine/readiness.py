"""Readiness of listening roles: is a store server up yet?

A store server is ready when it answers the ``stats`` request (no session needed)
over an authenticated connection — not merely when its port accepts TCP, and
without the refused-handshake noise a raw TCP probe causes on a CURVE socket.
Launch plans without a key (fake roles in tests) are checked with TCP.
(Not to be confused with ``graphrun probe``, the cluster measurement: :mod:`graphrun.measure`.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from graphrun.errors import GraphrunError
from graphrun.job.hosts import tcp_ready
from graphrun.names import Endpoint

IsReady = Callable[[Endpoint], bool]


def tcp_is_ready(endpoint: Endpoint) -> bool:
    return tcp_ready(endpoint.host, endpoint.port)


def store_is_ready(key_file: Path | None, timeout: float = 1.0) -> IsReady:
    """A check that asks a store server for its stats with the job's key."""
    if key_file is None:
        return tcp_is_ready
    from graphrun.rpc.auth import load_keys
    from graphrun.rpc.transport import RpcClient

    keys = load_keys(key_file)

    def is_ready(endpoint: Endpoint) -> bool:
        # No raw TCP pre-check: a bare TCP connect to a CURVE socket is a refused
        # handshake in the server's log. Nothing listening yet = no answer = not ready.
        client = RpcClient(f"tcp://{endpoint}", keys=keys, timeout=timeout)
        try:
            client.call("stats", {}, timeout=timeout)
            return True
        except GraphrunError:
            return False
        finally:
            client.close()

    return is_ready
