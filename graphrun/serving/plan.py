"""What an incremental refresh recomputes: the sets ``A_1 .. A_L`` and the edges behind.

:func:`affected` asks each partition what changed since the kept states' version
(:mod:`graphrun.sampling.changes`) and then, layer by layer, the out-neighbours of the
frontier (the module docstring of :mod:`graphrun.serving.refresh` says why). Where the
states move by their sums the last step asks every edge leaving ``A_{L-1}``, and that
answer is needed only by the last layer: :func:`affected` sends those requests and
returns, the refresh says the version it moves to and computes the layers before the
last meanwhile, and :meth:`Plan.finish` takes the answers (after 1,000 new edges on the
200k-node power-law graph, 45k edges: the servers' lookup and the reply's way back
overlap the first layer instead of coming before it; benchmarks/README.md, issue 43).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from graphrun.errors import GraphrunError
from graphrun.partition.arrays import unique_sorted
from graphrun.sampling.changes import OP_CHANGES, OP_OUT_NEIGHBORS

EDGE_IDS = 1 << 16  # ids of one request for their out-edges (MAX_OUT_EDGES a reply)
EMPTY = np.empty(0, np.int64)
DENSE = 16  # a table of marks or positions at most this many times the ids (union, _pos)
Edges = Callable[[], np.ndarray]  # the answers of requests sent: (src, dst) int64


class Kept(Protocol):
    """The stored states as :func:`affected` reads them (``refresh.States``): the base
    nodes' count and the new nodes that have rows."""

    n: int
    grown: np.ndarray


@dataclass
class Plan:
    """What a refresh recomputes (module docstring): ``sets`` ``A_1 .. A_L`` (sorted);
    ``new`` the nodes added since the stored version (no stored rows). Where the states
    move by their sums (``refresh.by_sums``): ``changed`` (src, dst, sign) of the edges
    that changed, ``touched`` the nodes whose first-layer sums are recomputed (downstream
    of an updated or new feature, and the new nodes), ``edges`` (src, dst) of the edges
    leaving ``A_{L-1}`` at the new version; ``to`` the new version (the sums' stamp).
    ``later``: those edges asked and not taken yet (then ``sets`` ends at ``A_{L-1}``
    until :meth:`finish`)."""

    sets: list[np.ndarray]
    new: np.ndarray
    changed: np.ndarray | None = None
    touched: np.ndarray = field(default_factory=lambda: EMPTY)
    edges: np.ndarray | None = None
    to: int = 0
    later: Edges | None = None

    def finish(self) -> None:
        """Take the edges leaving ``A_{L-1}`` and add ``A_L`` (once; then nothing)."""
        if self.later is None:
            return
        got, self.later = self.later(), None
        self.edges = got
        self.sets.append(union([self.sets[-1], got[1]]))

    def drop(self) -> None:
        """Take the answers still owed and forget them (a refresh that failed first)."""
        with contextlib.suppress(GraphrunError):
            self.finish()


def ask(client: Any, op: str, body: dict[str, Any], tensors: tuple[np.ndarray, ...] = ()
        ) -> list[list[np.ndarray]]:  # fmt: skip
    """``op`` on every partition at once; each one's tensors (int64)."""
    return sending(client, op, body, tensors)()


def sending(client: Any, op: str, body: dict[str, Any], tensors: tuple[np.ndarray, ...] = ()
            ) -> Callable[[], list[list[np.ndarray]]]:  # fmt: skip
    """:func:`ask`, sent now: a callable that waits for the answers (every one before an
    error is raised)."""
    s = client.session
    pending = [s.request(p, op, body, tensors) for p in range(client.book.num_parts)]

    def answers() -> list[list[np.ndarray]]:
        return [[np.asarray(t, np.int64) for t in m.tensors] for m in s.wait_all(pending)]

    return answers


def union(arrays: list[np.ndarray]) -> np.ndarray:
    """The sorted distinct ids of ``arrays``: marked in a table where the largest is
    below :data:`DENSE` times their number (``A_L`` from 45k edges' destinations on a
    200k-node graph: 0.15 ms against 1.6 for a sort), else sorted."""
    a = np.concatenate([EMPTY, *arrays])
    if not len(a) or int(a.max()) >= DENSE * len(a) or int(a.min()) < 0:
        return unique_sorted(a)
    seen = np.zeros(int(a.max()) + 1, np.bool_)
    seen[a] = True
    return np.flatnonzero(seen)


def out_edges(client: Any, ids: np.ndarray) -> Edges:
    """(src, dst) of every edge leaving ``ids`` at the client's version: the first
    requests sent now, a callable that takes their answers and asks the rest (replies
    are bounded: :data:`EDGE_IDS` ids a request)."""
    body = {"edges": True}
    first = sending(client, OP_OUT_NEIGHBORS, body, (ids[:EDGE_IDS],))

    def edges() -> np.ndarray:
        got = first()
        for lo in range(EDGE_IDS, len(ids), EDGE_IDS):
            got += ask(client, OP_OUT_NEIGHBORS, body, (ids[lo : lo + EDGE_IDS],))
        return np.hstack([np.empty((2, 0), np.int64), *(np.vstack(g[:2]) for g in got)])

    return edges


def affected(
    client: Any, since: int, layers: int, feature_key: str, had: Kept, sums: bool = False
) -> Plan:
    """What to recompute from ``since`` to the client's version (the refresh module's
    docstring); with ``sums`` the changed edges and, asked (:attr:`Plan.later`), the
    edges leaving ``A_{L-1}`` too. ``had``: the stored states, whose ``grown`` nodes
    have rows."""
    got = ask(client, OP_CHANGES, {"since": since, "features": [feature_key], "edges": sums})
    changed = union([g[0] for g in got])
    dst = union([g[1] for g in got])
    new = changed[changed >= had.n]
    new = new[~np.isin(new, had.grown)]
    edits = np.hstack([np.empty((3, 0), np.int64), *(np.vstack(g[2:5]) for g in got if sums)])
    sets, asked, current = [], EMPTY, changed
    touched = EMPTY
    for i in range(layers - 1 if sums else layers):  # sums: A_L from the edges asked
        frontier = np.setdiff1d(current, asked, assume_unique=True)
        out = EMPTY if not len(frontier) else union(
            [g[0] for g in ask(client, OP_OUT_NEIGHBORS, {}, (frontier,))])  # fmt: skip
        if i == 0 and sums:  # downstream of A_0: the first layer's sums are recomputed
            touched = union([out, new, edits[1, np.isin(edits[0], changed)]])
        asked = current
        current = union([current, out] + ([dst] if i == 0 else []))
        sets.append(current)
    if not sums:
        return Plan(sets, new)
    # every edge leaving A_{L-1}, not only the frontier's
    return Plan(sets, new, edits, touched, later=out_edges(client, current))
