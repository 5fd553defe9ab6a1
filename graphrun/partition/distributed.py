"""The ``distributed`` partition mode: P ranks, each reading only its chunks.

:func:`partition_rank` is what one rank runs once ``torch.distributed`` is
initialised (any launcher: the local one below, or one process per machine). Rank
``r`` of ``P`` reads the chunks :func:`~graphrun.graph.chunked.rank_chunks` gives it
(its *share*: a contiguous block of original node ids and one of edges), then:

==========  ===============================================================
phase       what happens (module)
==========  ===============================================================
read        its chunks, checked (:mod:`graphrun.graph.chunked`)
graph       edges to the owners of both ends; ghosts; in-degrees (:mod:`.xtrapulp`)
assign      balanced label propagation after XtraPuLP (:mod:`.xtrapulp`)
relabel     new ids, the partition book, quality (:mod:`.shuffle`)
shuffle     nodes, edges and feature rows to their part's rank (:mod:`.shuffle`)
write       ``part-r/`` and ``mapping/part-r/``; rank 0 also ``partition.json``
==========  ===============================================================

Part ``r`` is written by rank ``r`` (so ``P`` ranks make ``P`` parts). Every rank
writes into the same temporary directory (``tmp``), which the launcher renames to
the output when every rank has finished (:func:`run_rank`) — or, where no launcher
watches the ranks (the operator's worker pods), rank 0 does once the others have
written (:func:`run_rank_to_output`). Each phase reports its seconds and the rank's
peak RSS in that phase (:mod:`.peaks`).

:func:`run_local` is the launcher for one machine: P spawned processes meeting in a
private rendezvous file (:mod:`.rendezvous`: nothing listens but gloo, on loopback),
every collective bounded by ``timeout``. A rank that fails or dies ends
the run with one line naming it (and its phase); the temporary directory is removed.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import shutil
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.context import ForkServerContext, SpawnContext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphrun.errors import (
    ArgumentError,
    DatasetError,
    GraphrunError,
    PartitionFormatError,
    PeerLost,
    UserError,
)
from graphrun.files import atomic_dir, commit_dir
from graphrun.graph.chunked import (
    Chunk,
    ChunkedMeta,
    check_chunks,
    load_chunked_meta,
    rank_chunks,
    read_chunks,
)
from graphrun.graph.graph import release
from graphrun.names import owners
from graphrun.partition import balance, shuffle
from graphrun.partition.arrays import ROUND_BYTES, by_rank, pieces
from graphrun.partition.format import (
    DistributedInfo,
    MappingLayout,
    PartInfo,
    WriteOptions,
    shared_output,
    start_shared_output,
    write_config,
)
from graphrun.partition.peaks import Phases
from graphrun.partition.quality import Quality, row_flags
from graphrun.partition.rendezvous import join, parse_rendezvous, private_rendezvous
from graphrun.partition.xtrapulp import INITS, LPOptions, build_local_graph, propagate

if TYPE_CHECKING:  # torch: only a rank imports it, not the launcher
    from graphrun.partition.comm import Comm

PHASES = ("read", "graph", "assign", "relabel", "shuffle", "write")
METHOD = "xtrapulp"


@dataclass(frozen=True)
class DistOptions:
    """What every rank is asked to do (the same on all ranks)."""

    halo_hops: int = 1
    balance_train: bool = False
    balance_edges: bool = False
    tolerance: float = balance.DEFAULT_TOLERANCE
    seed: int = 0
    lp: LPOptions = field(default_factory=LPOptions)
    round_bytes: int = ROUND_BYTES  # bytes a rank sends per round of the large exchanges

    def check(self) -> None:
        if not isinstance(self.halo_hops, int) or self.halo_hops < 0:
            raise ArgumentError(f"halo_hops: expected an integer >= 0, got {self.halo_hops!r}")
        if not math.isfinite(self.tolerance) or self.tolerance < 0:
            raise ArgumentError(f"tolerance: expected a finite number >= 0, got {self.tolerance}")
        if not isinstance(self.round_bytes, int) or not 1 << 10 <= self.round_bytes <= 1 << 30:
            raise ArgumentError(
                f"round_bytes: expected an integer in [1 KiB, 1 GiB], got {self.round_bytes!r}"
            )
        if self.lp.init not in INITS:
            raise ArgumentError(f"init: {self.lp.init!r} is not one of {', '.join(INITS)}")


@dataclass
class RankReport:
    rank: int
    phases: dict[str, dict[str, float]] = field(default_factory=dict)  # seconds, peak_rss_mb
    stats: dict[str, float] = field(default_factory=dict)
    quality: dict[str, Any] = field(default_factory=dict)


def _train_mask(share: shuffle.Share) -> np.ndarray | None:
    """Training nodes of this share (``train_mask`` of any node type), like
    :func:`graphrun.partition.quality.train_mask_of`."""
    a, b = share.chunk.nodes
    nto = share.meta.node_type_offsets
    mask = np.zeros(b - a, dtype=bool)
    found = False
    for t, ntype in enumerate(share.meta.node_types):
        m = share.chunk.ndata.get(ntype, {}).get("train_mask")
        if m is not None:
            lo = max(a, int(nto[t])) - a
            mask[lo : lo + len(m)] = row_flags(m)
            found = True
    return mask if found else None


def _read_share(meta: ChunkedMeta, chunks: range, scratch: Path) -> Chunk:
    """This rank's chunks as one :class:`Chunk` of memory-mapped arrays: one chunk's
    files as they are, several concatenated into files under ``scratch`` (never
    whole in memory: a rank's share is several times the memory it may use)."""
    if len(chunks) == 1:
        chunk = read_chunks(meta, chunks)
        for arr in _arrays(chunk):  # read through to be checked: let go of the pages
            release(arr)
        return chunk
    scratch.mkdir()
    return read_chunks(meta, chunks, into=scratch)


def _arrays(chunk: Chunk) -> list[np.ndarray]:
    feats = [a for kind in (chunk.ndata, chunk.edata) for g in kind.values() for a in g.values()]
    return [chunk.src, chunk.dst, *feats, *chunk.ids.values()]


def _in_degrees(comm: Comm, share: shuffle.Share) -> np.ndarray:
    """In-degree of every node of this share (its edges may be anywhere)."""
    counts = np.zeros(share.meta.num_nodes, dtype=np.int64)
    for _, piece in pieces(share.chunk.dst):
        counts += np.bincount(piece, minlength=len(counts))
    ids = np.flatnonzero(counts)
    counts = counts[ids]
    dest = owners(share.node_bounds, ids)
    got = np.concatenate(comm.exchange(by_rank(dest, comm.world, ids, counts)))
    a, b = share.chunk.nodes
    return np.bincount(got[:, 0] - a, weights=got[:, 1], minlength=b - a)


def _criteria(
    comm: Comm, share: shuffle.Share, opts: DistOptions
) -> tuple[np.ndarray, np.ndarray | None]:
    train = _train_mask(share)
    any_train = comm.allreduce_sum(np.array([train is not None and train.any()], np.int64))[0]
    if opts.balance_train and not any_train:
        raise ArgumentError(
            f"balance_train: graph {share.meta.name!r} has no training nodes "
            "(no node type has a non-empty 'train_mask')"
        )
    a, b = share.chunk.nodes
    cols = [np.ones(b - a)]
    if opts.balance_train:
        cols.append(train.astype(np.float64) if train is not None else np.zeros(b - a))
    in_degree = _in_degrees(comm, share) if opts.balance_edges else None
    if in_degree is not None and comm.allreduce_sum(np.array([in_degree.sum()]))[0] > 0:
        cols.append(in_degree)
    return np.stack(cols, axis=1), train


def partition_rank(
    comm: Comm,
    dataset: str | Path,
    tmp: Path,
    opts: DistOptions,
    on_phase: Callable[[int, str], None] | None = None,
) -> RankReport:
    """Run this rank's share of the distributed mode, writing part ``comm.rank`` into
    ``tmp`` (rank 0 also writes ``partition.json``). Collective: every rank calls it."""
    opts.check()
    report = RankReport(comm.rank)
    clock = Phases(None if on_phase is None else lambda name: on_phase(comm.rank, name))
    phase = clock.start

    phase("read")
    scratch = tmp / f".share-{comm.rank}"  # removed before the last barrier, or with tmp
    meta = load_chunked_meta(dataset)
    world = comm.world
    if meta.num_chunks < world:
        raise ArgumentError(
            f"--parts: {world} ranks need at least {world} chunks; "
            f"{meta.path} has {meta.num_chunks}"
        )
    firsts = [rank_chunks(meta.num_chunks, q, world).start for q in range(world)]
    share = shuffle.Share(
        meta,
        _read_share(meta, rank_chunks(meta.num_chunks, comm.rank, world), scratch),
        np.append(meta.node_bounds[firsts], meta.num_nodes),
        np.append(meta.edge_bounds[firsts], meta.num_edges),
    )
    phase("graph")
    crit, train = _criteria(comm, share, opts)
    graph = build_local_graph(
        comm, share.node_bounds, np.asarray(share.chunk.src), np.asarray(share.chunk.dst)
    )
    phase("assign")
    part, report.stats = propagate(
        comm, graph, crit, world, meta.num_nodes, tolerance=opts.tolerance, seed=opts.seed,
        opts=opts.lp,
    )  # fmt: skip
    del graph, crit
    phase("relabel")
    rl = shuffle.relabel_share(comm, share, part, world)
    # relabelled: the original endpoints are not read again (the shuffle's peak)
    empty = np.empty(0, dtype=np.int64)
    share = replace(share, chunk=replace(share.chunk, src=empty, dst=empty))
    quality = shuffle.measure_share(comm, rl, part, train)
    report.quality = quality.to_dict()
    phase("shuffle")
    got = shuffle.shuffle_share(comm, share, rl, part, tmp, scratch)
    share = replace(share, chunk=replace(share.chunk, ndata={}, edata={}))  # sent: let go
    structure = shuffle.local_structure(comm, rl.book, got, opts.halo_hops)
    phase("write")
    info = shuffle.write_part(tmp, comm, share, rl, got, structure)
    shutil.rmtree(scratch, ignore_errors=True)  # before the output can be renamed
    counts = comm.allgather(np.array([info[k] for k in list(info)[1:]], dtype=np.int64))
    if comm.rank == 0:
        keys = list(info)[1:]
        parts = [PartInfo(dir=f"part-{q}", **dict(zip(keys, map(int, counts[q]), strict=True)))
                 for q in range(world)]  # fmt: skip
        _write_config(tmp, share, rl, opts, quality, parts)
    comm.barrier()
    phase("")
    report.phases = clock.phases
    return report


def _write_config(
    tmp: Path,
    share: shuffle.Share,
    rl: shuffle.Relabelled,
    opts: DistOptions,
    quality: Quality,
    parts: list[PartInfo],
) -> None:
    meta = share.meta
    options = WriteOptions(
        METHOD, opts.halo_hops, opts.balance_train, opts.balance_edges, opts.tolerance, opts.seed
    )
    write_config(
        tmp, options, rl.book, graph_name=meta.name, num_nodes=meta.num_nodes,
        num_edges=meta.num_edges, node_features=meta.node_features,
        edge_features=meta.edge_features, quality=quality, parts=parts,
        id_map_dtypes={t: v.dtype for t, v in meta.id_maps.items()},
        mapping=MappingLayout(
            layout="sharded",
            node_bounds=share.node_bounds.tolist(),
            edge_bounds=share.edge_bounds.tolist(),
        ),
        distributed=DistributedInfo(len(parts), opts.lp.init),
    )  # fmt: skip


# ---- the local launcher ------------------------------------------------------------------


@dataclass(frozen=True)
class DistResult:
    path: Path
    num_parts: int
    seconds: float
    quality: dict[str, Any]
    ranks: list[RankReport]

    def phase_seconds(self) -> dict[str, float]:
        """The slowest rank's seconds per phase."""
        return {p: max(r.phases.get(p, {}).get("seconds", 0.0) for r in self.ranks) for p in PHASES}


def _rank_main(
    rank: int,
    world: int,
    rendezvous: str,
    args: tuple[str, str, DistOptions, float],
    events: Any,
    on_phase: Callable[[int, str], None] | None,
) -> None:
    """One spawned rank: report phases, the result or one error line on ``events``."""
    dataset, tmp, opts, timeout = args
    code = 0

    def tell(r: int, name: str) -> None:
        events.put(("phase", r, name))
        if on_phase is not None:
            on_phase(r, name)

    # every rank on this machine: gloo listens on loopback, not on the address the host
    # name resolves to (this process is ours: its environment is the edge)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        report = run_rank(
            dataset, tmp, world, rank, rendezvous, opts, timeout=timeout, on_phase=tell
        )
        events.put(("done", rank, asdict(report)))
    except UserError as exc:
        events.put(("error", rank, type(exc).__name__, str(exc)))
        code = 2
    except (GraphrunError, OSError) as exc:
        events.put(("error", rank, "peer" if isinstance(exc, PeerLost) else "fail", str(exc)))
        code = 1
    except Exception as exc:  # a bug: keep the traceback on stderr
        traceback.print_exc()
        events.put(("error", rank, "fail", f"{type(exc).__name__}: {exc}"))
        code = 1
    finally:
        events.close()
    os._exit(code)  # skip torch's interpreter teardown


