"""Data-parallel set-up: one ``torch.distributed`` process group per job.

Trainers rendezvous at the job's address (``hosts.rendezvous``): with the job's key pair
(``DDPConfig.keys``, what the trainers get on Kubernetes) a CURVE-authenticated store
served by trainer 0 or, ``serve_rendezvous=False``, by ``graphrun rendezvous`` apart
(:mod:`graphrun.train.rendezvous`) instead of torch's TCPStore, which
answers anyone; without one a TCP store trainer 0 opens on its machine's address only, or
a file on one host (:mod:`graphrun.partition.rendezvous`). gloo on CPU, NCCL when the
trainer computes on a CUDA device (``accelerator``, :mod:`graphrun.train.device`).
Nothing is read from the environment; :class:`DDPConfig` carries rank, world size,
address, key and device.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from graphrun.errors import ArgumentError
from graphrun.partition.rendezvous import join, parse_rendezvous
from graphrun.rpc.auth import KeyPair
from graphrun.train.device import backend_for
from graphrun.train.sockets import opened, port_of


@dataclass(frozen=True)
class DDPConfig:
    rank: int
    world_size: int
    rendezvous: str  # "host:port" (a TCP store on trainer 0), or "file:///path" (one host)
    backend: str | None = None  # None: nccl on a CUDA accelerator, else gloo
    timeout_s: float = 300.0
    keys: KeyPair | None = None  # the job's: a CURVE rendezvous at a "host:port" address
    accelerator: str | None = None  # "cpu", "cuda:i" (graphrun.train.device); None: cpu
    # trainer 0 serves the CURVE rendezvous; False: `graphrun rendezvous` serves it apart
    # (hosts.rendezvous_external, the operator's rendezvous pod) and trainer 0 only joins
    serve_rendezvous: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ArgumentError(f"rank: {self.rank} is not in [0, {self.world_size})")

    @property
    def device(self) -> torch.device:
        if self.accelerator is not None:
            return torch.device(self.accelerator)
        if self.resolved_backend == "nccl":
            return torch.device("cuda", self.rank % torch.cuda.device_count())
        return torch.device("cpu")

    @property
    def resolved_backend(self) -> str:
        if self.backend:
            return self.backend
        return backend_for(self.accelerator or "cpu")  # a GPU only where the job asks for one

    @property
    def collective_device(self) -> torch.device:
        """Where the loop's small all-reduces live: NCCL reduces CUDA tensors only."""
        return self.device if self.resolved_backend == "nccl" else torch.device("cpu")


@contextlib.contextmanager
def process_group(
    cfg: DDPConfig, joining: bool = False, sockets: set[tuple[int, int]] | None = None
) -> Iterator[Any]:
    """Join the trainers' process group for the duration of the block; yields the
    rendezvous store when it is the job's CURVE store (elastic trainers meet there again),
    else None. ``joining``: an elastic trainer that comes in later
    (:meth:`graphrun.train.elastic.Regroup.join`) only gets the store: it neither serves it
    nor forms the first group. ``sockets``: gets the group's connections
    (:func:`graphrun.train.sockets.opened`; with a CURVE or file rendezvous, those an
    elastic trainer re-forms at), which a re-form shuts."""
    store: Any = None
    port = port_of(cfg.rendezvous) if cfg.keys is not None else None
    noted = opened(sockets, port) if sockets is not None else contextlib.nullcontext()
    with contextlib.ExitStack() as stack:
        if cfg.keys is not None and "://" not in cfg.rendezvous:
            from graphrun.train.rendezvous import key_store

            serve = cfg.rank == 0 and cfg.serve_rendezvous and not joining
            store = stack.enter_context(
                key_store(cfg.rendezvous, cfg.rank, cfg.keys, cfg.timeout_s, serve=serve)
            )
            if not joining:
                with noted:
                    dist.init_process_group(
                        cfg.resolved_backend, store=store, rank=cfg.rank,
                        world_size=cfg.world_size, timeout=timedelta(seconds=cfg.timeout_s),
                    )  # fmt: skip
        elif not joining:  # torch's own TCP rendezvous would listen on every interface: not here
            url = cfg.rendezvous if "://" in cfg.rendezvous else f"tcp://{cfg.rendezvous}"
            rdv = parse_rendezvous(url, flag="rendezvous")
            # a tcp:// rendezvous opens its store's connections here too: not noted
            with noted if rdv.scheme == "file" else contextlib.nullcontext():
                join(rdv, cfg.rank, cfg.world_size, cfg.timeout_s, backend=cfg.resolved_backend)
        try:
            yield store
        finally:
            if dist.is_initialized():  # an elastic group may have ended as one trainer
                dist.destroy_process_group()


