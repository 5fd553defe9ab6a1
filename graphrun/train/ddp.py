"""Data-parallel set-up: one ``torch.distributed`` process group per job.

Trainers rendezvous at the job's TCP address (``hosts.rendezvous``, on trainer 0's
machine): gloo on CPU, NCCL when the trainer has a CUDA device. With the job's key
pair (``DDPConfig.keys``, what the trainers get) the rendezvous is a CURVE-authenticated
store served by trainer 0 (:mod:`graphrun.train.rendezvous`) instead of torch's
TCPStore, which answers anyone. Nothing is read from the environment;
:class:`DDPConfig` carries rank, world size, address and key.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from graphrun.errors import ArgumentError
from graphrun.rpc.auth import KeyPair


@dataclass(frozen=True)
class DDPConfig:
    rank: int
    world_size: int
    rendezvous: str  # "host:port" (a TCP store on trainer 0), or "file:///path" (one host)
    backend: str | None = None  # None: nccl with CUDA, else gloo
    timeout_s: float = 300.0
    keys: KeyPair | None = None  # the job's: a CURVE rendezvous at a "host:port" address

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ArgumentError(f"rank: {self.rank} is not in [0, {self.world_size})")

    @property
    def device(self) -> torch.device:
        if self.resolved_backend == "nccl":
            return torch.device("cuda", self.rank % torch.cuda.device_count())
        return torch.device("cpu")

    @property
    def resolved_backend(self) -> str:
        if self.backend:
            return self.backend
        return "nccl" if torch.cuda.is_available() else "gloo"


@contextlib.contextmanager
def process_group(cfg: DDPConfig) -> Iterator[None]:
    """Join the trainers' process group for the duration of the block."""
    timeout = timedelta(seconds=cfg.timeout_s)
    with contextlib.ExitStack() as stack:
        if cfg.keys is not None and "://" not in cfg.rendezvous:
            from graphrun.train.rendezvous import key_store

            store = stack.enter_context(
                key_store(cfg.rendezvous, cfg.rank, cfg.keys, cfg.timeout_s)
            )
            dist.init_process_group(
                cfg.resolved_backend, store=store, rank=cfg.rank, world_size=cfg.world_size,
                timeout=timeout,
            )  # fmt: skip
        else:
            init = cfg.rendezvous if "://" in cfg.rendezvous else f"tcp://{cfg.rendezvous}"
            dist.init_process_group(
                cfg.resolved_backend, init_method=init, rank=cfg.rank,
                world_size=cfg.world_size, timeout=timeout,
            )  # fmt: skip
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
    t = torch.tensor(values, dtype=torch.float64)
    if cfg.world_size > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [float(v) for v in t]


def all_min(value: int, cfg: DDPConfig) -> int:
    """The minimum over all trainers (used to give every trainer the same batch count)."""
    t = torch.tensor([value], dtype=torch.int64)
    if cfg.world_size > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def barrier() -> None:
    """Wait until every trainer gets here."""
    dist.barrier()
