"""Loader worker processes: sampling and feature fetching off the trainer's process.

Each worker (role ``sampler:<rank>:<w>``) is a process forked from the trainer's
fork server (``multiprocessing``'s ``forkserver``, with torch, PyG and this module
imported once, so a worker starts in milliseconds instead of paying 3 CPU-s of imports,
and a loader without ``persistent_workers`` restarts its workers every epoch at no
cost). A CPU trainer forks that server from itself as it starts (:func:`fork_server_now`);
elsewhere ``multiprocessing`` starts it as a new interpreter, which imports them. A
worker is started without the user's ``__main__`` (a script without a ``__main__``
guard is not run again in it), ends by itself when the trainer dies, and joins the
store with its own client (built from the trainer's :class:`DistConfig`), then loops:
take ``(index, ids, seed, version)`` from its task queue, build the batch, put
``(index, batch, error)`` on the shared result queue. The trainer keeps up to
``prefetch`` batches in flight, hands tasks out round-robin and yields batches in
index order. A trainer following a live graph (docs/live.md) chooses each batch's
version when it hands the task out (the head then, the epoch's, or the pinned one:
:meth:`DistGraph.refresh`) and the worker reads the batch at it, so a batch is the one
the trainer would have built itself at that version.

A worker that dies (killed, out of memory, crashed interpreter) is noticed while
the trainer waits: :class:`~graphrun.errors.JobFailed` names the worker's role,
host and exit code — the trainer never hangs on a batch that will not come. An
exception inside a worker is sent back and re-raised in the trainer (as
:class:`~graphrun.errors.GraphrunError` with the worker's message when it is not
one already).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.multiprocessing as mp

from graphrun.distributed.batches import BatchBuilder, BatchSpec
from graphrun.distributed.context import DistConfig, DistContext
from graphrun.errors import GraphrunError, JobFailed
from graphrun.names import RoleName
from graphrun.parent import exit_with

POLL_S = 0.5
READY = -1


#: what a worker needs, imported once by the fork server (which only imports it)
PRELOAD = ["graphrun.distributed.forkserver"]


def _context(name: str) -> Any:
    ctx = mp.get_context(name)
    if name == "forkserver":  # takes effect when this process starts its fork server
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def fork_server_now() -> None:
    """Start this process's loader fork server now by forking this process, not as a
    new interpreter (what ``multiprocessing`` does at the first worker: 3 CPU-s of torch
    and PyG imports in every trainer with workers). Only at a trainer's start: forked
    there, the server has the trainer's imports and nothing else of it, as a trainer
    forked from the warm server has the server's (:mod:`graphrun.machine.warm`), since
    no thread of torch, zmq or gloo runs yet. Everything after is ``multiprocessing``'s
    own: the workers it forks, its end when this process ends (the "alive" pipe), a
    dead one started again as a new interpreter. A no-op where one runs already; called
    before any other thread of this process starts processes (it takes no lock)."""
    from multiprocessing import forkserver, resource_tracker, util

    fs: Any = forkserver._forkserver  # the one multiprocessing's "forkserver" context uses
    fs.set_forkserver_preload(PRELOAD)
    if hasattr(fs, "_forkserver_authkey") or not hasattr(fs, "_forkserver_alive_fd"):
        return  # not the forkserver this mirrors (3.11-3.13's; 3.14's authenticates)
    if fs._forkserver_pid is not None:
        return
    resource_tracker.ensure_running()  # its workers are handed the tracker's pipe
    address = os.path.join(util.get_temp_dir(), f"listener-{os.urandom(8).hex()}")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # written once, here (as Popen's fork does)
            with contextlib.suppress(Exception):
                stream.flush()
        pid = os.fork()
        if pid == 0:  # the fork server: what the new interpreter would have run
            code = 1
            try:
                keep = sorted({0, 1, 2, listener.fileno(), alive_r})
                for lo, hi in zip([-1, *keep], [*keep, os.sysconf("SC_OPEN_MAX")], strict=True):
                    if hi > lo + 1:  # spawned, it is passed only these
                        os.closerange(lo + 1, hi)
                forkserver.main(listener.fileno(), alive_r, PRELOAD)
            except SystemExit:  # the alive pipe's end: this process ended
                code = 0
            finally:
                os._exit(code)
        os.close(alive_r)
    fs._forkserver_address, fs._forkserver_alive_fd, fs._forkserver_pid = address, alive_w, pid


def _worker_main(
    config: DistConfig, worker: int, spec: BatchSpec, tasks: Any, results: Any, parent: int,
    version: int | None,
) -> None:  # fmt: skip
    # the end of the trainer that started it (killed with SIGKILL, it could not stop its
    # workers): a worker from the fork server is not its child, and PR_SET_PDEATHSIG
    # fires when the starting *thread* ends (a loader built in a short-lived thread)
    exit_with(parent, every_s=POLL_S)
    torch.set_num_threads(1)
    # a SIGTERM to the trainer's process group is the trainer's to handle (it checkpoints
    # between steps, with batches from this worker): its worker ends when told (None) or
    # with it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        ctx = DistContext(config.for_worker(worker))
        if version is not None:  # a followed live graph: read as the trainer does
            ctx.client.follow(version)
        builder = BatchBuilder(ctx, spec)
    except BaseException as exc:  # report why we could not start, then exit
        results.put((READY, None, _describe(exc)))
        return
    results.put((READY, worker, None))
    try:
        while True:
            task = tasks.get()
            if task is None:
                break
            run, index, ids, seed, v = task
            try:
                if v is not None and v != ctx.client.version:
                    ctx.client.follow(v)
                batch = builder.build(ids, seed)
                results.put(((run, index), (batch, builder.last_cost), None))
            except Exception as exc:
                results.put(((run, index), None, _describe(exc)))
    finally:
        ctx.close()
    _end_now(results)


def _end_now(results: Any) -> None:
    """End a worker told to stop without Python's finalisation, as a finished role ends
    (``graphrun.machine.process.exit_now``): with torch and PyG loaded it took 1.5 s or
    more, which the trainer waited for in ``close``. What it put on ``results`` is sent
    first (multiprocessing's own exit would have flushed it)."""
    results.close()
    results.join_thread()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _describe(exc: BaseException) -> tuple[str, str]:
    return (type(exc).__name__, str(exc))


def _reraise(err: tuple[str, str], role: RoleName | str) -> None:
    import graphrun.errors as errors

    cls = getattr(errors, err[0], None)
    if isinstance(cls, type) and issubclass(cls, GraphrunError) and cls is not JobFailed:
        try:
            raise cls(f"{role}: {err[1]}")
        except TypeError:
            pass
    raise GraphrunError(f"{role}: {err[0]}: {err[1]}")


@contextlib.contextmanager
def _user_main_hidden() -> Iterator[None]:
    """Start processes without the user's ``__main__``: a spawned (or forkserver) child
    imports the parent's main module again — the user's script, as ``__mp_main__`` — and
    runs its top level, which in a script without an ``if __name__ == "__main__"`` guard
    (every PyG example) starts the training again inside the worker. The workers need
    nothing from it: their target and arguments are graphrun's."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


class WorkerPool:
    """``num_workers`` worker processes sharing one result queue (``mp_context``:
    ``"forkserver"``, or ``"spawn"`` for a fresh interpreter each); ``version``: the
    live graph's version the trainer reads (None: not following)."""

    def __init__(
        self,
        config: DistConfig,
        spec: BatchSpec,
        num_workers: int,
        start_timeout: float = 300.0,
        mp_context: str = "forkserver",
        version: int | None = None,
    ) -> None:
        ctx = _context(mp_context)
        self.config = config
        self.results: Any = ctx.Queue()
        self.tasks: list[Any] = [ctx.Queue() for _ in range(num_workers)]
        self.procs = [
            ctx.Process(
                target=_worker_main,
                args=(config, w, spec, self.tasks[w], self.results, os.getpid(), version),
                name=str(self.role(w)),
                daemon=True,
            )
            for w in range(num_workers)
        ]
        self._buffer: dict[int, Any] = {}
        self._run = 0
        with _user_main_hidden():
            for p in self.procs:
                p.start()
        try:
            self._wait_ready(start_timeout)
        except BaseException:
            self.close()
            raise

    def role(self, w: int) -> RoleName:
        return RoleName.sampler(self.config.rank, w)

    @property
    def pids(self) -> list[int | None]:
        return [p.pid for p in self.procs]

    def _check_alive(self) -> None:
        for w, p in enumerate(self.procs):
            if not p.is_alive():
                raise JobFailed(
                    self.role(w),
                    self.config.machine or socket.gethostname(),
                    p.exitcode,
                    "loader worker died; its mini-batches will not arrive",
                )

    def _get(self) -> tuple[Any, Any, Any]:
        while True:
            try:
                item: tuple[Any, Any, Any] = self.results.get(timeout=POLL_S)
                return item
            except queue.Empty:
                self._check_alive()
            except (OSError, EOFError, RuntimeError) as exc:
                # a batch whose sender died cannot be received (its shared tensors are gone)
                deadline = time.monotonic() + 10 * POLL_S
                while time.monotonic() < deadline:
                    self._check_alive()
                    time.sleep(POLL_S / 5)
                raise GraphrunError(f"loader: receiving a mini-batch failed ({exc})") from exc

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        ready = 0
        while ready < len(self.procs):
            try:
                index, _worker, err = self.results.get(timeout=POLL_S)
            except queue.Empty:
                self._check_alive()
                if time.monotonic() > deadline:
                    raise GraphrunError(f"loader workers not ready in {timeout} s") from None
                continue
            if err is not None:
                _reraise(err, "loader worker start")
            ready += index == READY

    def run(
        self, tasks: Sequence[tuple[Any, int]], prefetch: int,
        version: Callable[[], int | None] = lambda: None,
    ) -> Iterator[Any]:  # fmt: skip
        """Yield the batches of ``tasks`` (``(ids, seed)``) in order, each read at the
        live graph's ``version()`` when its task is handed out.

        Results of an earlier run that was abandoned half-way are dropped.
        """
        self._run += 1
        run = self._run
        self._buffer.clear()
        workers = len(self.procs)
        sent = 0
        n = len(tasks)

        def send() -> None:
            nonlocal sent
            self.tasks[sent % workers].put((run, sent, *tasks[sent], version()))
            sent += 1

        while sent < min(n, max(1, prefetch)):
            send()
        for want in range(n):
            while want not in self._buffer:
                (got_run, index), batch, err = self._get()
                if got_run != run:
                    continue
                if err is not None:
                    _reraise(err, self.role(index % workers))
                self._buffer[index] = batch
            if sent < n:
                send()
            yield self._buffer.pop(want)

    def close(self) -> None:
        for q, p in zip(self.tasks, self.procs, strict=True):
            if p.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    q.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        self._buffer.clear()
