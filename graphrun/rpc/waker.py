"""Waking a server's loop from another thread (:class:`Waker`)."""

from __future__ import annotations

import contextlib
import os


class Waker:
    """Wakes a server waiting for requests, from any thread: ``wake()`` after setting what
    its ``should_stop`` reads, and :meth:`RpcServer.serve_forever` returns at once instead
    of at the end of its tick (a pipe the server polls beside its socket)."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def fileno(self) -> int:
        return self._r

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: already awake; closed
            os.write(self._w, b"!")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._r, 4096):
                pass

    def close(self) -> None:
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
