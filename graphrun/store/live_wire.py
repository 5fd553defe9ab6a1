"""A live graph's write piece on the wire (``live_prepare``): each array is a tensor of
the request, the body names their indexes (:class:`PieceWire`)."""

from __future__ import annotations

from typing import cast

import msgspec
import numpy as np

from graphrun.errors import ArgumentError
from graphrun.store.live import GROWTH_BLOCK, MAX_GROWTH_BLOCKS, Piece, Rows
from graphrun.store.live_index import run_ids
from graphrun.store.registry import Request

Runs = list[list[tuple[int, int]]]  # [(start, count), ...] per partition
_INT32_IDS = np.iinfo(np.int32).max - MAX_GROWTH_BLOCKS * GROWTH_BLOCK  # base nodes, at most


def end_dtype(num_nodes: int) -> type[np.signedinteger]:
    """The dtype of a piece's new edges' ends (``[2, m]`` src, dst beside their
    ``edge_ids``): int32 where every node id of a graph of ``num_nodes`` base nodes fits,
    growth ids and a begin's ``-(k + 1)`` included (half the bytes on the wire and in
    the log; the partition widens them as it checks them), else int64."""
    return np.int32 if num_nodes <= _INT32_IDS else np.int64


class PieceWire(msgspec.Struct, frozen=True, kw_only=True):
    """A :class:`~graphrun.store.live.Piece` on the wire: each array is the request's
    tensor at the given index (no bytes in the body)."""

    version: int
    new_nodes: int | None = None
    node_types: int | None = None
    node_orig: int | None = None
    node_features: dict[str, int] = msgspec.field(default_factory=dict)
    new_edges: int | None = None  # [2, m] src, dst ([3, m] with eid: an older writer's)
    edge_ids: list[tuple[int, int]] | None = None  # their ids, (start, count) runs
    edge_types: int | None = None  # None: all 0 (a graph of one edge type)
    edge_features: dict[str, int] = msgspec.field(default_factory=dict)
    deleted_edges: int | None = None
    updates: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)


# ---- the live graph's request bodies (store/live_ops.py)


class BeginBody(msgspec.Struct, frozen=True):
    nodes: list[int]  # new nodes per partition
    edges: list[int]  # new edges per partition
    decided: list[tuple[int, bool]] = msgspec.field(default_factory=list)  # live_decide's
    piece: PieceWire | None = None  # partition 0's, unnumbered (numbered_piece)


class PrepareBody(msgspec.Struct, frozen=True):
    piece: PieceWire
    seq: str = ""  # the sequencer's address (a partition asks it the fate of a piece)
    seq_replicas: list[str] = msgspec.field(default_factory=list)  # then its replicas'
    decided: list[tuple[int, bool]] = msgspec.field(default_factory=list)  # live_commit's


class DecideBody(msgspec.Struct, frozen=True):
    version: int
    commit: bool


class FateBody(msgspec.Struct, frozen=True):
    version: int


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
        edge_ids=piece.edge_ids,
        edge_types=put(piece.edge_types),
        edge_features=put_all(piece.edge_features),
        deleted_edges=put(piece.deleted_edges),
        updates={k: (put_one(i), put_one(r)) for k, (i, r) in piece.updates.items()},
    )
    return msgspec.to_builtins(wire), tensors


def _taken(arr: np.ndarray) -> Rows:
    """The rows of an array the piece takes over (a received request's frame, or an array
    :func:`numbered_piece` built), not copied: it is flagged read-only (nothing writes to
    it from here on: a frame's memory is its request's alone) and ``data`` is a view of
    its memory, which msgspec encodes and ``numpy`` reads as it does bytes (the log
    record, :meth:`Rows.array`). A non-contiguous array is copied, and so is one not
    aligned to its item size (libzmq puts a small frame's data right after its header
    in the received stream: the delta's compiled kernels take aligned arrays)."""
    a = np.asarray(arr)
    if not (a.flags.c_contiguous and a.flags.aligned) or a.size == 0:
        return Rows.of(a)
    a.setflags(write=False)
    return Rows(_name(a.dtype), a.shape, cast(bytes, a.data.cast("B")))


_NAMES: dict[np.dtype, str] = {}  # the dtypes frames carry (rpc/codec.py's few)


def _name(dtype: np.dtype) -> str:
    """``dtype.name``, remembered: numpy builds it in Python each time (about 5 µs, 18 on
    a loaded box; ten arrays a batch on each server)."""
    name = _NAMES.get(dtype)
    if name is None:
        name = dtype.name
        if len(_NAMES) < 64:
            _NAMES[dtype] = name
    return name