def run_rank(
    dataset: str | Path,
    staging: str | Path,
    parts: int,
    rank: int,
    init_method: str,
    opts: DistOptions = DistOptions(),
    *,
    timeout: float = 600.0,
    on_phase: Callable[[int, str], None] | None = None,
) -> RankReport:
    """One rank, in a process of its own: join the others at ``init_method`` (gloo;
    ``tcp://HOST:PORT`` of rank 0, or ``file://`` on one host, :mod:`.rendezvous`) and
    write part ``rank``
    into ``staging``, the directory its launcher made (:func:`graphrun.files.atomic_dir`)
    and renames when every rank has succeeded (or removes if one fails). The launchers:
    :func:`run_local` and ``graphrun run``'s ``partitioner:<r>`` roles."""
    if not Path(staging).is_dir():
        raise ArgumentError(f"--into: {staging} is not a directory")
    with _joined(dataset, parts, rank, init_method, opts, timeout) as comm:
        return partition_rank(comm, dataset, Path(staging), opts, on_phase)


def run_rank_to_output(
    dataset: str | Path,
    out: str | Path,
    parts: int,
    rank: int,
    init_method: str,
    opts: DistOptions = DistOptions(),
    *,
    timeout: float = 600.0,
    on_phase: Callable[[int, str], None] | None = None,
) -> RankReport:
    """One rank where no launcher watches the ranks (the operator's worker pods, each
    starting its own): rank 0 empties the staging directory they all know by name
    (:func:`~graphrun.partition.format.start_shared_output`) before any rank writes, and
    renames it to ``out`` once every rank has written (the barrier that ends
    :func:`partition_rank`), so ``out`` appears whole or not at all. If rank 0 fails the
    staging directory is removed; a later attempt's rank 0 removes any other leftovers."""
    with _joined(dataset, parts, rank, init_method, opts, timeout) as comm:
        staging = shared_output(out)
        try:
            if rank == 0:
                start_shared_output(out)
            comm.barrier()  # nobody writes before rank 0 has made the directory
            report = partition_rank(comm, dataset, staging, opts, on_phase)
            if rank == 0:
                commit_dir(staging, out)
        except BaseException:
            if rank == 0:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        return report


