"""The last layer's running sums moved on their servers (``move_sums``).

A refresh (:mod:`graphrun.serving.refresh`) knows which ``lastsum`` rows move and by
what: the nodes of ``A_L``, the changed edges and the edges leaving ``A_{L-1}`` (each a
destination in ``A_L`` and a source), each source's projection before and after, and
the own parts of ``A_{L-1}``. :func:`send` routes that to the rows' servers
(:mod:`graphrun.store.sum_moves`): one request for each partition and table the rows
are in (the base tables, and ``grown/`` for new nodes' rows), the edges split by their
destination's request in the order they came (a row adds up its moves in the same
order as a move on the client did), with the two projections of the sources they name
(a changed edge's source goes to its destination's server alone) and of ``A_{L-1}``'s
nodes there, whose ``lastown`` rows the server writes from them. After 1,000 new
edges on the 200k-node power-law graph that is about 2 MB a refresh where the moved
rows, their logits and predictions were 15 MB of writes (benchmarks/README.md,
issue 43).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphrun.store.client import PUSH_WINDOW_BYTES, REQUEST_FRAME_BYTES
from graphrun.store.sum_moves import OP

TABLES = ("lastsum", "logits", "predictions", "lastown")
WARM_S = 300.0  # the warm-up's wait: the servers may compile the loops first (2-8 s seen)
FRAME_BYTES = REQUEST_FRAME_BYTES  # a request's tensor at most (half a frame's limit)
REQUEST_BYTES = PUSH_WINDOW_BYTES  # a request's tensors at most (half the limit)
DTYPES = ("float64", "float32", "int64", "float64")


@dataclass
class Moves:
    """What moves the ``lastsum`` rows of ``A_L`` (positions are in ``A_L``, sorted):
    ``slots`` each node's row (``States.slots``: the id, or ``n + j`` for the ``j``-th
    new node), ``fresh`` whether it has no row yet; ``src`` float32 ``[k, 2C]`` each
    source's projection before and after; ``changed`` (at, src, sign) and ``leaving``
    (at, src) the two edge lists; ``own_at`` the positions of ``A_{L-1}``, ``own`` float32
    ``[j, 2C]`` their own parts before and after, ``own_src`` their rows in ``src`` (the
    servers write their ``lastown`` rows from these)."""

    slots: np.ndarray
    fresh: np.ndarray
    src: np.ndarray
    changed: tuple[np.ndarray, np.ndarray, np.ndarray]
    leaving: tuple[np.ndarray, np.ndarray]
    own_at: np.ndarray
    own: np.ndarray
    own_src: np.ndarray


def _requests(client: Any, name: Callable[[str], str], n: int, slots: np.ndarray
              ) -> tuple[list[tuple[int, str, np.ndarray]], np.ndarray, np.ndarray]:  # fmt: skip
    """``(part, table prefix, local rows increasing)`` of each request, and each node's
    request and position in it."""
    req, place = np.empty(len(slots), np.int64), np.empty(len(slots), np.int64)
    out: list[tuple[int, str, np.ndarray]] = []
    for prefix, pick in (("", slots < n), ("grown/", slots >= n)):
        idx = np.flatnonzero(pick)
        if not len(idx):
            continue
        for g in client.route(name(prefix + TABLES[0]), slots[idx] - (n if prefix else 0)):
            mine, rows = idx[g.pos], g.rows
            if len(rows) > 1 and (np.diff(rows) <= 0).any():
                order = np.argsort(rows, kind="stable")
                mine, rows = mine[order], rows[order]
            req[mine], place[mine] = len(out), np.arange(len(rows))
            out.append((g.part, prefix, np.ascontiguousarray(rows, np.int64)))
    return out, req, place


def _fitted(t: tuple[np.ndarray, ...]) -> list[tuple[np.ndarray, ...]]:
    """One request's tensors, or (past a frame's or a request's bytes: after a large
    write) requests of contiguous halves of its rows, each with its edges, own rows and
    the sources they name; a row moves the same in either."""
    sizes = [a.nbytes for a in t]
    m = len(t[0])
    if (max(sizes) <= FRAME_BYTES and sum(sizes) <= REQUEST_BYTES) or m < 2:
        return [t]
    return [p for lo, hi in ((0, m // 2), (m // 2, m)) for p in _fitted(_rows(t, lo, hi))]


def _rows(t: tuple[np.ndarray, ...], lo: int, hi: int) -> tuple[np.ndarray, ...]:
    """The tensors of rows ``lo .. hi`` of request ``t`` (``sum_moves.TENSORS``)."""
    rows, fresh, src, ch_at, ch_src, sign, out_at, out_src, own_at, own, own_src = t
    c, o, j = ((a >= lo) & (a < hi) for a in (ch_at, out_at, own_at))
    used = np.unique(np.concatenate([ch_src[c], out_src[o], own_src[j]]))

    def named(a: np.ndarray) -> np.ndarray:
        return np.searchsorted(used, a).astype(np.int32)

    def local(a: np.ndarray) -> np.ndarray:
        return (a - lo).astype(np.int32)

    f = fresh[(fresh >= lo) & (fresh < hi)]
    return (rows[lo:hi], local(f), src[used], local(ch_at[c]), named(ch_src[c]), sign[c],
            local(out_at[o]), named(out_src[o]), local(own_at[j]), own[j],
            named(own_src[j]))  # fmt: skip


def _named(k: int, *srcs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sources of ``k`` that ``srcs`` name, increasing, and each source's position
    among them (int32; where named): a request carries the rows its edges use only."""
    used = np.zeros(k, np.bool_)
    for a in srcs:
        used[a] = True
    return np.flatnonzero(used), (np.cumsum(used) - 1).astype(np.int32)


