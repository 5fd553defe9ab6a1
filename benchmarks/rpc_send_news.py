"""What a client pays before each request since rpc65 (stop 65): ``RpcClient._news``,
the connection's events read before a send (a lost connection's news fails the requests
sent before, not the next one once connected again), and ``RpcClient.take_in``, which a
session's request adds (a connection lost since it joined is given up). Thread CPU a
call on an idle connected CURVE client, best of 5 rounds; then one ``echo`` call's
client CPU (its server in a thread of the same process: noisy, for scale).

    PYTHONPATH=. python benchmarks/rpc_send_news.py

Prints JSON; on an old tree the methods it lacks are left out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from graphrun.rpc import Message, MsgKind, RpcClient, new_keypair
from graphrun.testing.threads import ServerThread

CALLS, ROUNDS = 200_000, 5


def echo(peer: bytes, msg: Message) -> Message:
    return Message(MsgKind.REPLY, msg.op, msg.request_id, msg.body)


def best_us(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time() - t0) / n)
    return round(best * 1e6, 3)


def main() -> None:
    keys = new_keypair()
    out = {}
    with (
        ServerThread("tcp://127.0.0.1:0", echo, keys=keys) as s,
        RpcClient(s.address, keys=keys) as c,
    ):
        c.call("echo")
        for name in ("_news", "take_in"):
            if hasattr(c, name):
                out[f"{name.strip('_')}_us"] = best_us(getattr(c, name), CALLS)
        out["echo_call_client_us"] = best_us(lambda: c.call("echo"), 2000)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