def piece_from_wire(req: Request, wire: PieceWire) -> Piece:
    """The piece of a received ``live_prepare``: its arrays are the request's frames,
    taken over, not copied (:func:`_taken`; a zmq frame is writable, so it is flagged
    read-only here: an array built in-process and passed in a :class:`Request` is taken
    over too, and its owner cannot write to it afterwards)."""

    def get(i: int | None, what: str) -> Rows | None:
        return None if i is None else _taken(req.tensor(i, what))

    def get_all(d: dict[str, int], what: str) -> dict[str, Rows]:
        return {k: _taken(req.tensor(i, f"{what}[{k!r}]")) for k, i in d.items()}

    return Piece(
        version=wire.version,
        new_nodes=get(wire.new_nodes, "new_nodes"),
        node_types=get(wire.node_types, "node_types"),
        node_orig=get(wire.node_orig, "node_orig"),
        node_features=get_all(wire.node_features, "node_features"),
        new_edges=get(wire.new_edges, "new_edges"),
        edge_ids=wire.edge_ids,
        edge_types=get(wire.edge_types, "edge_types"),
        edge_features=get_all(wire.edge_features, "edge_features"),
        deleted_edges=get(wire.deleted_edges, "deleted_edges"),
        updates={
            k: (
                _taken(req.tensor(i, f"updates[{k!r}] ids")),
                _taken(req.tensor(j, f"updates[{k!r}] rows")),
            )
            for k, (i, j) in wire.updates.items()
        },
    )


def numbered_piece(
    req: Request, wire: PieceWire, version: int, node_runs: Runs, edge_runs: Runs
) -> Piece:
    """Partition 0's piece as ``live_begin`` carries it, numbered by the sequencer with
    what it handed out (``version``, ``[(start, count), ...]`` runs per partition): its
    new nodes' ids (partition 0's run), its new edges' ids (``edge_ids``: partition 0's
    runs, beside the ``[2, m]`` src, dst the writer sent), and the batch's new nodes
    among the ends, sent as ``-(k + 1)`` for the ``k``-th original id of the begin (in
    partition order: the ``k``-th id of the runs; the ends are copied only then).
    ArgumentError naming the field if the piece names ids of its own there or an end
    names no new node of the batch."""
    new_ids = run_ids([r for runs in node_runs for r in runs])
    node_ids = new_ids[: sum(c for _, c in node_runs[0])]  # partition 0's come first
    m = sum(c for _, c in edge_runs[0])
    for field in ("new_nodes", "edge_ids"):
        if getattr(wire, field) is not None:
            raise ArgumentError(f"{req.op}: piece.{field} is the sequencer's to fill")
    piece = piece_from_wire(req, wire)
    edges = piece.new_edges
    if edges is not None:
        ends = edges.array("piece.new_edges")
        if ends.ndim != 2 or ends.shape[0] != 2 or ends.dtype not in (np.int64, np.int32):
            raise ArgumentError(f"{req.op}: piece.new_edges must be int64 or int32 [2, m] "
                                f"(src, dst), got {ends.dtype} {ends.shape}")  # fmt: skip
        if ends.shape[1] != m:
            raise ArgumentError(f"{req.op}: piece.new_edges has {ends.shape[1]} edges, the "
                                f"begin counts {m} for partition 0")  # fmt: skip
        if ends.size and int(ends.min()) < 0:  # new nodes among the ends (one pass if none)
            edges = _taken(_renumbered(req, ends, new_ids))
    elif m:
        raise ArgumentError(f"{req.op}: piece.new_edges is missing ({m} edges)")
    return msgspec.structs.replace(
        piece, version=version, new_nodes=_taken(node_ids) if len(node_ids) else None,
        new_edges=edges if m else None,
        edge_ids=[(int(s), int(c)) for s, c in edge_runs[0]] if m else None,
    )  # fmt: skip


def _renumbered(req: Request, ends: np.ndarray, new_ids: np.ndarray) -> np.ndarray:
    """``ends`` with each ``-(k + 1)`` replaced by ``new_ids[k]`` (an int64 copy: the
    frame is read-only); ArgumentError if ``k`` is past the batch's new nodes."""
    out = ends.astype(np.int64)
    new = out < 0
    k = -out[new] - 1
    if int(k.max()) >= len(new_ids):
        raise ArgumentError(f"{req.op}: piece.new_edges names new node "
                            f"{int(k.max())} of {len(new_ids)}")  # fmt: skip
    out[new] = new_ids[k]
    return out