def send(client: Any, name: Callable[[str], str], n: int, moves: Moves, version: int
         ) -> Callable[[], None]:  # fmt: skip
    """Send the moves (module docstring) to every server concerned; a callable that
    waits for them all and raises the first error (the caller's other writes go out
    meanwhile). ``name``: a table's full name (``States.name``)."""
    todo, req, place = _requests(client, name, n, moves.slots)
    ch_at, ch_src, sign = moves.changed
    out_at, out_src = moves.leaving
    ch_r, out_r, own_r = req[ch_at], req[out_at], req[moves.own_at]
    src = np.ascontiguousarray(moves.src, np.float32)
    pending = []
    for r, (part, prefix, rows) in enumerate(todo):
        c, o, j = ch_r == r, out_r == r, own_r == r
        keep, named = _named(len(src), ch_src[c], out_src[o], moves.own_src[j])
        tensors = (
            rows, place[moves.fresh & (req == r)].astype(np.int32), src[keep],
            place[ch_at[c]].astype(np.int32), named[ch_src[c]], sign[c].astype(np.int8),
            place[out_at[o]].astype(np.int32), named[out_src[o]],
            place[moves.own_at[j]].astype(np.int32),
            np.ascontiguousarray(moves.own[j], np.float32), named[moves.own_src[j]],
        )  # fmt: skip
        body = {**_names(name, prefix), "version": version}
        pending += [client.session.request(part, OP, body, t) for t in _fitted(tensors)]

    def wait() -> None:
        client.session.wait_all(pending)

    return wait


def _names(name: Callable[[str], str], prefix: str) -> dict[str, str]:
    """A request's tables (``sum_moves.MoveBody``): ``prefix`` ``grown/`` for new nodes'."""
    keys = ("sums", "logits", "predictions", "lastown")
    return {k: name(prefix + t) for k, t in zip(keys, TABLES, strict=True)}


def warm(client: Any, name: Callable[[str], str]) -> None:
    """Load the op's compiled loops on every server: a request of no rows each (what a
    refresher that stays up does before its first refresh). Its answer may take seconds:
    a server whose numba cache is empty (a fresh install) compiles them first, so it is
    waited for :data:`WARM_S`, not the client's timeout for a request."""
    c = client.meta(name(TABLES[0])).row_shape[0] - 2
    none, edges = np.empty(0, np.int32), np.empty((0, 2 * c), np.float32)
    tensors = (np.empty(0, np.int64), none, edges, none, none, np.empty(0, np.int8), none,
               none, none, edges, none)  # fmt: skip
    body = {**_names(name, ""), "version": 0}
    pending = [client.session.request(p, OP, body, tensors)
               for p in range(client.book.num_parts)]  # fmt: skip
    for p in pending:
        client.session.wait(p, WARM_S)
