"""``move_sums``: a partition's last-layer running sums moved where they are.

An incremental refresh (:mod:`graphrun.serving.refresh`) moves each node of ``A_L``'s
``lastsum`` row ``[T, d, stamp]`` (:mod:`graphrun.serving.sums`) by the edges that
reach it, then writes the node's logits ``float32(T / max(d, 1))`` and prediction. On a
power-law graph that is some 27k rows after 1,000 new edges: read from shared memory by
the refresher and written back through the store were 18 MB a refresh (10 MB of
float64 sums, 5 MB of logits), which the client's one ZeroMQ I/O thread encrypted and
each server decrypted (benchmarks/README.md, issue 43). Here the client sends each
server what moves its rows (2.4 MB in all for those 27k rows, against 15 MB of rows,
logits and predictions) and the server moves them in place:

=============  ==================================================================
tensor         what
=============  ==================================================================
rows           int64 ``[m]``: local rows of the three tables to move, increasing
fresh          int32 ``[f]``: positions in ``rows`` of new nodes (no row yet: their
               stored row is read as zeros)
src            float32 ``[k, 2C]``: each source's ``W_l · h`` before and after
ch_at, ch_src  int32 ``[e]``: edges that changed: destination (a position in
ch_sign        ``rows``), source (in ``src``), int8 +1 added / -1 deleted: adds the
               source's old projection and the sign to the in-degree
out_at         int32 ``[o]``: edges leaving ``A_{L-1}`` at the new version: adds the
out_src        source's change (after − before)
own_at, own    int32 ``[j]``, float32 ``[j, 2C]``: nodes of ``A_{L-1}`` here, their own
               part ``W_r · h + b`` before and after: ``T`` trades
               ``max(d, 1)`` times the old one (at the old degree) for the new one
own_src        int32 ``[j]``: each one's row in ``src``: its ``lastown`` row is written
               ``[src after, own after, src before, own before, version]``
=============  ==================================================================

body: ``sums``, ``logits``, ``predictions``, ``lastown`` (the job's tables: float64
``[C + 2]``, float32 ``[C]``, int64 rows, float64 ``[4C + 1]``) and ``version``, the
stamp. The ``lastown`` rows written here were 1.5 MB of ``push_tables`` a refresh
after 1,000 new edges (float64, from the refresher); here they cost 4 bytes a node of
``A_{L-1}`` (``own_src``). The projections and own parts
are fp32 products (the layer's own) kept in float64, so float32 carries them exactly;
the moves and sums are float64 as on the client before, in the same order, so the
rows are the ones a client-side move wrote. Reply ``{"moved": rows not stamped yet}``.

**Who may call it:** whoever may write the four tables (as ``push_tables``): the job's
own tables with its key or the admin key; the graph's tensors never (AuthError to a
job key). **Bounds:** every count is checked against the request before anything is
allocated (``rows`` unique and inside the partition, positions inside what they index,
:data:`MAX_EDGES`, :data:`MAX_SOURCES`) and the whole request before any row is
written: a bad one changes nothing and gets one ArgumentError line. **Crash-safety** is
the stamps': the compiled loop (:func:`~graphrun.store.sum_kernels.move_rows`) moves a
row in a buffer and writes it whole with its stamp, then its logits and prediction, as
``push_tables`` wrote the client's rows; a row already stamped ``version`` (moved by an
interrupted try) is not moved again, so a retry moves only the rest (its ``lastown`` row
is written again, the same). A write like
``push`` (``WRITE_OPS``): a partition's replica applies the same request to its rows.
"""

from __future__ import annotations

import msgspec
import numpy as np

from graphrun.errors import ArgumentError
from graphrun.store.handlers import writable
from graphrun.store.registry import Registry, Request, Response
from graphrun.store.state import ServerState, StoredTensor

OP = "move_sums"
MAX_EDGES = 1 << 24  # edges of one request (changed and leaving A_{L-1}, each)
MAX_SOURCES = 1 << 22  # rows of ``src`` and of ``own``
TENSORS = ("rows", "fresh", "src", "ch_at", "ch_src", "ch_sign", "out_at", "out_src",
           "own_at", "own", "own_src")  # fmt: skip


class MoveBody(msgspec.Struct, frozen=True, kw_only=True):
    sums: str
    logits: str
    predictions: str
    lastown: str
    version: int

    def __post_init__(self) -> None:
        if self.version < 0:
            raise ValueError("version: a version is >= 0")


