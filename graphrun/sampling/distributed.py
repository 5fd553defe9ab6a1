"""Distributed one-hop sampling: seeds grouped by owner, sampled where they live, merged.

:class:`DistOneHopSampler` is a :class:`~graphrun.sampling.mfg.OneHopSampler`, so
multi-layer sampling (:class:`~graphrun.sampling.sampler.NeighborSampler`) runs on
top of it unchanged. For one call:

1. owners of the seeds by the partition book (``searchsorted`` over ranges);
2. one kernel seed per partition drawn from the caller's seed, in partition
   order — so the result does not depend on which partitions are local;
3. requests to remote owners sent first (op :data:`OP`, registered in the store by
   :mod:`graphrun.sampling.server`);
4. co-located partitions sampled in this process from the store's shared memory
   (same kernels, same per-partition seed, so the same answer as the server's);
5. answers merged, ``seed_index`` mapped back to positions in the caller's seeds, the
   edges in the seeds' order.

:meth:`DistOneHopSampler.without_edge_ids` samples the same edges with every ``eid``
:data:`~graphrun.sampling.csc.NO_EDGE_ID`: no edge id is gathered here or on a server,
nor sent (a node-classification model reads none).

It talks to the store through the client's generic request API (``request``/``wait``),
its ``local_structure`` and, for edge weights, ``pull``; ids go through
:mod:`graphrun.store.routing` like the client's own pulls.
The bytes of the answers computed in this process are counted per partition in
``local_bytes`` (the client counts the remote ones in its ``traffic``).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError, ProtocolError
from graphrun.names import TensorKey
from graphrun.partition.book import PartitionBook
from graphrun.rpc.codec import Message
from graphrun.sampling.csc import (
    CSCGraph,
    SampledEdges,
    check_seeds,
    csc_from_structure,
    owned_edge_weights,
)
from graphrun.sampling.kernels import make_rng
from graphrun.sampling.server import (
    OP,
    OP_EDGE_TYPES,
    OP_FIND_EDGES,
    OP_IN_DEGREES,
    OP_OUT_DEGREES,
)
from graphrun.store import routing
from graphrun.store.client import KVClient
from graphrun.store.live_client import route as live_route
from graphrun.store.live_client import shm_ok
from graphrun.store.session import Pending, Session


def encode_request(
    seeds: np.ndarray, fanout: np.ndarray, replace: bool, weighted: bool, seed: int,
    edge_ids: bool = True,
) -> tuple[dict[str, Any], tuple[np.ndarray, ...]]:  # fmt: skip
    body: dict[str, Any] = {
        "fanout": [int(k) for k in fanout.tolist()],
        "replace": bool(replace),
        "weighted": bool(weighted),
        "seed": int(seed),
    }
    if not edge_ids:
        body["eids"] = False
    return body, (seeds.astype(np.int64, copy=False),)


def decode_reply(msg: Message, num_seeds: int, typed: bool, edge_ids: bool = True) -> SampledEdges:
    """Check an answer's shapes before trusting it (a server of another version, ...).
    Asked without edge ids, its ``eid`` may be empty (then :data:`NO_EDGE_ID` each)."""
    want = 4 if typed else 3
    if len(msg.tensors) != want:
        raise ProtocolError(f"expected {want} tensors, got {len(msg.tensors)}", kind=OP)
    n = int(msg.body.get("count", -1))
    for i, a in enumerate(msg.tensors):
        if a.ndim != 1 or (len(a) != n and not (i == 2 and not edge_ids and len(a) == 0)):
            raise ProtocolError(f"tensor {i} has shape {a.shape}, expected ({n},)", kind=OP)
    idx = np.asarray(msg.tensors[1], dtype=np.int64)
    if n and (int(idx.min()) < 0 or int(idx.max()) >= num_seeds):
        raise ProtocolError("seed_index out of range", kind=OP)
    eid = msg.tensors[2]
    return SampledEdges(
        src=np.asarray(msg.tensors[0], dtype=np.int64),
        seed_index=idx,
        eid=np.asarray(eid, dtype=np.int64) if len(eid) == n else SampledEdges.no_edge_ids(n),
        etype=np.asarray(msg.tensors[3], dtype=np.int32) if typed else None,
    )


class DistOneHopSampler:
    """One-hop sampling over every partition of a running store (see module docstring).

    ``local`` overrides the co-located partitions (partition id → CSCGraph); by
    default they are the client's ``local_parts`` read from shared memory.
    """

    def __init__(
        self,
        client: KVClient | None,
        book: PartitionBook,
        local: Mapping[int, CSCGraph] | None = None,
        weight: str | None = None,
    ) -> None:
        self.client = client
        self.book = book
        self.weight = weight
        self.typed = len(book.edge_types) > 1
        if local is None:
            local = {}
            for p in client.local_parts if client is not None else []:
                structure = client.local_structure(p) if client is not None else None
                # compacted: its shared memory is never read again (live_client.shm_ok),
                # and its CSC may hold new edges folded in, whose weights are not base rows
                compacted = client is not None and not shm_ok(client.session, p, None)
                if structure is not None and not compacted:
                    w = None if weight is None else self._pull_weights(p, structure)
                    local[p] = csc_from_structure(structure, book, p, weights=w)
        self.local = dict(local)
        self.local_bytes: Counter[int] = Counter()
        self.edge_ids = True

    def without_edge_ids(self) -> DistOneHopSampler:
        """This sampler (its partitions, client and byte counts shared) sampling the same
        edges without their ids (module docstring)."""
        other = copy.copy(self)
        other.edge_ids = False
        return other

    def _pull_weights(self, part: int, structure: Mapping[str, np.ndarray]) -> np.ndarray:
        """Edge feature ``weight`` of partition ``part``'s owned edges, in CSC order."""
        assert self.client is not None and self.weight is not None
        pull, name = self.client.pull, self.weight

        def owned_rows(key: str, lo: int, hi: int) -> np.ndarray:
            return pull(str(TensorKey.edge(key, name)), np.arange(lo, hi, dtype=np.int64))

        return owned_edge_weights(self.book, part, structure, name, owned_rows)

    def sample_one_hop(
        self,
        seeds: object,
        fanout: Any,
        *,
        replace: bool = False,
        weighted: bool = False,
        seed: int,
    ) -> SampledEdges:
        _, groups = self._groups(seeds, "seeds")
        fan = np.asarray(fanout, dtype=np.int64).reshape(-1)
        if weighted:
            self._weight_name()
        part_seeds = make_rng(seed).integers(0, 2**62, self.book.num_parts).tolist()

        def send(g: routing.Group) -> Pending:
            body, tensors = encode_request(
                g.ids, fan, replace, weighted, part_seeds[g.part], self.edge_ids
            )
            if weighted:
                body["weight"] = self._weight_name()
            return self._session(g.part).request(g.part, OP, body, tensors)

        def sample_here(g: routing.Group) -> SampledEdges:
            out = self.local[g.part].sample_one_hop(
                g.ids, fan, replace=replace, weighted=weighted, seed=part_seeds[g.part],
                edge_ids=self.edge_ids,
            )  # fmt: skip
            self.local_bytes[g.part] += out.nbytes
            return out

        answers: Iterator[tuple[routing.Group, SampledEdges | Message]]
        answers = routing.remote_first(groups, self._here, send, self._wait, sample_here)
        parts = []
        for g, got in answers:
            if not isinstance(got, SampledEdges):
                got = decode_reply(got, len(g.ids), self.typed, self.edge_ids)
            parts.append((g, got))
        parts.sort(key=lambda x: x[0].part)  # partition order, wherever it was sampled
        return merge(parts, self.typed)

    def _groups(
        self, seeds: object, arg: str, edges: bool = False
    ) -> tuple[np.ndarray, list[routing.Group]]:
        """Checked node ids (edge ids with ``edges``) grouped by owner; a client following
        a live graph routes its new ones by their growth blocks (store/live_client.py)."""
        book, view = self.book, self.client.live if self.client is not None else None
        offsets = book.edge_offsets if edges else book.node_offsets
        if view is None:
            ids = check_seeds(seeds, 0, book.num_edges if edges else book.num_nodes, arg)
            return ids, routing.by_owner(offsets, ids)
        first, owner = (
            (view.num_edges, view.edge_owner) if edges else (view.num_nodes, view.node_owner)
        )
        ids, part, _ = live_route(view, offsets, first, owner, seeds, arg)
        return ids, routing.by_part(part, ids, offsets)

    def _here(self, part: int) -> bool:
        """Whether partition ``part`` is sampled in this process: its shared memory is the
        graph at the client's version (a live partition holding a piece at or below it
        is asked instead); AuthError once the client's key is revoked (its shared memory
        is no longer read: store/session.py)."""
        if part not in self.local:
            return False
        if self.client is not None:
            self.client.session.check_revoked(part)
            return shm_ok(self.client.session, part, self.client.version)
        return True

    def _session(self, part: int) -> Session:
        if self.client is None:
            raise ProtocolError(f"partition {part} is not local and there is no store client")
        return self.client.session

    def _wait(self, pending: Any) -> Message:
        assert self.client is not None
        reply: Message = self.client.session.wait(pending)
        return reply

    def _weight_name(self) -> str:
        if self.weight is None:
            raise ArgumentError("weighted: build the sampler with weight=<edge feature name>")
        return self.weight

    # ---- structure queries (same split: local partitions in-process, others by request)

    def _by_owner(
        self, ids: np.ndarray, groups: list[routing.Group], op: str, count: int, local_fn: Any,
        body: dict[str, Any] | None = None,
    ) -> list[np.ndarray]:  # fmt: skip
        """``count`` int64 answers per id, each asked of the id's owner."""
        outs = [np.empty(len(ids), dtype=np.int64) for _ in range(count)]

        def here(g: routing.Group) -> tuple[np.ndarray, ...]:
            got: tuple[np.ndarray, ...] = local_fn(self.local[g.part], g.ids)
            self.local_bytes[g.part] += sum(a.nbytes for a in got)
            return got

        answers: Iterator[tuple[routing.Group, tuple[np.ndarray, ...] | Message]]
        answers = routing.remote_first(
            groups,
            self._here,
            lambda g: self._session(g.part).request(g.part, op, body or {}, (g.ids,)),
            self._wait,
            here,
        )
        for g, got in answers:
            if not isinstance(got, tuple):
                got = _one(got, len(g.ids), count, op)
            for o, x in zip(outs, got, strict=True):
                o[g.pos] = x
        return outs

    def in_degrees(self, ids: Tensor) -> Tensor:
        """In-degree of global node ids (asked of each node's owner)."""
        nid, groups = self._groups(ids, "ids")
        deg = self._by_owner(nid, groups, OP_IN_DEGREES, 1, lambda c, x: (c.in_degrees(x),))[0]
        return torch.from_numpy(deg)

    def find_edges(self, eids: Tensor, missing: bool = False) -> tuple[Tensor, Tensor]:
        """``(src, dst)`` global node ids of global edge ids (asked of each edge's owner);
        a client following a live graph routes its new edges by their growth blocks.
        ``missing``: -1 ends for an id that is no edge at the client's version (deleted),
        where the owner refuses it otherwise."""
        e, groups = self._groups(eids, "eids", edges=True)
        body = {"missing": True} if missing else {}  # shared memory holds no delta: none
        src, dst = self._by_owner(e, groups, OP_FIND_EDGES, 2, lambda c, x: c.find_edges(x), body)
        return torch.from_numpy(src), torch.from_numpy(dst)

    def edge_types(self, eids: Tensor) -> Tensor:
        """The type index of global edge ids (asked of each edge's owner, routed as
        :meth:`find_edges`): what a following client knows of a new edge by its id."""
        e, groups = self._groups(eids, "eids", edges=True)
        (et,) = self._by_owner(e, groups, OP_EDGE_TYPES, 1, lambda c, x: (c.edge_types(x),))
        return torch.from_numpy(et)

    def out_degrees(self, ids: Tensor) -> Tensor:
        """Out-degree of global node ids: every partition counts the edges it owns."""
        nid, _ = self._groups(ids, "ids")
        n = self.book.num_nodes
        total = np.zeros(len(nid), dtype=np.int64)
        pending = []
        for p in range(self.book.num_parts):
            if self._here(p) and bool((nid < n).all()):
                total += self.local[p].out_degree_counts(n)[nid]
                self.local_bytes[p] += total.nbytes
            else:
                pending.append(self._session(p).request(p, OP_OUT_DEGREES, {}, (nid,)))
        for pend in pending:
            total += _one(self._wait(pend), len(nid), 1, OP_OUT_DEGREES)[0]
        return torch.from_numpy(total)


