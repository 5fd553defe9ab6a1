"""A live graph's write piece on the wire (``live_prepare``): each array is a tensor of
the request, the body names their indexes (:class:`PieceWire`)."""

from __future__ import annotations

from typing import cast

import msgspec
import numpy as np

from graphrun.store.live import Piece, Rows
from graphrun.store.registry import Request


class PieceWire(msgspec.Struct, frozen=True, kw_only=True):
    """A :class:`~graphrun.store.live.Piece` on the wire: each array is the request's
    tensor at the given index (no bytes in the body)."""

    version: int
    new_nodes: int | None = None
    node_types: int | None = None
    node_orig: int | None = None
    node_features: dict[str, int] = msgspec.field(default_factory=dict)
    new_edges: int | None = None
    edge_types: int | None = None
    edge_features: dict[str, int] = msgspec.field(default_factory=dict)
    deleted_edges: int | None = None
    updates: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)


def piece_to_wire(piece: Piece) -> tuple[dict[str, object], list[np.ndarray]]:
    """``(body, tensors)`` of a piece for ``live_prepare``."""
    tensors: list[np.ndarray] = []

    def put_one(r: Rows) -> int:
        tensors.append(r.array("piece"))
        return len(tensors) - 1

    def put(r: Rows | None) -> int | None:
        return None if r is None else put_one(r)

    def put_all(d: dict[str, Rows]) -> dict[str, int]:
        return {k: put_one(r) for k, r in d.items()}

    wire = PieceWire(
        version=piece.version,
        new_nodes=put(piece.new_nodes),
        node_types=put(piece.node_types),
        node_orig=put(piece.node_orig),
        node_features=put_all(piece.node_features),
        new_edges=put(piece.new_edges),
        edge_types=put(piece.edge_types),
        edge_features=put_all(piece.edge_features),
        deleted_edges=put(piece.deleted_edges),
        updates={k: (put_one(i), put_one(r)) for k, (i, r) in piece.updates.items()},
    )
    return msgspec.to_builtins(wire), tensors


def _view(arr: np.ndarray) -> Rows:
    """The rows of a read-only array that no one changes (a received frame's), not
    copied: ``data`` is a view of its memory, which msgspec encodes and ``numpy``
    reads as it does bytes (the log record, :meth:`Rows.array`). A writable array is
    copied (a caller could change it later)."""
    a = np.ascontiguousarray(arr)
    if a.flags.writeable or a.size == 0:
        return Rows.of(a)
    data = cast(bytes, a.reshape(-1).data.cast("B"))
    return Rows(a.dtype.name, tuple(int(x) for x in a.shape), data)


def piece_from_wire(req: Request, wire: PieceWire) -> Piece:
    """The piece of a received ``live_prepare``: its arrays are the request's frames, not
    copied (:func:`_view`)."""

    def get(i: int | None, what: str) -> Rows | None:
        return None if i is None else _view(np.asarray(req.tensor(i, what)))

    def get_all(d: dict[str, int], what: str) -> dict[str, Rows]:
        return {k: _view(np.asarray(req.tensor(i, f"{what}[{k!r}]"))) for k, i in d.items()}

    return Piece(
        version=wire.version,
        new_nodes=get(wire.new_nodes, "new_nodes"),
        node_types=get(wire.node_types, "node_types"),
        node_orig=get(wire.node_orig, "node_orig"),
        node_features=get_all(wire.node_features, "node_features"),
        new_edges=get(wire.new_edges, "new_edges"),
        edge_types=get(wire.edge_types, "edge_types"),
        edge_features=get_all(wire.edge_features, "edge_features"),
        deleted_edges=get(wire.deleted_edges, "deleted_edges"),
        updates={
            k: (
                _view(np.asarray(req.tensor(i, f"updates[{k!r}] ids"))),
                _view(np.asarray(req.tensor(j, f"updates[{k!r}] rows"))),
            )
            for k, (i, j) in wire.updates.items()
        },
    )
