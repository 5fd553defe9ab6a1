"""Who trains together: the one object the loop asks for the group.

The loop (:func:`graphrun.train.loop.fit`) runs every epoch and every evaluation
through its :class:`Membership` and reads the group from it — the context and the
all-reduce timer now in use, the machines the trainers are on, what the epoch's record
says about the group — as torchft's ``Manager`` keeps quorum and commit out of the
training loop.

* :class:`Membership`, a group that never changes (every run without
  ``runtime.elastic``): the work runs once, a failed collective ends the run, and the
  epoch's record says nothing about membership.
* :class:`ElasticMembership` (``ctx.elastic``, :mod:`graphrun.train.elastic`): a
  collective that failed because a machine is gone re-forms the group of the survivors
  and the rest of the work runs on it (:mod:`graphrun.train.reform`); trainers waiting
  to join come in at an epoch boundary; the epoch's record gets ``world_sizes`` (each
  ``[first step, world size]``) and, when any, ``reforms`` and ``rejoins`` (the
  ``reformed`` and ``rejoined`` events).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from torch import Tensor

from graphrun.record import emit
from graphrun.train.context import TrainContext
from graphrun.train.ddp import AllreduceTimer
from graphrun.train.elastic import EpochWork, peer_lost
from graphrun.train.reform import (
    admit_joiners,
    join_group,
    reform,
    reform_training,
    reformed_event,
)
from graphrun.train.suspend import Position
from graphrun.train.tasks import Task
from graphrun.wire import to_builtins


class Attempt(Protocol):
    """One try at an epoch in the group of ``ctx``: ``work``, what it did so far;
    ``rest``, this trainer's seeds for the rest of it (after a re-form); ``at``, the
    mid-epoch position to start from. Returns the epoch's result."""

    def __call__(
        self,
        ctx: TrainContext,
        *,
        timer: AllreduceTimer | None,
        at: Position | None,
        work: EpochWork,
        rest: Tensor | None,
    ) -> dict[str, Any]: ...


# one try at an evaluation in the group of ``ctx``: its scores
Evaluation = Callable[[TrainContext], dict[str, float]]


class Membership:
    """A group that never changes: the trainers that started are those that finish."""

    joining = False  # whether this trainer waits to come into a running group

    def __init__(self, ctx: TrainContext) -> None:
        self.ctx = ctx
        self.timer: AllreduceTimer | None = None

    def bind(self, task: Task) -> None:
        """The task whose model, optimiser and data the group trains (made or resumed)."""
        self.task = task
        self.timer = AllreduceTimer.attach(task.model)

    def join(self) -> tuple[Task, int] | None:
        """Wait to be let into the running group; the task and the first epoch, or None
        when the trainers finished first. Only for a joiner (:attr:`joining`)."""
        raise NotImplementedError("only an elastic trainer joins a running group")

    def start(self) -> None:
        """Training begins (after the first group made or resumed the task)."""

    def train(self, epoch: int, run: Attempt, at: Position | None, admit: bool) -> dict[str, Any]:
        """Run ``epoch`` (from ``at``, a mid-epoch checkpoint's position, if given).
        ``admit``: first let in the trainers waiting to join (an epoch boundary)."""
        return run(self.ctx, timer=self.timer, at=at, work=EpochWork(), rest=None)

    def evaluate(self, epoch: int, steps: int, run: Evaluation) -> dict[str, float]:
        """Run ``epoch``'s evaluation (after its ``steps`` training steps)."""
        return run(self.ctx)

    def machines(self) -> tuple[str, ...]:
        """The machine of each rank of the group now (rank order)."""
        return self.ctx.config.machines

    def fields(self) -> dict[str, Any]:
        """What the last epoch's record says about the group (nothing: it never changed)."""
        return {}

    def close(self) -> None:
        """Training is over (or failed)."""


