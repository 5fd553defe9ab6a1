"""Requests that name the live graph's new nodes (ids at or above the base ``num_nodes``).

A new node's id is a growth id (:mod:`graphrun.store.live`): ``>=`` the base's node count,
from growth blocks handed out per partition, so the ids of a live graph are not
``0 .. nodes-1``. An endpoint that follows a live graph (``--follow``) checks a request's
ids against :func:`graphrun.distributed.live.id_bound` (the base and every growth block)
when it parses it, then :class:`NewNodes` checks each growth id against the new nodes at
the engine's version before anything is sampled: an id that is no node there is that
request's HTTP 400, never a failed forward (a store asked to sample a node it does not
have says so, and the engine would take that for the store going away).

``mode: precomputed`` reads a new node's rows from the kept states' ``grown/`` tables
(:class:`graphrun.serving.refresh.States`), written by ``graphrun infer embed --live``
and ``--refresh``; a node they do not hold yet (added since) is that request's 400.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphrun.errors import BadRequest, StoreError
from graphrun.serving.embed import TABLES
from graphrun.serving.protocol import Query
from graphrun.serving.refresh import States


class NewNodes:
    """The new nodes at the client's version, asked of the store (``live_nodes``) once a
    version, when a request names one."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.base = int(client.book.num_nodes)
        self.version: int | None = None
        self.ids = np.empty(0, np.int64)

    def check_query(self, q: Query) -> None:
        """BadRequest if ``q`` names a new node (or in-neighbour) that is none now."""
        if q.ids is not None:
            self.check("node_ids", q.ids)
        elif q.neighbors is not None:
            self.check("neighbors", q.neighbors)

    def check(self, name: str, ids: np.ndarray) -> None:
        """BadRequest naming the first of ``ids`` that is no node at the client's version."""
        grow = ids[ids >= self.base]
        if not len(grow):
            return
        v = self.client.version
        if v is None:  # the base graph (not following): the parse's bound held them
            raise BadRequest(f"inputs.{name}: id {int(grow[0])} is not a node "
                             f"(the graph has {self.base})")  # fmt: skip
        if v != self.version:
            self.ids, self.version = self.client.live_nodes()[0], v
        found = np.isin(grow, self.ids)
        if not found.all():
            raise BadRequest(f"inputs.{name}: id {int(grow[~found][0])} is not a node of "
                             f"the live graph at version {v}")  # fmt: skip


def stored(client: Any, ntype: str, ids: np.ndarray) -> dict[str, np.ndarray]:
    """The kept states' rows of ``ids`` (some new nodes among them): ``TABLES``' rows."""
    st = States(client, ntype)
    try:
        st.load()
    except StoreError as exc:
        raise BadRequest(
            "parameters.mode: new nodes' precomputed rows are kept by "
            "`graphrun infer embed --live`: the store holds none"
        ) from exc
    grow = ids[ids >= st.n]
    missing = grow[~np.isin(grow, st.grown)]
    if len(missing):
        raise BadRequest(f"inputs.node_ids: node {int(missing[0])} has no precomputed rows "
                         "yet (`graphrun infer embed --refresh` computes them)")  # fmt: skip
    return {what: st.read(what, ids).numpy() for what in TABLES}
