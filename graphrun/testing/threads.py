"""Run an :class:`~graphrun.rpc.RpcServer` in a background thread (for tests).

    with ServerThread("tcp://127.0.0.1:0", handler, keys=keys) as srv:
        client = RpcClient(srv.address, keys=keys)

The server is real (real sockets, real codec); only the process boundary is missing.
An exception in the server loop is re-raised by ``stop()`` / on leaving the block.
"""

from __future__ import annotations

import threading
from typing import Any

from graphrun.rpc.transport import Handler, RpcServer


class ServerThread:
    def __init__(self, address: str, handler: Handler, **server_kwargs: Any) -> None:
        self.server = RpcServer(address, handler, **server_kwargs)
        self.address = self.server.address
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rpc-server", daemon=True)

    def _run(self) -> None:
        try:
            self.server.serve_forever(self._stop.is_set, tick_ms=20)
        except BaseException as exc:
            self._error = exc
        finally:
            self.server.close()

    def start(self) -> ServerThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self._error is not None:
            raise self._error

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