def _array(req: Request, i: int, dtype: str, ndim: int, most: int) -> np.ndarray:
    got = req.tensor(i, TENSORS[i])
    if got.dtype != np.dtype(dtype) or got.ndim != ndim or len(got) > most:
        raise ArgumentError(f"{req.op}: {TENSORS[i]} must be {ndim}-d {dtype} of at most "
                            f"{most} rows, got {got.dtype} {got.shape}")  # fmt: skip
    return got


def _positions(req: Request, i: int, below: int, most: int | None = None) -> np.ndarray:
    at = _array(req, i, "int32", 1, MAX_EDGES if most is None else most)
    if len(at) and (int(at.min()) < 0 or int(at.max()) >= below):
        raise ArgumentError(f"{req.op}: {TENSORS[i]} holds a position outside [0, {below})")
    return at


def _table(state: ServerState, req: Request, name: str, dtype: str, shape: tuple[int, ...]
           ) -> StoredTensor:  # fmt: skip
    stored = writable(req, state.find(req.job, name), False)
    if stored.array.dtype != np.dtype(dtype) or stored.info.row_shape != shape:
        raise ArgumentError(f"{req.op}: {name!r} has {stored.array.dtype} rows of "
                            f"{stored.info.row_shape}, not {dtype} {shape}")  # fmt: skip
    return stored


def move_sums(state: ServerState, req: Request) -> Response:
    """The op (module docstring): everything checked, then the rows moved and the
    four tables written."""
    body = req.args(MoveBody)
    if len(req.tensors) != len(TENSORS):
        raise ArgumentError(f"{req.op}: {len(req.tensors)} tensors, expected "
                            f"{len(TENSORS)} ({', '.join(TENSORS)})")  # fmt: skip
    sums = writable(req, state.find(req.job, body.sums), False)
    if sums.array.dtype != np.float64 or len(sums.info.row_shape) != 1:
        raise ArgumentError(f"{req.op}: {body.sums!r} is not a table of float64 sums")
    c = sums.info.row_shape[0] - 2
    logits = _table(state, req, body.logits, "float32", (c,))
    pred = _table(state, req, body.predictions, "int64", ())
    n = sums.info.part_rows
    rows = _array(req, 0, "int64", 1, n)
    if len(rows) and (rows[0] < 0 or rows[-1] >= n or (np.diff(rows) <= 0).any()):
        raise ArgumentError(f"{req.op}: rows must increase inside [0, {n}) of partition "
                            f"{state.part}")  # fmt: skip
    m = len(rows)
    fresh = _positions(req, 1, m)
    src = _array(req, 2, "float32", 2, MAX_SOURCES)
    if src.shape[1] != 2 * c:
        raise ArgumentError(f"{req.op}: src rows have {src.shape[1]} columns, not {2 * c}")
    ch_at, ch_src = _positions(req, 3, m), _positions(req, 4, len(src))
    sign = _array(req, 5, "int8", 1, MAX_EDGES)
    out_at, out_src = _positions(req, 6, m), _positions(req, 7, len(src))
    own_at = _positions(req, 8, m, MAX_SOURCES)
    own = _array(req, 9, "float32", 2, MAX_SOURCES)
    own_src = _positions(req, 10, len(src), MAX_SOURCES)
    lastown = _table(state, req, body.lastown, "float64", (4 * c + 1,))
    if (not len(ch_at) == len(ch_src) == len(sign) or len(out_at) != len(out_src)
            or len(own_src) != len(own_at)):  # fmt: skip
        raise ArgumentError(f"{req.op}: an edge list's tensors differ in length")
    if len(sign) and not np.isin(sign, (-1, 1)).all():
        raise ArgumentError(f"{req.op}: ch_sign holds a value other than -1 and +1")
    if own.shape != (len(own_at), 2 * c):
        raise ArgumentError(f"{req.op}: own has shape {own.shape}, not "
                            f"{(len(own_at), 2 * c)}")  # fmt: skip
    from graphrun.store import sum_kernels  # numba: imported on the first move

    src64 = src.astype(np.float64)
    old, change = np.ascontiguousarray(src64[:, :c]), src64[:, c:] - src64[:, :c]
    moved = sum_kernels.move_rows(
        sums.array, logits.array, pred.array, rows, fresh.astype(np.int64),
        float(body.version), old, change, ch_at.astype(np.int64), ch_src.astype(np.int64),
        sign.astype(np.float64), out_at.astype(np.int64), out_src.astype(np.int64),
        own_at.astype(np.int64), own.astype(np.float64), lastown.array, src64,
        own_src.astype(np.int64),
    )  # fmt: skip
    return Response({"moved": int(moved)})


def register(registry: Registry) -> None:
    registry.add(OP, move_sums)
