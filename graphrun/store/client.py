"""The KV client: pull/push rows by global id across every partition's servers.

A client is given the main server address of each partition (any order) and a job
name. It is three parts behind one small API:

* a :class:`~graphrun.store.session.Session` joins every main server and the backups
  they announce, keeps the session alive (heartbeat thread) and sends requests, with
  failover from a lost backup to the main server;
* a :class:`~graphrun.store.catalog.Catalog` knows the tensors and maps the shared
  memory of the partitions on this machine;
* :mod:`~graphrun.store.routing` splits ids by owner.

``pull(name, ids)``: ids are checked once and grouped by owner (one ``searchsorted``);
the requests to remote owners are sent first (load-balanced over main and backups),
the co-located partition — when this process can map the server's shared memory — is
gathered directly from it while they are in flight, and every answer is written back
in the caller's order. When all ids have one owner the answer is returned without any
reordering copy (a remote answer is the received frame itself, read-only). A co-located
tensor served from disk is read here too: the server's shared cache, then this process's
mapping of the file (:meth:`Catalog.local_disk`).
Co-location is only an optimisation: ``use_shm=False`` forces the network path,
which returns the same bytes.

``push`` goes to each owner's main server (so that reducers of one partition are
applied by one process, in order). ``reduce(name, how)`` computes a column's
reduction (``max``, ``sum``, ``count_nonzero``, ...) on the servers and combines
the per-partition answers, instead of pulling the column. A client is not
thread-safe: use one per thread or process.

``traffic`` counts the bytes this client got from each partition, by operation: the
tensors of every reply (``(part, op)``) and the rows gathered from shared memory
(``(part, "pull:shm")``). The trainers' per-batch profile records are its deltas.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import weakref
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, overload

import numpy as np

from graphrun.errors import ArgumentError, GraphrunError
from graphrun.names import PolicyName
from graphrun.rpc.codec import DEFAULT_LIMITS
from graphrun.store import routing
from graphrun.store.catalog import Catalog
from graphrun.store.disk import DISK_COUNTERS, DiskRows
from graphrun.store.live_client import LiveView, follow_head, fresh, shm_rows
from graphrun.store.live_client import route as live_route
from graphrun.store.policy import PartitionPolicy, lookup_policy, policies_from_book
from graphrun.store.requests import MAX_PUSH_TABLES
from graphrun.store.session import ClientConfig, Pending, Session
from graphrun.store.state import TensorInfo, received

log = logging.getLogger("graphrun.store")

DEFAULT_CURVE_CHUNK = 8 << 20

# Requests are split so no frame exceeds this: servers refuse bigger frames (Limits).
REQUEST_FRAME_BYTES = DEFAULT_LIMITS.max_request_frame_bytes // 2
# The pieces of one push in flight at once: a server counts what it received and has not
# read yet against one connection's limit (graphrun.rpc.guard), so a big push is sent as
# a window of pieces, not all at once.
PUSH_WINDOW_BYTES = DEFAULT_LIMITS.max_request_bytes // 2


def _push_pieces(rows: np.ndarray, values: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """One push as pieces whose frames fit ``REQUEST_FRAME_BYTES``. Every row's updates
    stay in one piece (sorted by row, cut between rows), so a reducer that combines the
    duplicates of a row (sparse optimizers) or lets the last one win (assign) does
    exactly what it does on the whole push."""
    nbytes = max(values.nbytes, rows.nbytes)
    if nbytes <= REQUEST_FRAME_BYTES or len(rows) < 2:
        return [(rows, values)]
    order = np.argsort(rows, kind="stable")
    rows, values = rows[order], values[order]
    per = max(1, len(rows) * REQUEST_FRAME_BYTES // nbytes)
    out, a = [], 0
    while a < len(rows):
        b = min(a + per, len(rows))
        while b < len(rows) and rows[b] == rows[b - 1]:
            b += 1  # never cut a row's duplicates apart
        out.append((rows[a:b], values[a:b]))
        a = b
    return out


def _table_requests(
    items: list[tuple[str, np.ndarray, np.ndarray]],
) -> list[list[tuple[str, np.ndarray, np.ndarray]]]:
    """One partition's rows of several tensors as ``push_tables`` requests: at most
    ``MAX_PUSH_TABLES`` tensors and ``PUSH_WINDOW_BYTES`` each."""
    out: list[list[tuple[str, np.ndarray, np.ndarray]]] = [[]]
    nbytes = 0
    for item in items:
        size = item[1].nbytes + item[2].nbytes
        if out[-1] and (len(out[-1]) == MAX_PUSH_TABLES or nbytes + size > PUSH_WINDOW_BYTES):
            out.append([])
            nbytes = 0
        out[-1].append(item)
        nbytes += size
    return out


#: what ``reduce`` computes on the servers, and how the partitions' answers combine
#: The reductions a tensor's servers compute and the client combines.
Reduction = Literal["max", "min", "sum", "count_nonzero"]

REDUCTIONS: dict[str, Callable[[list[Any]], Any]] = {
    "max": max,
    "min": min,
    "sum": sum,
    "count_nonzero": sum,
}


class KVClient:
    """A client of a running store (see the module docstring). It holds a
    :class:`~graphrun.store.session.Session` (``client.session``): the session's
    ``request``/``wait``/``call`` are the generic API, for extensions such as sampling."""

    def __init__(self, cfg: ClientConfig) -> None:
        self._closed = False
        self.cfg = cfg
        self.job = cfg.job
        self.session = Session(cfg)
        self.book = self.session.book
        self.policies = policies_from_book(self.book)
        self.catalog = Catalog(self.session)
        self.live: LiveView | None = None  # set by follow(): a live graph's head and blocks
        # A process that exits without close() would hold its session (and its job's
        # tensors) on every server until the heartbeat timeout; leave at exit instead.
        ref = weakref.ref(self)

        def _at_exit() -> None:
            c = ref()
            if c is not None:
                c.close()

        self._at_exit = _at_exit
        atexit.register(self._at_exit)

    @property
    def traffic(self) -> Counter[tuple[int, str]]:
        """Bytes got from each partition, by ``(part, op)`` (see the module docstring)."""
        return self.session.traffic

    @property
    def num_parts(self) -> int:
        return self.book.num_parts

    @property
    def local_parts(self) -> list[int]:
        """Partitions whose shared memory this client reads directly."""
        return sorted(p for p, e in self.session.parts.items() if e.local)

    def servers_of(self, part: int) -> list[str]:
        return [c.address for c in self.session.part(part).conns]

    # ---- a live graph (docs/live.md) --------------------------------------------------

    @property
    def version(self) -> int | None:
        """The live graph's version every read is at (None: the base graph)."""
        return self.session.version

    def follow(self, version: int | None = None) -> int:
        """Read the live graph at ``version`` (default: the head, asked now) from here on;
        returns it. Call again to move to a newer head. A version at or below the head
        last asked is read with that head's growth blocks (every id of the graph at it is
        in them), without asking the sequencer again: a loader worker moves to each
        batch's version so."""
        known = self.live
        if version is not None and known is not None and 0 <= int(version) <= known.head:
            self.session.version = int(version)
            return int(version)
        self.live = follow_head(self.session, self.num_parts, version)
        assert self.session.version is not None
        return self.session.version

    def live_nodes(self, since: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(graph ids, ntype index)`` of every new node at the client's version; with
        ``since``, of those added after that version (and maybe more: every one when a
        compaction folded a version after it)."""
        if self.version is None:
            raise ArgumentError("live_nodes: follow() the live graph first")
        body = {} if since is None else {"since": int(since)}
        got = [self.session.call(p, "live_nodes", body) for p in range(self.num_parts)]
        ids = np.concatenate([np.asarray(m.tensors[0], np.int64) for m in got])
        types = np.concatenate([np.asarray(m.tensors[1], np.int32) for m in got])
        order = np.argsort(ids, kind="stable")
        return ids[order], types[order]

    def _routes_live(self, ti: TensorInfo, pol: PartitionPolicy) -> bool:
        """Whether ids of this tensor are routed by the live graph's growth blocks: the
        graph's tensors, and a job's node tensors (a ``DistEmbedding``: rows of new
        nodes, store/live_rows.py), while following."""
        kind = pol.name.kind
        return self.live is not None and (kind == "node" or (ti.job == "" and kind == "edge"))

    def _route_live(
        self, pol: PartitionPolicy, ids: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        view = self.live
        assert view is not None
        node = pol.name.kind == "node"
        first = view.num_nodes if node else view.num_edges
        blocks = view.node_owner if node else view.edge_owner
        return live_route(view, pol.ranges, first, blocks, ids, "ids")

    def _pull_live(self, ti: TensorInfo, pol: PartitionPolicy, ids: Any) -> np.ndarray:
        """``pull`` of a live graph: growth ids routed by their blocks, each partition's
        rows read at the version (shared memory but for the rows held at or below it or
        overwritten by a compaction: :func:`~graphrun.store.live_client.shm_rows`)."""
        ids, part, rows = self._route_live(pol, ids)
        out = np.empty((len(ids), *ti.row_shape), dtype=ti.dtype)
        pending = []
        for p in routing.parts_of(part):
            pos = np.flatnonzero(part == p)
            arr, stale = None, None
            if self.session.local_ok(p):
                stale = shm_rows(self.session, p, ti.name, self.version)
            if stale is not None:
                arr = self.catalog.local_array(ti, p)
            if arr is not None and stale is not None:  # base rows from shared memory but
                r = rows[pos]  # those a compaction overwrote; new ones from the server
                shm = (r < ti.part_rows) & fresh(r, stale)
                base, pos = pos[shm], pos[~shm]
                out[base] = np.take(arr, rows[base], axis=0)
                self.traffic[p, "pull:shm"] += len(base) * ti.row_bytes
            if len(pos):
                body = {"name": ti.name}
                pending.append((pos, self.session.request(p, "pull", body, (rows[pos],))))
        for pos, pend in pending:
            out[pos] = self.session.wait(pend).tensors[0]
        return out

    # ---- tensors --------------------------------------------------------------------

    def meta(self, name: str) -> TensorInfo:
        """Name, policy, dtype and global shape of a tensor visible to this job."""
        return self.catalog.meta(name)

    def policy(self, name: str) -> PartitionPolicy:
        return lookup_policy(self.policies, self.meta(name).policy)

    def list_tensors(self, *, anywhere: bool = False) -> list[TensorInfo]:
        """The tensors visible to this job on every partition (each asked, all at once),
        as the first partition that has one describes it; ``anywhere``: on any partition.
        They differ where a server was started again since a job tensor was made: the
        others still have it, the new one does not, and writing it there fails."""
        pending = [self.session.request(p, "list") for p in range(self.num_parts)]
        lists = [self.session.wait(r).body["tensors"] for r in pending]
        first: dict[str, TensorInfo] = {}
        seen: Counter[str] = Counter()
        for got in lists:
            infos = [received(TensorInfo, t) for t in got]
            seen.update({ti.name for ti in infos})
            for ti in infos:
                first.setdefault(ti.name, ti)
        return [ti for ti in first.values() if anywhere or seen[ti.name] == len(lists)]

    def init_tensor(
        self,
        name: str,
        policy: PolicyName | str,
        row_shape: Sequence[int] = (),
        dtype: str = "float32",
        *,
        init: str = "zeros",
        init_args: Mapping[str, Any] | None = None,
        persistent: bool = False,
        exist_ok: bool = False,
    ) -> TensorInfo:
        """Create a tensor on every partition (rows split by ``policy``)."""
        lookup_policy(self.policies, policy)
        body = {
            "name": name,
            "policy": str(policy),
            "dtype": str(np.dtype(dtype)),
            "row_shape": [int(x) for x in row_shape],
            "init": init,
            "init_args": dict(init_args or {}),
            "persistent": persistent,
            "exist_ok": exist_ok,
        }
        replies = self.session.call_all("init", body)
        infos = {p: received(TensorInfo, r.body["info"]) for p, r in replies.items()}
        for p, ti in infos.items():
            for backup in self.session.parts[p].conns[1:]:
                backup.call("attach", {**self.session.base(), "name": ti.name})
        return self.catalog.replace(name, infos)

    def delete_tensor(self, name: str) -> None:
        self.session.call_all("delete", {"name": name})
        self.catalog.forget(name)

    def pull_pieces(self, row_bytes: int, group: routing.Group) -> list[routing.Group]:
        """One owner's rows (``row_bytes`` of answer each) as pieces of about
        ``pull_chunk_bytes`` of answer each, all in flight at once (and every ids frame
        within the request limit)."""
        limit = self.cfg.pull_chunk_bytes
        if limit is None:
            limit = DEFAULT_CURVE_CHUNK if self.cfg.keys is not None else 0
        n = len(group.ids)
        k = 1 if limit <= 0 else max(1, min(n * row_bytes // limit, self.cfg.max_chunks))
        k = max(k, -(-n * group.ids.itemsize // REQUEST_FRAME_BYTES))
        return group.pieces(k)

    def pull(
        self, name: str, ids: Any, out: np.ndarray | None = None, at: np.ndarray | None = None
    ) -> np.ndarray:
        """Rows ``ids`` (global ids of the tensor's id space) in the given order.

        With ``out``, row ``i`` is written to ``out[at[i]]`` (``out[i]`` without ``at``)
        and ``out`` is returned: a caller assembling rows from several sources saves a
        copy."""
        ti = self.meta(name)
        pol = lookup_policy(self.policies, ti.policy)
        if self._routes_live(ti, pol):
            got = self._pull_live(ti, pol, ids)
            if out is None:
                return got
            out[at if at is not None else slice(None)] = got
            return out
        ids = pol.check_ids(ids)
        local: dict[int, np.ndarray | DiskRows] = {}
        groups: list[routing.Group] = []
        for g in routing.by_owner(pol.ranges, ids):
            arr = self._local(ti, g.part) if self.session.local_ok(g.part) else None
            if arr is None:
                groups += self.pull_pieces(ti.row_bytes, g)
            else:
                local[g.part] = arr
                groups.append(g)
                self.traffic[g.part, "pull:shm"] += len(g.ids) * ti.row_bytes

        whole = out is None and len(groups) == 1 and isinstance(groups[0].pos, slice)
        if out is None and not whole:
            out = np.empty((len(ids), *ti.row_shape), dtype=ti.dtype)

        def place(g: routing.Group) -> np.ndarray | slice:
            return g.pos if at is None else at[g.pos]

        def gather(g: routing.Group) -> np.ndarray | None:
            src = local[g.part]
            if isinstance(src, DiskRows):  # the server's cache, then this process's mapping
                return src.take(g.rows)
            # ids are checked already; mode="clip" keeps np.take from buffering its output
            if out is None:
                return np.take(src, g.rows, axis=0, mode="clip")
            routing.take_into(out, place(g), src, g.rows)  # straight into place
            return None

        answers = routing.remote_first(
            groups,
            local.__contains__,
            lambda g: self.session.request(g.part, "pull", {"name": name}, (g.rows,)),
            lambda pending: self.session.wait(pending).tensors[0],
            gather,
        )
        if out is None:  # one owner, one piece: the frame or the gather as is
            rows = next(answers)[1]
            assert rows is not None
            return rows
        for g, rows in answers:
            if rows is not None:
                routing.put_into(out, place(g), rows)
        return out

    def local_block(self, name: str, near: Any = None) -> tuple[int, np.ndarray] | None:
        """The rows of ``name`` that a co-located partition holds, mapped from its shared
        memory (read in place: no copy, read-only), and the global id of the first; of
        several, the one owning most of the ids ``near``. None when no partition's memory
        is readable here, the tensor is on disk or a live graph routes its ids (then
        :meth:`pull` the rows)."""
        ti = self.meta(name)
        pol = lookup_policy(self.policies, ti.policy)
        if ti.disk or self._routes_live(ti, pol):
            return None
        parts = self.local_parts
        if len(parts) > 1 and near is not None:
            owned = np.bincount(pol.to_part(pol.check_ids(near)), minlength=pol.num_parts)
            parts.sort(key=lambda p: -owned[p])
        for part in parts:
            arr = self.catalog.local_array(ti, part) if self.session.local_ok(part) else None
            if arr is not None:
                return int(pol.ranges[part]), arr
        return None

    def _local(self, ti: TensorInfo, part: int) -> np.ndarray | DiskRows | None:
        """A co-located partition's rows of ``ti``: its shared memory, or for a disk tensor
        the server's cache and the file (:meth:`Catalog.local_disk`); None: pull them."""
        if ti.disk:
            return self.catalog.local_disk(ti, part)
        return self.catalog.local_array(ti, part)

    def push(
        self,
        name: str,
        ids: Any,
        values: np.ndarray,
        reducer: str = "assign",
        params: Mapping[str, Any] | None = None,
        states: Sequence[str] = (),
    ) -> None:
        """Apply ``reducer`` to rows ``ids`` with ``values`` on their owners' servers."""
        ti = self.meta(name)
        pol = lookup_policy(self.policies, ti.policy)
        live = self._routes_live(ti, pol)
        if live:
            ids, part, rows = self._route_live(pol, ids)
            groups = [routing.Group(p, np.flatnonzero(part == p), rows[part == p])
                      for p in routing.parts_of(part)]  # fmt: skip
        else:
            ids = pol.check_ids(ids)
            groups = list(routing.by_owner(pol.ranges, ids))
        values = np.asarray(values)
        if values.ndim == 0 or len(values) != len(ids):
            raise ArgumentError(
                f"values: {values.shape[:1] or 'a scalar'} rows for {len(ids)} ids of {name!r}"
            )
        body: dict[str, Any] = {"name": name, "reducer": reducer, "params": dict(params or {})}
        body["states"] = list(states)
        if live:  # new nodes' rows exist at the version (a write carries none by itself)
            body["v"] = self.version
        pend: deque[tuple[Pending, int]] = deque()
        errors: list[GraphrunError] = []
        in_flight = 0

        def wait_oldest() -> int:
            request, nbytes = pend.popleft()
            try:
                self.session.wait(request)
            except GraphrunError as exc:
                errors.append(exc)
            return nbytes

        for g in groups:
            for piece in _push_pieces(g.rows, values[g.pos]):
                nbytes = piece[0].nbytes + piece[1].nbytes
                while pend and in_flight + nbytes > PUSH_WINDOW_BYTES:
                    in_flight -= wait_oldest()
                sent = self.session.request(g.part, "push", body, piece, main_only=True)
                pend.append((sent, nbytes))
                in_flight += nbytes
        while pend:
            wait_oldest()
        if errors:
            raise errors[0]

    def _groups(self, ti: TensorInfo, ids: Any) -> tuple[int, list[routing.Group]]:
        """How many ``ids`` (of ``ti``'s id space) there are, and their groups by owner."""
        pol = lookup_policy(self.policies, ti.policy)
        if self._routes_live(ti, pol):
            ids, part, rows = self._route_live(pol, ids)
            return len(ids), [routing.Group(p, np.flatnonzero(part == p), rows[part == p])
                              for p in routing.parts_of(part)]  # fmt: skip
        ids = pol.check_ids(ids)
        return len(ids), list(routing.by_owner(pol.ranges, ids))

    def route(self, name: str, ids: Any) -> list[routing.Group]:
        """``ids`` of tensor ``name`` grouped by owner partition (with their local rows),
        as a write of them goes: for an op of one's own on a tensor's rows."""
        return self._groups(self.meta(name), ids)[1]

    def push_tables(self, items: Sequence[tuple[str, Any, np.ndarray]]) -> None:
        """``assign`` rows of several tensors, ``(name, ids, values)`` each: one
        ``push_tables`` request per owner partition carrying every tensor's rows there
        (a refresh writes six tables: two requests, not a dozen), all in flight at once;
        a tensor's rows too big for one request are pushed alone (:meth:`push`)."""
        self.send_tables(items)()

    def send_tables(self, items: Sequence[tuple[str, Any, np.ndarray]]) -> Callable[[], None]:
        """:meth:`push_tables`, its first request a partition sent now: a callable that
        waits for their answers, sends the rest (rows past one request's bytes) and
        raises the first error once every answer is in. The values must not change
        until it returns (a refresh computes its next rows meanwhile)."""
        batch: dict[int, list[tuple[str, np.ndarray, np.ndarray]]] = {}
        routed: dict[tuple[str, int], tuple[Any, int, list[routing.Group]]] = {}
        live = False
        for name, ids, values in items:
            values = np.asarray(values)
            if values.nbytes > REQUEST_FRAME_BYTES // 2:
                self.push(name, ids, values)
                continue
            ti = self.meta(name)
            key = (ti.policy, id(ids))  # tables of the same ids (and policy): routed once
            if key not in routed or routed[key][0] is not ids:
                routed[key] = (ids, *self._groups(ti, ids))
            _, n, groups = routed[key]
            live = live or self._routes_live(ti, lookup_policy(self.policies, ti.policy))
            if values.ndim == 0 or len(values) != n:
                raise ArgumentError(f"values: {values.shape[:1] or 'a scalar'} rows for "
                                    f"{n} ids of {name!r}")  # fmt: skip
            for g in groups:
                batch.setdefault(g.part, []).append((name, g.rows, values[g.pos]))
        turns = itertools.zip_longest(*(_table_requests(got) for got in batch.values()))
        parts = list(batch)

        def send() -> list[Pending]:  # the next turn: one request a partition in flight
            turn = next(turns, None)
            out: list[Pending] = []
            for part, some in zip(parts, turn or [None] * len(parts), strict=True):
                if some is None:
                    continue
                body: dict[str, Any] = {"names": [n for n, _, _ in some]}
                if live:
                    body["v"] = self.version
                frames = [a for _, r, v in some for a in (r, np.ascontiguousarray(v))]
                out.append(self.session.request(part, "push_tables", body, frames))
            return out

        first = send()

        def wait() -> None:
            errors: list[GraphrunError] = []
            pending = first
            while pending:
                try:  # every answer before an error is raised
                    self.session.wait_all(pending)
                except GraphrunError as exc:
                    errors.append(exc)
                pending = send()
            if errors:
                raise errors[0]

        return wait

    @overload
    def reduce(self, name: str, how: Literal["nonzero"]) -> np.ndarray: ...
    @overload
    def reduce(self, name: str, how: Reduction) -> float | None: ...
    def reduce(self, name: str, how: Literal["nonzero"] | Reduction) -> np.ndarray | float | None:
        """A reduction of a whole tensor computed by its servers: ``max``, ``min``,
        ``sum`` or ``count_nonzero`` (a number, None for an empty tensor), or
        ``nonzero``: the ascending global ids of the rows with a non-zero element."""
        if how != "nonzero" and how not in REDUCTIONS:
            raise ArgumentError(f"how: {how!r} is not one of {['nonzero', *REDUCTIONS]}")
        pol = self.policy(name)
        replies = self.session.call_all("reduce", {"name": name, "how": how})
        if how == "nonzero":
            rows = [replies[p].tensors[0] + pol.ranges[p] for p in sorted(replies)]
            return np.concatenate(rows).astype(np.int64, copy=False)
        values = [r.body["value"] for r in replies.values() if r.body["value"] is not None]
        return REDUCTIONS[how](values) if values else None

    # ---- structure and administration ------------------------------------------------

    def local_structure(self, part: int) -> dict[str, np.ndarray] | None:
        """The CSC arrays of a co-located partition, mapped read-only (None if remote)."""
        return self.catalog.local_structure(part)

    def stats(self, part: int, index: int | None = None) -> dict[str, Any]:
        """Partition ``part``'s server's counters: its main server (its replica once the
        primary is lost, as any request), or the ``index``-th of its connections."""
        if index is None:
            return dict(self.session.call(part, "stats", main_only=True).body)
        conn = self.session.part(part).conns[index]
        return dict(conn.call("stats", self.session.base()).body)

    def disk_counters(self) -> dict[str, int] | None:
        """The disk counters (:mod:`graphrun.store.disk`) of every partition's main server,
        summed; None when no server serves features from disk (or a job key asks: ``stats``
        shows them to the admin key only)."""
        got = [self.stats(p).get("disk") or {} for p in range(self.num_parts)]
        if not any(d.get("tensors") for d in got):
            return None
        return {k: sum(int(d.get(k, 0)) for d in got) for k in DISK_COUNTERS}

    def close(self) -> None:
        """Leave every server (frees this job's tensors if it was the last client)."""
        if self._closed:
            return
        self._closed = True
        if hasattr(self, "_at_exit"):
            atexit.unregister(self._at_exit)
        if hasattr(self, "catalog"):
            self.catalog.clear()
        if hasattr(self, "session"):
            self.session.close()

    def __enter__(self) -> KVClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ClientConfig", "KVClient", "Pending"]