def _one(msg: Message, n: int, count: int, op: str) -> tuple[np.ndarray, ...]:
    if len(msg.tensors) != count:
        raise ProtocolError(f"expected {count} tensors, got {len(msg.tensors)}", kind=op)
    out = []
    for i, a in enumerate(msg.tensors):
        if a.shape != (n,):
            raise ProtocolError(f"tensor {i} has shape {a.shape}, expected ({n},)", kind=op)
        out.append(np.asarray(a, dtype=np.int64))
    return tuple(out)


def _positions(g: routing.Group, index: np.ndarray) -> np.ndarray:
    """Positions in the caller's seeds of the entries ``index`` of group ``g``'s seeds."""
    if isinstance(g.pos, slice):
        return index + g.pos.start if g.pos.start else index
    return g.pos[index]


def merge(parts: list[tuple[routing.Group, SampledEdges]], typed: bool) -> SampledEdges:
    """Concatenate per-owner answers; ``seed_index`` back to the caller's positions, the
    edges in the caller's seed order. Each owner answers in the order of its seeds; where
    the owners' seeds interleave (a batch of one partition's seeds but a few of another's)
    one stable sort puts the edges back in seed order, so a layer's edges stay grouped by
    destination, as the model's compressed rows take them without a sort of their own
    (:func:`graphrun.train.aggregate.csr_rows`)."""
    if not parts:
        return SampledEdges.empty(typed)
    out = SampledEdges(
        src=np.concatenate([e.src for _, e in parts]),
        seed_index=np.concatenate([_positions(g, e.seed_index) for g, e in parts]),
        eid=np.concatenate([e.eid for _, e in parts]),
        etype=np.concatenate([e.etype for _, e in parts if e.etype is not None]) if typed else None,
    )
    if not _in_order([g.pos for g, _ in parts]):
        order = np.argsort(out.seed_index, kind="stable")  # runs merged: timsort
        out = SampledEdges(
            out.src[order], out.seed_index[order], out.eid[order],
            None if out.etype is None else out.etype[order],
        )  # fmt: skip
    return out


def _in_order(positions: list[np.ndarray | slice]) -> bool:
    """Whether groups of increasing positions, taken one after another, are in the
    caller's order: each group's first position after the last one's last."""
    last = -1
    for pos in positions:
        if isinstance(pos, slice):
            first, stop = pos.start or 0, pos.stop or 0
        else:
            first, stop = (int(pos[0]), int(pos[-1]) + 1) if len(pos) else (0, 0)
        if stop <= first:  # no seeds
            continue
        if first <= last:
            return False
        last = stop - 1
    return True