class ElasticMembership(Membership):
    """The survivors of a lost machine re-form and go on; joiners come in at an epoch
    boundary (``ctx.elastic``: a :class:`~graphrun.train.elastic.Regroup`)."""

    def __init__(self, ctx: TrainContext) -> None:
        super().__init__(ctx)
        self.reg = ctx.elastic
        self.joining = bool(self.reg.joining)
        self.world_sizes: list[list[int]] = []  # this epoch's [first step, world size]
        self.reforms: list[dict[str, Any]] = []  # this epoch's "reformed" events
        self.rejoins: list[dict[str, Any]] = []  # this epoch's "rejoined" events

    def join(self) -> tuple[Task, int] | None:
        joined = join_group(self.ctx)
        if joined is None:
            return None
        task, self.ctx, start = joined
        return task, start

    def start(self) -> None:
        self.reg.shorten_timeout()  # from now on a silent trainer counts as lost

    def train(self, epoch: int, run: Attempt, at: Position | None, admit: bool) -> dict[str, Any]:
        self.world_sizes, self.reforms, self.rejoins = [], [], []
        work, rest = EpochWork(), None
        while True:
            try:
                if admit:
                    admit = False  # once: after a failed admission the group re-forms and goes on
                    self.ctx, self.timer = admit_joiners(
                        self.task, self.ctx, epoch, self.timer, self.rejoins
                    )
                self._note_world(work.done)
                return run(self.ctx, timer=self.timer, at=at, work=work, rest=rest)
            except Exception as exc:
                if not peer_lost(exc):
                    raise
                print(f"trainer {self.reg.ident}: a collective failed ({str(exc)[:200]})",
                      file=sys.stderr, flush=True)  # fmt: skip
                self.ctx, self.timer, rest, event = reform_training(
                    self.task, self.ctx, epoch, work, exc
                )
                self.reforms.append(to_builtins(event))
                at = None

    def _note_world(self, step: int) -> None:
        """The group's size from ``step`` on (a try that failed before its first step
        is replaced by the next)."""
        world = self.ctx.world_size
        if self.world_sizes and self.world_sizes[-1][0] == step:
            self.world_sizes.pop()
        if not self.world_sizes or self.world_sizes[-1][1] != world:
            self.world_sizes.append([step, world])

    def evaluate(self, epoch: int, steps: int, run: Evaluation) -> dict[str, float]:
        """When a machine is lost during it, the survivors re-form and evaluate again,
        over the new group's split of every node (the lost machine's served by its
        replicas); the re-form is noted in the epoch's ``reforms`` and ``world_sizes``
        (from its last step)."""
        while True:
            since = time.time()
            try:
                return run(self.ctx)
            except Exception as exc:
                if not peer_lost(exc):
                    raise
                print(f"trainer {self.reg.ident}: a collective failed in evaluation "
                      f"({str(exc)[:200]})", file=sys.stderr, flush=True)  # fmt: skip
                self.ctx, timer, lost = reform(self.task, self.ctx, exc)
                self.timer = timer or self.timer
                event = reformed_event(self.ctx, epoch, steps, lost, since, "evaluation")
                self.reforms.append(to_builtins(event))
                self.world_sizes.append([steps, self.ctx.world_size])
                if self.ctx.is_main:
                    emit(event)

    def machines(self) -> tuple[str, ...]:
        return tuple(self.reg.machine_of(r) for r in self.reg.members)

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"world_sizes": self.world_sizes}
        if self.reforms:
            out["reforms"] = self.reforms
        if self.rejoins:
            out["rejoins"] = self.rejoins
        return out

    def close(self) -> None:
        if self.reg.ddp.rank == 0:
            self.reg.close_door()  # a trainer still waiting to join ends at once


def membership(ctx: TrainContext) -> Membership:
    """The trainer's group: elastic with ``ctx.elastic``, else fixed."""
    return ElasticMembership(ctx) if ctx.elastic is not None else Membership(ctx)
