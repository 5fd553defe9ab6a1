"""A client's side of the live graph: the head, routing growth ids, reads at a version.

A client that follows a live store sets its session's ``version`` (every read request
then carries ``"v"`` and goes to the partition's main server, which holds the delta;
see :mod:`graphrun.store.live_ops`) and keeps a :class:`LiveView` from ``live_head``:
the head version and the growth blocks' owners, so that a new node's (or edge's) id is
routed to its owner and turned into its local row there
(:func:`graphrun.store.live.growth_row`). A co-located partition's shared memory is
read only while it holds nothing at or below the version (:func:`shm_ok`); its base
feature rows also after a compaction, but for those a compaction overwrote
(:func:`shm_rows`, :mod:`graphrun.store.live_stale`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from graphrun.errors import ArgumentError, AuthError, GraphrunError, ProtocolError, StoreError
from graphrun.store.live import growth_row, id_owners
from graphrun.store.live_stale import GONE
from graphrun.store.session import Session

LIVE_COUNTER = 2  # the deletions segment's slots (graphrun.store.live_ops.LIVE_COUNTER,
LIVE_ROWS_COUNTER = 3  # LIVE_ROWS_COUNTER)
_NONE = np.empty(0, bool)
FOLLOW_TRIES = 5  # heads asked again while each was compacted before it was pinned

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveView:
    """What ``live_head`` said: the head and who owns each growth block."""

    head: int
    num_nodes: int
    num_edges: int
    node_owner: np.ndarray
    edge_owner: np.ndarray


def fetch_head(session: Session) -> LiveView:
    """Ask the sequencer (partition 0's main server) for the head."""
    msg = session.call(0, "live_head", main_only=True)
    b = msg.body
    if len(msg.tensors) != 2 or not all(isinstance(b.get(k), int) for k in
                                         ("head", "num_nodes", "num_edges")):  # fmt: skip
        raise ProtocolError("live_head: the reply is not a head and two block tables")
    node_owner, edge_owner = (np.asarray(t, dtype=np.int64) for t in msg.tensors)
    return LiveView(b["head"], b["num_nodes"], b["num_edges"], node_owner, edge_owner)


def follow_head(session: Session, num_parts: int, version: int | None) -> LiveView:
    """Set ``session.version`` to ``version`` (None: the head, asked now) and return the
    head's view. A session's first version is made known to every partition (its pin,
    :func:`_pin`); a head that a compaction folded past before that (one begun between
    the head's answer and the pin) is asked again."""
    for _ in range(FOLLOW_TRIES):
        view = fetch_head(session)
        v = view.head if version is None else int(version)
        if not 0 <= v <= view.head:
            raise ArgumentError(f"version: {v} is not in [0, head {view.head}]")
        first, session.version = session.version is None, v
        floor = _pin(session, num_parts) if first else 0
        if floor <= v:
            return view
        session.version = None  # not following yet
        if version is not None:
            raise StoreError(f"version: {v} was compacted into the base at {floor}; "
                             "follow a newer version")  # fmt: skip
        # folded before it was pinned: the head again
    raise StoreError(f"follow: the head was compacted before the servers heard it, "
                     f"{FOLLOW_TRIES} times")  # fmt: skip


def _pin(session: Session, num_parts: int) -> int:
    """A heartbeat to every partition: the servers learn the session's version (its pin:
    no compaction folds past it) before its first read. Returns the highest version a
    partition's base was compacted at."""
    floor = 0
    for p in range(num_parts):
        try:
            floor = max(floor, int(session.call(p, "heartbeat").body.get("floor", 0)))
        except GraphrunError as exc:  # its reads will tell it
            log.info("follow: partition %d did not hear the version: %s", p, exc)
    return floor


def route(
    view: LiveView, ranges: np.ndarray, first: int, owner: np.ndarray, ids: object, arg: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, owner part, local row)`` of ids of one id space: base ids below
    ``ranges[-1]``, growth ids from ``first`` (owned per ``owner``'s blocks)."""
    a = np.asarray(ids)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise ArgumentError(f"{arg}: expected a 1-d array of integer ids, got {a.dtype} {a.shape}")
    a = a.astype(np.int64, copy=False)
    part = id_owners(a, ranges, first, owner)
    base, grow = (a >= 0) & (a < ranges[-1]), a >= first
    if (part < 0).any():
        i = int(np.flatnonzero(part < 0)[0])
        raise ArgumentError(f"{arg}[{i}] = {int(a[i])} is not an id of the graph "
                            f"(at head {view.head})")  # fmt: skip
    rows = np.empty(len(a), np.int64)
    rows[base] = a[base] - ranges[part[base]]
    part_rows = np.diff(ranges)
    rows[grow] = growth_row(a[grow], first, part_rows[part[grow]])
    return a, part, rows


def shm_ok(session: Session, part: int, version: int | None, rows: bool = False) -> bool:
    """Whether a co-located partition's shared memory is the graph at ``version`` (None:
    the base): it holds no live piece at or below it (the server's counter); with
    ``rows``, whether its base rows are (no piece at or below it overwrites rows: new
    nodes and edges do not). Never once it was compacted (-1: the segments mapped at join
    may be an older base than the server's), whichever counter is asked."""
    counter = session.part(part).revocations
    if counter is None or len(counter) <= LIVE_COUNTER:
        return True
    if int(counter[LIVE_COUNTER]) < 0:
        return False
    if version is None:
        return True
    slot = LIVE_ROWS_COUNTER if rows and len(counter) > LIVE_ROWS_COUNTER else LIVE_COUNTER
    lowest = int(counter[slot])
    return lowest == 0 or lowest > version


def shm_rows(session: Session, part: int, name: str, version: int | None) -> np.ndarray | None:
    """Which local base rows of feature ``name`` a co-located partition's shared memory
    does not hold as the graph has them at ``version`` (a mask by local row, as long as
    the highest one; empty: none), or None: read every row by request. Before a
    compaction: :func:`shm_ok`'s rows counter. After one (the counter is ``-stamp``,
    :mod:`graphrun.store.live_stale`): the rows the server's compactions overwrote,
    asked once per stamp, and only while the stamp read before and after the rows
    counter is theirs, the server's process is the one that
    filled the memory mapped at join, ``version`` is not below the version folded last
    (a read the server refuses), and no unfolded piece at or below it overwrites base
    rows."""
    e = session.part(part)
    counter = e.revocations
    if counter is None or len(counter) <= LIVE_COUNTER:
        return _NONE
    stamp = int(counter[LIVE_COUNTER])
    if stamp >= 0:
        return _NONE if shm_ok(session, part, version, rows=True) else None
    if stamp == GONE or len(counter) <= LIVE_ROWS_COUNTER:
        return None
    if e.owner is None or not e.owner.watching() or e.owner.gone():
        return None  # a server started again has segments this session never mapped
    got = e.stale.get(name)
    if got is None or got[0] != -stamp:
        got = e.stale[name] = _ask_stale(session, part, name, -stamp)
    lowest = int(counter[LIVE_ROWS_COUNTER])
    if int(counter[LIVE_COUNTER]) != -got[0]:
        return None  # compacted again while it read (or an answer newer than the counter)
    if version is not None and (0 < lowest <= version or version < got[1]):
        return None  # updates held at or below it, or a version compacted (refused)
    return got[2]


def _ask_stale(
    session: Session, part: int, name: str, stamp: int
) -> tuple[int, int, np.ndarray | None]:
    """``(stamp, floor, mask of the rows)`` of ``live_stale``; ``(stamp seen, 0, None)``
    from a server that does not say (an older one: the op is unknown), so that it is not asked again
    until the counter moves."""
    try:
        m = session.call(part, "live_stale", {"name": name}, main_only=True)
    except AuthError:
        raise
    except GraphrunError as exc:
        log.info("live_stale of partition %d: %s; its rows are read by request", part, exc)
        return stamp, 0, None
    got, floor = m.body.get("stamp"), m.body.get("floor")
    if not isinstance(got, int) or not isinstance(floor, int) or len(m.tensors) != 1:
        raise ProtocolError("live_stale: the reply is not a stamp, a floor and rows")
    rows = np.asarray(m.tensors[0], np.int64).reshape(-1)
    mask = np.zeros(int(rows.max()) + 1 if len(rows) else 0, bool)
    mask[rows] = True  # a gather per pull instead of a search (benchmarks/README.md, colo62)
    return got, floor, mask


def fresh(rows: np.ndarray, stale: np.ndarray) -> np.ndarray:
    """Which of ``rows`` (local rows, >= 0) ``stale`` (:func:`shm_rows`' mask) leaves."""
    out = np.ones(len(rows), bool)
    if len(stale):
        inside = rows < len(stale)
        out[inside] = ~stale[rows[inside]]
    return out