@contextlib.contextmanager
def _joined(
    dataset: str | Path, parts: int, rank: int, init_method: str, opts: DistOptions,
    timeout: float,
) -> Iterator[Comm]:  # fmt: skip
    """This rank in the gloo process group of ``parts`` ranks (checked first, so bad
    input is one clear line before joining the others)."""
    import torch.distributed as dist

    from graphrun.partition.comm import Comm

    if not 0 <= rank < parts:
        raise ArgumentError(f"--rank: {rank} is not in [0, {parts})")
    opts.check()
    rdv = parse_rendezvous(init_method)
    load_chunked_meta(dataset)
    join(rdv, rank, parts, timeout)
    try:
        yield Comm(round_bytes=opts.round_bytes)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _death(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def run_local(
    dataset: str | Path,
    out: str | Path,
    parts: int,
    opts: DistOptions = DistOptions(),
    *,
    timeout: float = 600.0,
    on_phase: Callable[[int, str], None] | None = None,
    processes: SpawnContext | ForkServerContext | None = None,
) -> DistResult:
    """Partition the chunked ``dataset`` into ``parts`` with ``parts`` local rank
    processes (gloo on loopback) and write the partition directory ``out``.

    ``timeout`` bounds every collective (and the start of every rank); ``on_phase``
    (picklable) is called in a rank at the start of each phase, for tests.
    ``processes``: the ``multiprocessing`` context the ranks start from, a new
    interpreter each (``spawn``) by default; the tests fork them from their fork server,
    which imported torch once (1.6 CPU-s a rank).
    """
    if not isinstance(parts, int) or parts < 1:
        raise ArgumentError(f"--parts: must be a positive integer, got {parts!r}")
    opts.check()
    meta = load_chunked_meta(dataset)  # one clear line before any process starts
    check_chunks(meta)
    if meta.num_chunks < parts:
        raise ArgumentError(
            f"--parts: {parts} ranks need at least {parts} chunks; {meta.path} has "
            f"{meta.num_chunks} (rewrite it with --chunks {parts} or more)"
        )
    if opts.lp.threads == 0:  # the ranks share this machine's cores
        cores = len(os.sched_getaffinity(0))
        opts = replace(opts, lp=replace(opts.lp, threads=max(1, cores // parts)))
    start = time.perf_counter()
    ctx = processes if processes is not None else mp.get_context("spawn")
    events = ctx.SimpleQueue()  # put() writes to the pipe at once: a phase is known before
    # a rank that is killed in it dies
    procs: list[Any] = []
    with atomic_dir(out, DatasetError) as tmp:
        args = (str(dataset), str(tmp), opts, float(timeout))
        try:
            # the ranks meet in a file only this user can open: nothing listens (a TCP
            # rendezvous store listens on every interface, unauthenticated)
            with private_rendezvous() as rendezvous:
                procs += [
                    ctx.Process(
                        target=_rank_main,
                        args=(r, parts, rendezvous, args, events, on_phase),
                        daemon=True,
                    )
                    for r in range(parts)
                ]
                for p in procs:
                    p.start()
                reports = _supervise(procs, events)
        except BaseException:
            started = [p for p in procs if p.pid is not None]  # a failed start() stops the loop
            for p in started:
                if p.is_alive():
                    p.kill()
            for p in started:
                p.join(timeout=10)
            raise
    quality = reports[0]["quality"]
    return DistResult(
        path=Path(out),
        num_parts=parts,
        seconds=time.perf_counter() - start,
        quality=quality,
        ranks=[RankReport(**r) for r in reports],
    )


def _supervise(procs: list[Any], events: Any) -> list[dict[str, Any]]:
    """Wait for every rank; on the first failure raise one line naming the rank."""
    state = _Events(["start"] * len(procs))
    while len(state.done) < len(procs):
        state.read(events, 0.2)
        failed = any(p.exitcode not in (None, 0) for p in procs)
        ended = all(p.exitcode is not None for p in procs)  # yet a report is missing
        if state.errors or failed or (ended and len(state.done) < len(procs)):
            state.read(events, 1.0, linger=True)  # the first cause may be among them
            if state.errors or failed or len(state.done) < len(procs):
                raise _failure(procs, state)
    return [state.done[r] for r in range(len(procs))]


@dataclass
class _Events:
    phase: list[str]
    done: dict[int, dict[str, Any]] = field(default_factory=dict)
    errors: dict[int, tuple[str, str]] = field(default_factory=dict)

    def read(self, events: Any, seconds: float, linger: bool = False) -> None:
        """Take the ranks' messages: wait up to ``seconds`` for the first, return when the
        pipe is empty again — or, with ``linger``, keep taking them for all ``seconds``."""
        end = time.monotonic() + seconds
        got = False
        while True:
            if events.empty():
                if time.monotonic() >= end or (got and not linger):
                    return
                time.sleep(0.02)
                continue
            got = True
            kind, rank, *rest = events.get()
            if kind == "phase":
                self.phase[rank] = rest[0]
            elif kind == "done":
                self.done[rank] = rest[0]
            else:
                self.errors[rank] = (rest[0], rest[1])


USER_ERRORS: dict[str, type[UserError]] = {
    "ArgumentError": ArgumentError,
    "DatasetError": DatasetError,
    "PartitionFormatError": PartitionFormatError,
}


def _failure(procs: list[Any], state: _Events) -> Exception:
    """The error to report: a rank's bad input, else a rank that died without a word,
    else a rank that failed by itself (its own error, not a lost peer; the first to
    report), else the first rank that lost a peer."""
    for _, (kind, msg) in sorted(state.errors.items()):
        if kind not in ("peer", "fail"):
            return USER_ERRORS.get(kind, UserError)(msg)
    for rank, p in enumerate(procs):
        if p.exitcode is not None and rank not in state.errors and rank not in state.done:
            return GraphrunError(
                f"partition rank {rank} died during {state.phase[rank]} "
                f"({_death(p.exitcode)}); no partition was written"
            )
    own = [r for r, (kind, _) in state.errors.items() if kind != "peer"]
    rank = own[0] if own else next(iter(state.errors))
    return GraphrunError(
        f"partition rank {rank} failed during {state.phase[rank]}: {state.errors[rank][1]}"
    )
