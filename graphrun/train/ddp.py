"""Data-parallel set-up: one ``torch.distributed`` process group per job.

Trainers rendezvous at the job's address (``hosts.rendezvous``: a TCP store trainer 0
opens on its machine's address only, or a file on one host; see
:mod:`graphrun.partition.rendezvous`): gloo on CPU, NCCL when the trainer computes on a
CUDA device (``accelerator``, :mod:`graphrun.train.device`). Nothing is read
from the environment; :class:`DDPConfig` carries rank, world size and address.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from graphrun.errors import ArgumentError
from graphrun.partition.rendezvous import join, parse_rendezvous
from graphrun.train.device import backend_for


@dataclass(frozen=True)
class DDPConfig:
    rank: int
    world_size: int
    rendezvous: str  # "host:port" (a TCP store on trainer 0), or "file:///path" (one host)
    backend: str | None = None  # None: nccl on a CUDA accelerator, else gloo
    timeout_s: float = 300.0
    accelerator: str | None = None  # "cpu", "cuda:i" (graphrun.train.device); None: cpu

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
def process_group(cfg: DDPConfig) -> Iterator[None]:
    """Join the trainers' process group for the duration of the block (torch's own TCP
    rendezvous would listen on every interface: trainer 0 listens on the given address)."""
    url = cfg.rendezvous if "://" in cfg.rendezvous else f"tcp://{cfg.rendezvous}"
    rdv = parse_rendezvous(url, flag="rendezvous")
    join(rdv, cfg.rank, cfg.world_size, cfg.timeout_s, backend=cfg.resolved_backend)
    try:
        yield
    finally:
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
    t = torch.tensor([value], dtype=torch.int64, device=cfg.collective_device)
    if cfg.world_size > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def barrier() -> None:
    """Wait until every trainer gets here."""
    dist.barrier()
