"""Servers in background threads of the test process (real sockets, no process start-up).

    with ServerThread("tcp://127.0.0.1:0", handler, keys=keys) as srv:
        client = RpcClient(srv.address, keys=keys)

:class:`BackgroundLoop` is the shared part: ``_loop()`` runs in a daemon thread until
``self._stop`` is set, and an exception there is re-raised by ``stop()`` / on leaving
the block. :class:`ServerThread` runs an :class:`~graphrun.rpc.RpcServer`;
:class:`graphrun.testing.store.StoreThread` a whole store server.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Self

from graphrun.rpc.transport import Handler, RpcServer, Waker


class BackgroundLoop:
    """Run ``_loop()`` in a daemon thread; ``stop()`` sets ``_stop``, wakes the loop
    (``self.waker``, which a server polls beside its socket: no wait for its tick), joins,
    re-raises. :func:`stop_all` stops several at once (their close-downs overlap)."""

    join_timeout = 10.0

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self.waker = Waker()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _loop(self) -> None:
        raise NotImplementedError

    def _failed(self) -> None:
        """Called in the thread after ``_loop`` raised (the error is in ``_error``)."""

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:
            self._error = exc
            self._failed()

    def start(self) -> Self:
        self._thread.start()
        return self

    def signal_stop(self) -> None:
        """Tell the loop to stop; :meth:`stop` waits for it."""
        self._stop.set()
        self.waker.wake()

    def stop(self) -> None:
        self.signal_stop()
        self._thread.join(self.join_timeout)
        if not self._thread.is_alive():
            self.waker.close()
        if self._error is not None:
            raise self._error

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerThread(BackgroundLoop):
    def __init__(self, address: str, handler: Handler, **server_kwargs: Any) -> None:
        super().__init__("rpc-server")
        try:
            self.server = RpcServer(address, handler, waker=self.waker, **server_kwargs)
        except BaseException:
            self.waker.close()
            raise
        self.address = self.server.address

    def _loop(self) -> None:
        try:
            self.server.serve_forever(self._stop.is_set, tick_ms=20)
        finally:
            self.server.close()


def stop_all(loops: Sequence[BackgroundLoop]) -> None:
    """Stop ``loops`` together: all told first, then each waited for; the first error
    re-raised once all stopped."""
    for loop in loops:
        loop.signal_stop()
    errors = []
    for loop in loops:
        try:
            loop.stop()
        except BaseException as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