def wrap(model: torch.nn.Module, cfg: DDPConfig) -> torch.nn.Module:
    """``model`` on the trainer's device, wrapped in DDP when there is more than one trainer."""
    model = model.to(cfg.device)
    if cfg.world_size == 1:
        return model
    ids = [cfg.device.index] if cfg.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def all_sum(values: list[float], cfg: DDPConfig) -> list[float]:
    """Element-wise sum over all trainers (identity with one trainer)."""
    t = torch.tensor(values, dtype=torch.float64, device=cfg.collective_device)
    if cfg.world_size > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [float(v) for v in t]


def all_min(value: int, cfg: DDPConfig) -> int:
    """The minimum over all trainers (used to give every trainer the same batch count)."""
    return _all_reduce_int(value, cfg, dist.ReduceOp.MIN)


def all_max(value: int, cfg: DDPConfig) -> int:
    """The maximum over all trainers (e.g. whether any of them was told to stop)."""
    return _all_reduce_int(value, cfg, dist.ReduceOp.MAX)


def _all_reduce_int(value: int, cfg: DDPConfig, op: Any) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=cfg.collective_device)
    if cfg.world_size > 1:
        dist.all_reduce(t, op=op)
    return int(t.item())


def all_gather_rows(values: list[float], cfg: DDPConfig) -> list[list[float]]:
    """Every trainer's ``values`` (one list of the same length each), in rank order."""
    t = torch.tensor(values, dtype=torch.float64, device=cfg.collective_device)
    if cfg.world_size == 1:
        return [t.tolist()]
    out = [torch.empty_like(t) for _ in range(cfg.world_size)]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


class AllreduceTimer:
    """The wall time of DDP's gradient all-reduces (a communication hook): per step, from
    the first bucket's all-reduce starting to the last one finishing, which overlaps the
    backward pass. :meth:`take` returns the seconds since the last call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: float | None = None
        self._last = 0.0
        self.seconds = 0.0

    @classmethod
    def attach(cls, model: torch.nn.Module) -> AllreduceTimer | None:
        """A timer on ``model``'s all-reduces, or None when it is not DDP."""
        if not isinstance(model, DistributedDataParallel):
            return None
        timer = cls()
        model.register_comm_hook(timer, _timed_allreduce)
        return timer

    def _start(self) -> float:
        now = time.perf_counter()
        with self._lock:
            if self._first is None:
                self._first = now
        return now

    def _end(self) -> None:
        with self._lock:
            self._last = time.perf_counter()

    def take(self) -> float:
        """The step's all-reduce span (call after the step; 0 without all-reduces)."""
        with self._lock:
            span = self._last - self._first if self._first is not None else 0.0
            self._first = None
        self.seconds += max(span, 0.0)
        return max(span, 0.0)


def _timed_allreduce(timer, bucket):
    # no annotations: DDP checks them, and postponed ones are strings it refuses
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    timer._start()
    fut = allreduce_hook(None, bucket)  # type: ignore[arg-type]

    def done(f: Any) -> torch.Tensor:
        timer._end()
        return f.value()

    return fut.then(done)


def barrier() -> None:
    """Wait until every trainer gets here."""
    dist.barrier()
