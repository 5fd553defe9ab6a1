"""The request-kind registry: how to add an operation to the store server.

The server loop never changes when an operation is added. An operation is a
function ``handler(state, request) -> Response`` registered under a name::

    import msgspec
    from graphrun.store.registry import Registry, Request, Response
    from graphrun.store.state import ServerState

    class SampleBody(msgspec.Struct):              # the request's body, declared
        fanout: int

    def sample_neighbors(state: ServerState, req: Request) -> Response:
        seeds = req.tensors[0]                     # numpy views on the frames (no copy)
        fanout = req.args(SampleBody).fanout       # the body, checked at once
        indptr = state.structure["indptr"]         # the partition's CSC in shared memory
        ...
        return Response({"count": n}, (src, dst, eids))

    def register(registry: Registry) -> None:      # the extension entry point
        registry.add("sample_neighbors", sample_neighbors)

and the server is started with the extension ``"graphrun.sampling.server:register"``
(``graphrun serve ... --extension MODULE:FUNCTION``, or ``ServerConfig.extensions``);
:func:`load_extensions` imports it by name, so the store never imports the layers above it.
A client sends it through its session, ``client.session.call(part, "sample_neighbors",
body, tensors=...)``, and gets the :class:`~graphrun.rpc.codec.Message` reply;
``client.session.request`` (which returns at once) then ``client.session.wait`` keeps the
requests of several partitions in flight.

What a handler may rely on and must do:

* ``state`` is the :class:`~graphrun.store.state.ServerState` of this server process
  (partition id, book, structure, tensors via ``state.find(job, name)``, and
  ``state.extension_data`` — a dict for the extension's own caches, keyed by its name).
* ``request.job`` / ``request.session`` are the caller's job namespace and session id
  (checked: the session has joined, unless registered with ``needs_session=False``).
* The body is read as a declared type, once (:meth:`Request.args`; the store's own in
  :mod:`graphrun.store.requests`); :meth:`Request.param` checks one field at a time.
* Raise :class:`~graphrun.errors.ArgumentError` / :class:`~graphrun.errors.StoreError` for
  bad input: the client receives that error type with its message, the server logs one
  line and goes on. Any other exception is logged with its traceback and reaches the
  client as ``RemoteError`` ("internal error").
* Return tensors as numpy arrays of plain numeric dtypes; they are sent zero-copy, so do
  not modify them after returning. Never block for long: one server handles one
  request at a time (start backup servers for parallelism).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import EllipsisType
from typing import TYPE_CHECKING, Any, TypeVar, overload

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.wire import convert

if TYPE_CHECKING:
    from graphrun.store.state import ServerState

T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    """A decoded request as a handler sees it."""

    op: str
    body: Mapping[str, Any]
    tensors: tuple[np.ndarray, ...] = ()
    job: str = ""
    session: str = ""
    admin: bool = True  # the store's admin key (or no CURVE); False: a job key
    user: str | None = None  # the sender's public key (None without CURVE)
    forwarded: bool = False  # a primary's write forwarded to its replica (checked there)

    def args(self, type_: type[T]) -> T:
        """The body as ``type_`` (a msgspec ``Struct`` declaring the operation's fields),
        every field checked at once; ArgumentError naming the operation and the field."""
        return convert(type_, self.body, self.op, ArgumentError)

    @overload
    def param(self, key: str, typ: type[T], default: T | EllipsisType = ...) -> T: ...
    @overload
    def param(self, key: str, typ: tuple[type, ...], default: object = ...) -> object: ...
    def param(self, key: str, typ: type | tuple[type, ...], default: object = ...) -> object:
        """Body field ``key`` checked against ``typ`` (ArgumentError naming it if wrong)."""
        if key not in self.body:
            if default is ...:
                raise ArgumentError(f"{self.op}: field {key!r} is missing")
            return default
        val = self.body[key]
        if not isinstance(val, typ) or (isinstance(val, bool) and typ is int):
            raise ArgumentError(f"{self.op}: field {key!r} has the wrong type")
        return val

    def int_param(self, key: str, default: Any = ...) -> int:
        return int(self.param(key, int, default))

    def str_param(self, key: str, default: Any = ...) -> str:
        return str(self.param(key, str, default))

    def tensor(self, i: int, what: str) -> np.ndarray:
        if i >= len(self.tensors):
            raise ArgumentError(f"{self.op}: tensor {i} ({what}) is missing")
        return self.tensors[i]


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class AfterSync:
    """The rest of a write whose answer waits for the server's write-ahead log: the
    requests of one loop turn share one ``fdatasync`` (a group commit), then each
    ``done()`` applies what had to wait for the disk and gives the answer (it may raise
    the request's error); if the sync fails, ``failed()`` undoes what the request did and
    it is answered with the sync's error."""

    done: Callable[[], Response]
    failed: Callable[[], None] = _nothing


@dataclass(frozen=True)
class Response:
    body: Mapping[str, Any] = field(default_factory=dict)
    tensors: tuple[np.ndarray, ...] = ()
    after_sync: AfterSync | None = None  # answered after the turn's log sync (AfterSync)


Handler = Callable[["ServerState", Request], Response]


@dataclass(frozen=True)
class Entry:
    handler: Handler
    needs_session: bool = True


class Registry:
    """Operation name -> handler; one per server (``graphrun.store.server.build_registry``)."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}

    def add(
        self, op: str, handler: Handler, *, needs_session: bool = True, replace: bool = False
    ) -> None:
        """Register ``handler`` for ``op``; refuses to shadow an existing one unless ``replace``."""
        if op in self._entries and not replace:
            raise ArgumentError(f"op {op!r} is already registered")
        self._entries[op] = Entry(handler, needs_session)

    def get(self, op: str) -> Entry:
        try:
            return self._entries[op]
        except KeyError:
            raise ArgumentError(f"unknown operation {op!r}") from None

    def ops(self) -> list[str]:
        return sorted(self._entries)


def load_extensions(registry: Registry, specs: Iterable[str]) -> None:
    """Import each ``"module:function"`` and call ``function(registry)``."""
    for spec in specs:
        mod_name, _, func_name = spec.partition(":")
        if not mod_name or not func_name:
            raise ArgumentError(f"extension {spec!r}: expected 'module:function'")
        try:
            func = getattr(importlib.import_module(mod_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise ArgumentError(f"extension {spec!r}: cannot load ({exc})") from None
        func(registry)
