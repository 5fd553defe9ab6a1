"""The core store operations (each a ``handler(state, request) -> Response``).

=================  ===========================================================================
op                 body -> reply
=================  ===========================================================================
join               job, client -> server info, tensors visible to the job, structure segments
info               job -> the same without joining   (no session needed)
leave              ends the session (frees the job's non-persistent tensors if it was the last)
heartbeat          keeps the session alive -> {"known": bool}
pull               job, name; tensors (rows,) local int64 -> (values,)
pull_tables        job, names; tensors (rows,) -> (values,) per name  (tensors of one
                   policy, every name found before any is read: one request for several)
push               job, name, reducer, params, states; tensors (rows, values) -> {}
push_tables        job, names; tensors (rows, values) per name -> {}  (``assign`` of each,
                   all checked before any is written: one request for several tables)
init               job, name, policy, dtype, row_shape, persistent, exist_ok, init -> {"info"}
attach             job, name (a backup maps a tensor its main created) -> {}
delete             job, name -> {"deleted": bool}
list               job -> {"tensors": [info, ...]}
meta               job, name -> {"info"}            (no session needed: used by backups)
manifest           -> every tensor and structure segment   (no session needed)
register_backup    address, pid, start [, remove] -> {}   (no session needed)
stats              -> sessions, jobs, tensors, requests served, disk counters (no session)
stop               -> {} and the server shuts down cleanly
=================  ===========================================================================

Rows in ``pull``/``push`` are local rows of this partition (the client converts global
ids with the tensor's partition policy); they are checked against the partition size.

A job key (``request.admin`` False) writes none of the graph's own tensors (``push``
target or optimizer state: AuthError), sees its own job's sessions and no request or
disk counts in ``stats``, and gets a digest of the server's host identity in ``join``/``info``
(:func:`~graphrun.store.shm.host_digest`: enough to find co-located shared memory).
"""

from __future__ import annotations

import time

import numpy as np

from graphrun.errors import ArgumentError, AuthError, StoreError
from graphrun.store import live_ops, live_rows
from graphrun.store.disk import disk_stats
from graphrun.store.growth import INITIALIZERS, fill
from graphrun.store.reducers import STATE_SPECS, get_reducer
from graphrun.store.registry import Registry, Request, Response
from graphrun.store.replicas import replica_state_fields
from graphrun.store.requests import (
    BackupBody,
    HeartbeatBody,
    InitBody,
    JoinBody,
    Named,
    PullTablesBody,
    PushBody,
    PushTablesBody,
    ReduceBody,
)
from graphrun.store.shm import host_digest
from graphrun.store.state import GRAPH_JOB, PartitionInfo, ServerState, StoredTensor
from graphrun.wire import to_builtins


def _rows(state: ServerState, req: Request, stored: StoredTensor, at: int = 0) -> np.ndarray:
    """The request's local rows (its tensor ``at``), checked: the partition's, or (a job's
    node tensor on a live graph) rows of new nodes visible at the request's version
    (live_rows.py)."""
    rows = req.tensor(at, "rows")
    if rows.ndim != 1 or rows.dtype != np.int64:
        raise ArgumentError(f"{req.op}: rows must be 1-d int64, got {rows.dtype} {rows.shape}")
    n = stored.info.part_rows
    bad = (rows < 0) | (rows >= n)
    if bad.any() and not (rows < 0).any() and live_rows.grow(state, req, stored, rows[rows >= n]):
        return rows
    if bad.any():
        i_bad = int(np.flatnonzero(bad)[0])
        raise ArgumentError(
            f"{req.op} {stored.info.name!r}: local row {int(rows[i_bad])} at position {i_bad} "
            f"is out of range [0, {n}) of partition"
        )
    return rows


def join(state: ServerState, req: Request) -> Response:
    client = req.args(JoinBody).client
    if not req.session:
        raise ArgumentError("join: field 's' (session id) is missing")
    if req.job == GRAPH_JOB:
        raise ArgumentError("join: field 'job' must name the job (the empty name is the graph's)")
    state.join(req.session, req.job, client, time.monotonic(), req.user)
    return info(state, req)


def info(state: ServerState, req: Request) -> Response:
    return Response(
        to_builtins(
            PartitionInfo(
                part=state.part,
                index=state.index,
                backups=tuple(state.backups),
                host=state.host if req.admin else host_digest(state.host),
                shm_dir=state.shm_dir,
                book=state.book.to_config(),
                heartbeat_timeout=state.heartbeat_timeout,
                tensors=tuple(state.visible(req.job)),
                structure=state.structure_segments,
                deletions=state.deletions_segment,
                replica=state.replica,
                replicas=tuple(state.replication.addresses) if state.replication else (),
            )
        )
    )


def leave(state: ServerState, req: Request) -> Response:
    state.leave(req.session)
    return Response({})


