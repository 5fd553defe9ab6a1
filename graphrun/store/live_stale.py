"""Base rows a compaction overwrote, so that a co-located client reads the others from
shared memory (issue 42).

A compaction does not rewrite the base feature tensors in shared memory: a folded
update of a base row is served from the growth (one row per id), and written into the
files on disk (:mod:`graphrun.store.compact`). Every other base row is in shared memory
as the graph has it at every version the server still serves. The main server keeps,
per graph feature, the sorted local rows that the compactions of *this process* folded
an update into (:class:`Stale`): its shared memory was filled before them. A server
started from a compacted directory loads the updated files, so it starts with none.

**The stamp.** A compacted server's ``deletions[LIVE_COUNTER]`` is ``-stamp`` (an older
server's is always -1, and a co-located client of an older version reads every row by
request while it is negative). The stamp starts at 1 and grows by one at each swap, in
the loop, before the counter is published (:func:`note_fold`); the rows only grow. A
client asks ``live_stale`` (``name`` -> ``{"stamp", "floor"}`` and the rows) when the counter is
a stamp it has no rows for, and reads shared memory only while the counter still equals
the stamp of the rows it holds (read before and after the rows counter, a seqlock:
:func:`graphrun.store.live_client.shm_rows`). When in doubt it asks for every row: an
older server (the op is unknown), an error, a stamp that moved, a server that stopped
(the counter is :data:`GONE`) or whose process is gone (a pidfd, as for a replicated
primary) — a server started again has new segments the client never mapped — and a
read below the floor (the version folded last: the server refuses it, and so the
client must ask).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from graphrun.names import TensorKey
from graphrun.store.live_check import Schema
from graphrun.store.registry import Registry, Request, Response
from graphrun.store.state import ServerState

KEY = "live_stale"
LIVE_COUNTER = 2  # graphrun.store.live_ops.LIVE_COUNTER
GONE = -(1 << 62)  # the counter of a server that stopped: no stamp ever matches it
_NONE = np.empty(0, np.int64)


@dataclass
class Stale:
    """This process's compactions: the stamp and the base rows they overwrote."""

    stamp: int = 1
    floor: int = 0  # the version folded last: a read below it is refused (by the server)
    rows: dict[str, np.ndarray] = field(default_factory=dict)  # feature -> sorted local rows


def of(state: ServerState) -> Stale:
    got = state.extension_data.get(KEY)
    if not isinstance(got, Stale):
        got = state.extension_data[KEY] = Stale()
    return got


def counter(state: ServerState) -> int:
    """What a compacted server publishes in ``deletions[LIVE_COUNTER]``."""
    return -of(state).stamp


def note_fold(
    state: ServerState, schema: Schema, rows: Mapping[str, tuple[np.ndarray, Any]], floor: int
) -> None:
    """A fold's updated base rows (``rows``: feature -> (ids, values), as
    :func:`graphrun.store.compact.write_dir` writes them into the files), before it is
    swapped in and published. A tensor the schema has no feature of is read from the
    base by the server too (``live_ops.pull_at``)."""
    s = of(state)
    for name, (ids, _) in rows.items():
        key, spec = TensorKey.parse(name), schema.features.get(name)
        if key is None or spec is None:
            continue
        lo = spec.lo
        first = schema.num_nodes if key.kind == "node" else schema.num_edges
        ids = np.asarray(ids, np.int64)
        local = ids[ids < first] - lo
        if len(local):
            s.rows[name] = np.union1d(s.rows.get(name, _NONE), local)
    s.stamp, s.floor = s.stamp + 1, floor


def stopped(state: ServerState) -> None:
    """The server stops: a co-located client of it asks for every row from now on."""
    if state.deletions is not None and len(state.deletions) > LIVE_COUNTER:
        state.deletions[LIVE_COUNTER] = GONE


class StaleBody(msgspec.Struct, frozen=True):
    name: str


def live_stale(state: ServerState, req: Request) -> Response:
    """``name`` -> ``{"stamp", "floor"}`` and the local base rows of the feature that this
    process's compactions overwrote (sorted int64)."""
    s = of(state)
    rows = s.rows.get(req.args(StaleBody).name, _NONE)
    return Response({"stamp": s.stamp, "floor": s.floor}, (rows,))


def register(registry: Registry) -> None:
    registry.add("live_stale", live_stale, needs_session=False)
