"""Rows of several tensors of one id space: one ``pull_tables`` request an owner.

The endpoint's ``precomputed`` answers read the same ids of three tables (embeddings,
logits, predictions) each micro-batch: as ``pull`` requests, three CURVE-encrypted round
trips an owner partition, each routed, sent, decoded and waited for on its own. One
``pull_tables`` request carries the rows once and brings every table's values back in
one reply (store/handlers.py). Partitions in this host's shared memory, and a client
following a live graph (growth ids, routed by the graph's blocks), read each table with
:meth:`KVClient.pull`: no round trip to save there, or the live path's routing to keep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphrun.errors import ArgumentError, ProtocolError
from graphrun.store import routing
from graphrun.store.client import KVClient
from graphrun.store.dist_tensor import to_numpy_ids
from graphrun.store.policy import lookup_policy
from graphrun.store.requests import MAX_PUSH_TABLES


def pull_tables(client: KVClient, names: Sequence[str], ids: Any) -> list[np.ndarray]:
    """Rows ``ids`` of each tensor ``names`` (one partition policy), in the order of
    ``ids``: as many ``pull``\\ s would give, in one request an owner (pieces of about
    ``pull_chunk_bytes`` of answer, as a pull's)."""
    if not 0 < len(names) <= MAX_PUSH_TABLES:
        raise ArgumentError(f"names: 1 to {MAX_PUSH_TABLES} tensors, got {len(names)}")
    infos = [client.meta(n) for n in names]
    if len({ti.policy for ti in infos}) != 1:
        seen = ", ".join(f"{ti.name}: {ti.policy}" for ti in infos)
        raise ArgumentError(f"names: tensors of one partition policy, got {seen}")
    pol = lookup_policy(client.policies, infos[0].policy)
    ids = pol.check_ids(to_numpy_ids(ids))
    groups = routing.by_owner(pol.ranges, ids)
    if client.live is not None or any(client.session.local_ok(g.part) for g in groups):
        return [client.pull(n, ids) for n in names]
    row_bytes = sum(ti.row_bytes for ti in infos)
    pieces = [p for g in groups for p in client.pull_pieces(row_bytes, g)]
    body = {"names": list(names)}
    sent = [(g, client.session.request(g.part, "pull_tables", body, (g.rows,))) for g in pieces]
    whole = len(sent) == 1 and isinstance(sent[0][0].pos, slice)
    out = [] if whole else [np.empty((len(ids), *ti.row_shape), ti.dtype) for ti in infos]
    for g, pending in sent:
        got = client.session.wait(pending).tensors
        if len(got) != len(infos):
            raise ProtocolError(f"pull_tables: {len(got)} tensors for {len(infos)} names")
        for k, (ti, rows) in enumerate(zip(infos, got, strict=True)):
            if rows.dtype != ti.dtype or rows.shape != (len(g.ids), *ti.row_shape):
                raise ProtocolError(
                    f"pull_tables {ti.name!r}: {rows.dtype} {rows.shape} from partition "
                    f"{g.part}, expected {ti.dtype} {(len(g.ids), *ti.row_shape)}"
                )
            if whole:  # one owner, one piece: the frames as they are
                out.append(rows)
            else:
                routing.put_into(out[k], g.pos, rows)
    return out