def heartbeat(state: ServerState, req: Request) -> Response:
    """A session's sign of life, and a live session's version (its pin). ``floor``: the
    version this partition's base was compacted at (a read below it is refused)."""
    known = req.session in state.sessions
    v = req.args(HeartbeatBody).v
    if known:
        state.touch(req.session, time.monotonic())
        if v is not None:  # a live session's pin (store/compact.py)
            live_ops.note_pin(state, req.session, v)
    live = state.extension_data.get(live_ops.KEY)
    floor = live.delta.floor if isinstance(live, live_ops.LivePart) else 0
    return Response({"known": known, "floor": floor})


def pull(state: ServerState, req: Request) -> Response:
    return Response({}, (_pulled(state, req, state.find(req.job, req.args(Named).name)),))


def pull_tables(state: ServerState, req: Request) -> Response:
    found = [state.find(req.job, name) for name in req.args(PullTablesBody).names]
    if len({s.info.policy for s in found}) != 1:
        got = ", ".join(f"{s.info.name}: {s.info.policy}" for s in found)
        raise ArgumentError(f"pull_tables: tensors of one partition policy, got {got}")
    return Response({}, tuple(_pulled(state, req, s) for s in found))


def _pulled(state: ServerState, req: Request, stored: StoredTensor) -> np.ndarray:
    """``stored``'s values at the request's rows (tensor 0)."""
    if stored.info.job == GRAPH_JOB:  # a live graph's rows at the request's version
        live = live_ops.pull_at(state, req, stored)
        if live is not None:
            return live
    return live_rows.take(stored, _rows(state, req, stored))


def writable(req: Request, stored: StoredTensor, allow_graph: bool) -> StoredTensor:
    """``stored`` if this request may write it: the graph's own tensors (namespace ``""``)
    are read-only to a job key, and to the admin key unless it sets ``allow_graph``."""
    if stored.info.job != GRAPH_JOB:
        return stored
    if stored.disk is not None:
        raise StoreError(f"{req.op} {stored.info.name!r}: served from disk, read-only")
    if not req.admin:
        raise AuthError(
            f"{req.op} {stored.info.name!r}: the graph's tensors are read-only to a job key"
        )
    if not allow_graph:
        raise StoreError(
            f"{req.op} {stored.info.name!r}: graph data is read-only unless allow_graph is set"
        )
    return stored


def push(state: ServerState, req: Request) -> Response:
    body = req.args(PushBody)
    name = body.name
    stored = writable(req, state.find(req.job, name), body.allow_graph)
    rows = _rows(state, req, stored)
    reducer_name = body.reducer
    reducer = get_reducer(reducer_name)
    is_opt = bool(STATE_SPECS.get(reducer_name))
    values = _values(req, stored, rows, 1, same_dtype=not is_opt)
    if is_opt and values.dtype.kind != "f":
        raise ArgumentError(f"push {name!r}: gradients must be floating point, got {values.dtype}")
    state_names = body.states
    specs = STATE_SPECS.get(reducer_name, ())
    if len(state_names) != len(specs):
        raise ArgumentError(f"push {name!r}: reducer {reducer_name} needs {len(specs)} states")
    states = [writable(req, state.find(req.job, s), body.allow_graph) for s in state_names]
    live_rows.reduce(reducer, stored, rows, values, states, body.params)
    return Response({})


def _values(
    req: Request, stored: StoredTensor, rows: np.ndarray, at: int, same_dtype: bool
) -> np.ndarray:
    """The request's values (its tensor ``at``) for ``rows`` of ``stored``, checked."""
    name, values = stored.info.name, req.tensor(at, "values")
    want = (len(rows), *stored.info.row_shape)
    if values.shape != want:
        raise ArgumentError(f"{req.op} {name!r}: values have shape {values.shape}, expected {want}")
    if same_dtype and values.dtype != stored.array.dtype:
        raise ArgumentError(
            f"{req.op} {name!r}: values have dtype {values.dtype}, tensor has {stored.array.dtype}"
        )
    return values


def push_tables(state: ServerState, req: Request) -> Response:
    """``assign`` to several of the job's tensors: every one checked (exists, writable,
    rows and values) before any is written, so a refused request changes nothing."""
    names = req.args(PushTablesBody).names
    if len(req.tensors) != 2 * len(names):
        raise ArgumentError(f"push_tables: {len(req.tensors)} tensors for {len(names)} names "
                            "(rows and values of each)")  # fmt: skip
    checked = []
    for i, name in enumerate(names):
        stored = writable(req, state.find(req.job, name), False)
        rows = _rows(state, req, stored, 2 * i)
        checked.append((stored, rows, _values(req, stored, rows, 2 * i + 1, same_dtype=True)))
    assign = get_reducer("assign")
    for stored, rows, values in checked:
        live_rows.reduce(assign, stored, rows, values, [], {})
    return Response({})


