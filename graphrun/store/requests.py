"""The bodies of the store's requests, declared once (msgspec ``Struct``).

A handler reads its request's body as one of these (:meth:`Request.args
<graphrun.store.registry.Request.args>`): every field is checked at once, against its
type and its bounds, and a body that is not one is refused with one
:class:`~graphrun.errors.ArgumentError` line naming the operation and the field::

    push: reducer: Expected `str`, got `int`

Fields the envelope carries for every operation (``s``, ``job``, the write id ``w``)
are not repeated here: the server reads them before the handler runs, and a body's
other keys are ignored.
"""

from __future__ import annotations

from typing import Any

import msgspec

MAX_ROW_DIMS = 6  # a tensor row has at most this many dimensions
MAX_PUSH_TABLES = 24  # tensors of one push_tables (two frames each: within Limits.max_frames)


class Named(msgspec.Struct, frozen=True):
    """``pull``, ``meta``, ``attach``, ``delete``: the job's tensor ``name``."""

    name: str


class JoinBody(msgspec.Struct, frozen=True):
    client: str = ""  # what the client calls itself in the server's log


class HeartbeatBody(msgspec.Struct, frozen=True):
    v: int | None = msgspec.field(default=None)  # the live version the session reads at

    def __post_init__(self) -> None:
        if self.v is not None and self.v < 0:
            raise ValueError("v: a version is >= 0")


class PushBody(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    reducer: str = "assign"
    states: list[str] = msgspec.field(default_factory=list)  # an optimizer's state tensors
    params: dict[str, Any] = msgspec.field(default_factory=dict)  # the reducer's
    allow_graph: bool = False  # the admin key writes the graph's own tensors


class PushTablesBody(msgspec.Struct, frozen=True):
    """``push_tables``: the job's tensors ``names``, the ``i``-th one's rows and values in
    tensors ``2i`` and ``2i + 1`` (``assign``)."""

    names: list[str]

    def __post_init__(self) -> None:
        if not 0 < len(self.names) <= MAX_PUSH_TABLES:
            raise ValueError(f"names: 1 to {MAX_PUSH_TABLES} tensors, got {len(self.names)}")


class PullTablesBody(PushTablesBody, frozen=True):
    """``pull_tables``: the job's tensors ``names`` (one partition policy), each read at
    the rows of tensor 0."""


class InitBody(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    policy: str
    dtype: str = "float32"
    row_shape: list[int] = msgspec.field(default_factory=list)
    init: str = "zeros"
    init_args: dict[str, Any] = msgspec.field(default_factory=dict)
    persistent: bool = False
    exist_ok: bool = False

    def __post_init__(self) -> None:
        if len(self.row_shape) > MAX_ROW_DIMS or any(x < 0 for x in self.row_shape):
            raise ValueError(f"row_shape: {self.row_shape!r} is not a short list of sizes >= 0")


class ReduceBody(msgspec.Struct, frozen=True):
    name: str
    how: str


class BackupBody(msgspec.Struct, frozen=True, kw_only=True):
    """``register_backup`` (a backup server on the main server's machine) and
    ``register_replica`` (a replica with its primary): who, and whether it leaves."""

    address: str
    remove: bool = False
    pid: int = 0
    start: int = 0  # the process's start time: a reused pid is told apart
    replica: int = 0  # register_replica: the replica's index (0: not given)


class ReplicateBody(msgspec.Struct, frozen=True, kw_only=True):
    """A write a primary forwards to its replica: the client's request as it came."""

    op: str
    body: dict[str, Any]
    job: str
    session: str = ""
    admin: bool
