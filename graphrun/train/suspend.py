"""Stopping mid-epoch without losing a step: SIGTERM → an exact checkpoint → resume there.

A trainer told to stop (SIGTERM: a suspended or preempted job, ``graphrun run`` stopped)
sets :class:`StopFlag`. The training loop asks before every step (:class:`StopVote`):
an all-reduce (MAX) of every trainer's flag, so all trainers stop before the same step
and no DDP gradient all-reduce is left waiting for a trainer that already stopped. The
vote of a step is sent before it and read before the next (a stop is seen one step
later), so the step's gradient all-reduce is the one collective a step waits on.
They then gather what rank 0 needs for an exact checkpoint (:func:`gather_position`):

* ``step``: the steps of the epoch already taken (the loader's position: every loader
  derives its order and each batch's sampling from ``(seed, epoch, batch)``, so a
  resumed trainer draws the same first ``step`` batches again and drops them);
* every trainer's torch RNG state (dropout masks) after those steps, and its sums of
  the epoch so far (loss, correct, counted, seeds), which the epoch's metrics add up.

The model, the dense optimiser and the store's embedding tables with their sparse
optimiser state are saved as at an epoch end (``graphrun.train.checkpoint``); a run
resumed from it takes the remaining steps of the epoch exactly as the uninterrupted run
did (tested loss for loss: ``tests/local/test_suspend.py``).
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from graphrun.errors import ArgumentError
from graphrun.signals import stop_on_signals
from graphrun.train.ddp import DDPConfig, all_gather_rows, all_max


class StopFlag:
    """Set by SIGTERM (once :meth:`install` ran, in the main thread) or by :meth:`set`.

    The handler sets it from a thread of its own (:mod:`graphrun.signals`): set in the
    handler, a second SIGTERM landing inside the first one's ``Event.set`` waited there
    for the lock under it, and the trainer hung instead of writing its checkpoint."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def install(self) -> StopFlag:
        stop_on_signals(self._event, signals=[signal.SIGTERM])
        return self

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


def stop_agreed(flag: StopFlag | None, ddp: DDPConfig) -> bool:
    """Whether any trainer was told to stop: the same answer on every trainer."""
    return bool(all_max(1 if flag is not None and flag.is_set() else 0, ddp))


class StopVote:
    """:func:`stop_agreed` before every step of an epoch, without a wait of its own.

    :meth:`agreed` reads the vote :meth:`send` started before the step before (the
    first step of a loop votes and waits, as :func:`stop_agreed`). In an all-reduce job
    every trainer sent it before that step's gradient all-reduce, which met them all, so
    it is answered by then: a blocking vote made every step wait for the slowest trainer
    a second time (a median 1.5 ms a step on two netns hosts of a loaded box;
    benchmarks/README.md, "Issue 45: the epoch"). Every trainer still reads the same
    answer before the same step; a stop is seen one step later."""

    def __init__(self, flag: StopFlag | None, ddp: DDPConfig) -> None:
        self.flag, self.ddp = flag, ddp
        self._sent: tuple[torch.Tensor, Any] | None = None

    def agreed(self) -> bool:
        """Whether any trainer was told to stop by the last vote (a fresh one if none is out)."""
        if self._sent is None:
            return stop_agreed(self.flag, self.ddp)
        votes, work = self._sent
        self._sent = None
        work.wait()
        return bool(votes.item())

    def send(self) -> None:
        """Start the vote of this trainer's flag now; :meth:`agreed` reads its answer."""
        if self.ddp.world_size == 1:
            return  # alone: the flag is the answer, read when asked
        mine = 1 if self.flag is not None and self.flag.is_set() else 0
        votes = torch.tensor([mine], dtype=torch.int64, device=self.ddp.collective_device)
        self._sent = votes, dist.all_reduce(votes, op=dist.ReduceOp.MAX, async_op=True)

    def close(self) -> None:
        """Wait for a vote still out (before the collectives that end an epoch)."""
        if self._sent is not None:
            self._sent[1].wait()
            self._sent = None


@dataclass
class Position:
    """Where an epoch stopped, for every trainer (index = rank)."""

    epoch: int
    step: int
    rng: list[torch.Tensor]  # torch.get_rng_state() of each trainer
    sums: torch.Tensor  # float64 [world, 4]: loss, correct, counted, seeds so far

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "step": self.step, "rng": self.rng, "sums": self.sums}

    @staticmethod
    def from_dict(d: dict[str, Any], where: str) -> Position:
        try:
            pos = Position(int(d["epoch"]), int(d["step"]), list(d["rng"]), d["sums"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ArgumentError(f"{where}: field 'position' is malformed ({exc})") from None
        if not isinstance(pos.sums, torch.Tensor) or pos.sums.shape != (len(pos.rng), 4):
            raise ArgumentError(f"{where}: field 'position.sums' is not a [trainers, 4] tensor")
        return pos

    def of_rank(self, rank: int, world_size: int, where: str) -> tuple[torch.Tensor, list[float]]:
        """Trainer ``rank``'s RNG state and sums; the job must have as many trainers."""
        if len(self.rng) != world_size:
            raise ArgumentError(
                f"{where}: taken mid-epoch by {len(self.rng)} trainers; resume it with as many "
                f"(the job has {world_size})"
            )
        return self.rng[rank], [float(v) for v in self.sums[rank]]


def gather_position(epoch: int, step: int, sums: list[float], ddp: DDPConfig) -> Position:
    """Every trainer's RNG state and sums, on every trainer (rank 0 writes them)."""
    rng = torch.get_rng_state()
    all_sums = torch.tensor(all_gather_rows(sums, ddp), dtype=torch.float64)
    if ddp.world_size == 1:
        return Position(epoch, step, [rng], all_sums)
    mine = rng.to(ddp.collective_device)  # NCCL gathers CUDA tensors only
    rngs = [torch.empty_like(mine) for _ in range(ddp.world_size)]
    dist.all_gather(rngs, mine)
    return Position(epoch, step, [r.cpu() for r in rngs], all_sums)