def init(state: ServerState, req: Request) -> Response:
    body = req.args(InitBody)
    name = body.name
    if not name or name.startswith(("node/", "edge/")):
        raise ArgumentError(f"init: name {name!r} is empty or in the graph's node/ edge/ space")
    existing = state.tensors.get((req.job, name))
    if existing is not None:
        if body.exist_ok:
            return Response({"info": to_builtins(existing.info), "created": False})
        raise StoreError(f"init: tensor {name!r} already exists in job {req.job!r}")
    how = body.init
    if how not in INITIALIZERS:
        raise ArgumentError(f"init: initializer {how!r} is unknown; known: {list(INITIALIZERS)}")
    stored = state.create_tensor(
        req.job,
        name,
        body.policy,
        body.dtype,
        tuple(body.row_shape),
        body.persistent,
    )
    try:
        fill(stored.array, how, body.init_args, [state.part])
    except BaseException:
        state.delete_tensor(req.job, name)
        raise
    stored.init = (how, dict(body.init_args))
    return Response({"info": to_builtins(stored.info), "created": True})


def attach_op(state: ServerState, req: Request) -> Response:
    """A backup maps the job's tensor ``name`` as its main server describes it: the client
    names the tensor, never a segment or a path (a client-given segment name once mapped
    any file on the host writable)."""
    state.find(req.job, req.args(Named).name)
    return Response({})


def delete(state: ServerState, req: Request) -> Response:
    name = req.args(Named).name
    if (req.job, name) not in state.tensors and (GRAPH_JOB, name) in state.tensors:
        raise StoreError(f"delete {name!r}: graph data cannot be deleted")
    return Response({"deleted": state.delete_tensor(req.job, name)})


def list_op(state: ServerState, req: Request) -> Response:
    return Response({"tensors": to_builtins(state.visible(req.job))})


def meta(state: ServerState, req: Request) -> Response:
    return Response({"info": to_builtins(state.find(req.job, req.args(Named).name).info)})


def manifest(state: ServerState, req: Request) -> Response:
    return Response(
        {
            "tensors": [to_builtins(t.info) for t in state.tensors.values()],
            "structure": to_builtins(state.structure_segments),
        }
    )


def register_backup(state: ServerState, req: Request) -> Response:
    """A backup on this machine announces (or withdraws) itself; with its process id and
    start time the main server notices when it dies (:meth:`ServerState.drop_dead_backups`)."""
    body = req.args(BackupBody)
    if body.remove:
        state.unregister_backup(body.address)
    else:
        state.register_backup(body.address, body.pid, body.start)
    return Response({})


REDUCTIONS = ("max", "min", "sum", "count_nonzero")


def reduce_op(state: ServerState, req: Request) -> Response:
    """A reduction of this partition's rows of a tensor (the client combines them):
    ``{"value": number or None}``, or for ``nonzero`` the local rows with a non-zero
    element as ``(rows int64,)``."""
    body = req.args(ReduceBody)
    arr = state.find(req.job, body.name).array
    how = body.how
    if how == "nonzero":
        flat = arr.reshape(len(arr), int(np.prod(arr.shape[1:])))  # -1 fails on no rows
        return Response({}, (np.flatnonzero(flat.any(axis=1)).astype(np.int64),))
    if how not in REDUCTIONS:
        raise ArgumentError(f"reduce: field 'how' must be 'nonzero' or one of {list(REDUCTIONS)}")
    if arr.size == 0:
        return Response({"value": None})
    value = getattr(np, how)(arr)
    return Response({"value": value.item() if isinstance(value, np.generic) else int(value)})


def stats(state: ServerState, req: Request) -> Response:
    """Sessions, jobs, tensors and requests served; a job key sees its own job only."""
    jobs: dict[str, int] = {}
    for s in state.sessions.values():
        if req.admin or s.job == req.job:
            jobs[s.job] = jobs.get(s.job, 0) + 1
    seen = [(j, n) for j, n in state.tensors if req.admin or j in (GRAPH_JOB, req.job)]
    return Response(
        {
            "part": state.part,
            "index": state.index,
            "sessions": sum(jobs.values()),
            "jobs": jobs,
            "tensors": sorted(f"{j}/{n}" if j else n for j, n in seen),
            "served": dict(state.served) if req.admin else {},
            "reply_bytes": dict(state.reply_bytes) if req.admin else {},
            "backups": list(state.backups),
            "disk": disk_stats(list(state.disk.values())) if req.admin else {},
            **replica_state_fields(state),
            **(live_ops.stats_fields(state) if req.admin else {}),
        }
    )


def stop(state: ServerState, req: Request) -> Response:
    state.stop_requested = True
    return Response({})


def register(registry: Registry) -> None:
    """Add the core operations to ``registry``."""
    registry.add("join", join, needs_session=False)
    registry.add("info", info, needs_session=False)
    registry.add("leave", leave)
    registry.add("heartbeat", heartbeat, needs_session=False)
    registry.add("pull", pull)
    registry.add("pull_tables", pull_tables)
    registry.add("push", push)
    registry.add("push_tables", push_tables)
    registry.add("reduce", reduce_op)
    registry.add("init", init)
    registry.add("attach", attach_op)
    registry.add("delete", delete)
    registry.add("list", list_op)
    registry.add("meta", meta, needs_session=False)
    registry.add("manifest", manifest, needs_session=False)
    registry.add("register_backup", register_backup, needs_session=False)
    registry.add("stats", stats, needs_session=False)
    registry.add("stop", stop)
