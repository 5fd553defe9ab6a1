"""The loop's side of elastic trainers: re-form after a loss, let joiners in, join.

:mod:`graphrun.train.elastic` agrees who is in the group; these functions bring a
task's model, optimiser and data split over to the group it agreed on. A loss is
survived wherever the trainers run collectives of a built-in task: in a training step
or the epoch's closing all-reduces (:func:`reform_training`: the survivors go on from
the step they were at) and in evaluation (:func:`reform`, then the evaluation runs
again on the survivors), both called by
:class:`graphrun.train.membership.ElasticMembership`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, cast

import torch

from graphrun.record import JoinClosed, Reformed, Rejoined, emit
from graphrun.train.context import TrainContext
from graphrun.train.ddp import AllreduceTimer, all_max, unwrap, wrap
from graphrun.train.elastic import (
    EpochWork,
    broadcast_optimizer,
    dropped,
    plan_rest,
    remaining,
    share_optimizer_layout,
)
from graphrun.train.tasks import Task, make_task
from graphrun.wire import to_builtins


def _local(opt: object) -> torch.optim.Optimizer:
    """The trainer's own optimiser: an elastic job syncs by allreduce (its spec refuses
    ``training.sync: ps``), so there is no parameter server's."""
    assert isinstance(opt, torch.optim.Optimizer), "elastic job with a ps optimiser"
    return opt


def reform(
    task: Task, ctx: TrainContext, cause: Exception
) -> tuple[TrainContext, AllreduceTimer | None, list[int]]:
    """Re-form the group of the survivors and bring the task over to it: DDP rebuilt on
    the new group (rank 0's parameters), the optimiser state broadcast, every split of
    the data made again for the new group. Returns the new context, the timer on the
    rebuilt model and the lost trainers (idents); re-raises ``cause`` when nobody is
    gone (the error was not a lost machine's)."""
    reg, data = ctx.elastic, cast(Any, ctx.data)  # a DistGraphData: the store's trainers
    before = reg.members
    # a dropped connection is noticed by every survivor at once; a timeout gives a slow
    # (living) trainer as long again to come
    ddp = reg.reform(None if dropped(cause) else reg.cfg.timeout_s)
    lost = reg.lost_since(before)
    if not lost:  # nobody is gone: the error is not a lost machine's
        raise cause
    ctx = replace(ctx, ddp=ddp)
    task.ctx = ctx
    if ctx.is_main:
        ctx.metrics.enable()
    task.model = wrap(unwrap(task.model), ddp)  # DDP on the new group: rank 0's parameters
    broadcast_optimizer(_local(task.opt), ddp)
    data.regroup(ddp.rank, ddp.world_size, reg.home_parts(data.book.num_parts))
    return ctx, AllreduceTimer.attach(task.model), lost


def reformed_event(
    ctx: TrainContext, epoch: int, step: int, lost: list[int], since: float, phase: str
) -> Reformed:
    """The ``reformed`` event of a re-form in ``phase`` (``training`` or ``evaluation``)
    at ``step`` of ``epoch``; ``since``: the time of the last progress before the loss."""
    reg = ctx.elastic
    return Reformed(
        generation=reg.generation, epoch=epoch, step=step, phase=phase, lost_trainers=lost,
        lost_machines=sorted({reg.machine_of(r) for r in lost}), world_size=ctx.world_size,
        machines=sorted({reg.machine_of(r) for r in reg.members}),
        paused_s=round(time.time() - since, 3), time=round(time.time(), 3),
    )  # fmt: skip


def reform_training(
    task: Task, ctx: TrainContext, epoch: int, work: EpochWork, cause: Exception
) -> tuple[TrainContext, AllreduceTimer | None, torch.Tensor, Reformed]:
    """Re-form the group of the survivors (:func:`reform`), agree on its rank 0's step
    and re-split the rest of the epoch (:mod:`graphrun.train.elastic`); returns the new
    context, the timer on the rebuilt DDP model, this trainer's seeds for the rest of
    the epoch and the ``reformed`` event."""
    data = cast(Any, ctx.data)
    # each trainer's batch order in the broken group (the lost ones' too), before regroup
    orders = work.plan if work.plan is not None else data.train_orders(epoch, task.ntype)
    ctx, timer, lost = reform(task, ctx, cause)
    ddp, parts = ctx.ddp, ctx.elastic.home_parts(data.book.num_parts)
    done = all_max(work.done if ctx.is_main else 0, ddp)  # rank 0's position for all
    rest = remaining(orders, done - work.plan_from, ctx.config.batch_size)

    def split(ids: torch.Tensor, rank: int, world: int) -> torch.Tensor:
        return torch.as_tensor(data.split_seeds(ids, rank, world, parts, task.ntype))

    work.plan = plan_rest(rest, ddp.world_size, split, data.seed, epoch)
    work.plan_from = work.done = done
    event = reformed_event(ctx, epoch, done, lost, work.last_step_at, "training")
    event.rest_seeds = int(rest.numel())
    if ctx.is_main:
        emit(event)
    return ctx, timer, work.plan[ddp.rank], event


def admit_joiners(
    task: Task,
    ctx: TrainContext,
    epoch: int,
    timer: AllreduceTimer | None,
    rejoins: list[dict[str, Any]],
) -> tuple[TrainContext, AllreduceTimer | None]:
    """At the boundary before ``epoch``: let in the trainers waiting to join, if any
    (:mod:`graphrun.train.elastic`, "Re-join"); returns the context and timer now in use
    and adds a ``rejoined`` event per machine to ``rejoins``."""
    reg = ctx.elastic
    asked = reg.agree_joiners(epoch)
    if not asked:
        return ctx, timer
    ddp = reg.grow(sorted(asked), epoch)
    ctx = catch_up(task, replace(ctx, ddp=ddp), wrapped=False)
    timer = AllreduceTimer.attach(task.model)
    now = time.time()
    by_machine: dict[str, list[int]] = {}
    for r in sorted(asked):
        by_machine.setdefault(reg.machine_of(r), []).append(r)
    for machine, idents in sorted(by_machine.items()):
        event = Rejoined(
            machine=machine, trainers=idents, generation=reg.generation, epoch=epoch,
            world_size=ddp.world_size, machines=sorted({reg.machine_of(r) for r in reg.members}),
            waited_s=round(now - min(asked[r] for r in idents), 3), time=round(now, 3),
        )  # fmt: skip
        rejoins.append(to_builtins(event))
        if ctx.is_main:
            emit(event)
    return ctx, timer


def catch_up(task: Task, ctx: TrainContext, wrapped: bool) -> TrainContext:
    """Every trainer of a group that joiners came into: rank 0's parameters (DDP on the
    new group broadcasts them; a joiner's ``make_task`` did, ``wrapped``) and optimiser
    state, and the training nodes split over the new group from the next epoch on."""
    reg, data = ctx.elastic, cast(Any, ctx.data)
    task.ctx = ctx
    if not wrapped:
        task.model = wrap(unwrap(task.model), ctx.ddp)
    share_optimizer_layout(_local(task.opt), ctx.ddp)
    broadcast_optimizer(_local(task.opt), ctx.ddp)
    data.regroup(ctx.rank, ctx.world_size, reg.home_parts(data.book.num_parts))
    return ctx


def join_group(ctx: TrainContext) -> tuple[Task, TrainContext, int] | None:
    """A joiner (``ctx.elastic.joining``): wait to be let in at an epoch boundary, then
    make the task in the grown group and catch up; returns the task, the context and the
    epoch to start, or None when the trainers finished first."""
    reg, stop = ctx.elastic, ctx.stop
    joined = reg.join(stop.is_set if stop is not None else lambda: False)
    if joined is None:
        why = "told to stop" if stop is not None and stop.is_set() else "the trainers finished"
        emit(JoinClosed(trainer=reg.ident, reason=why))
        return None
    ddp, epoch = joined
    ctx = replace(ctx, ddp=ddp)
    task = make_task(ctx)  # its DDP (on the grown group) takes rank 0's parameters
    ctx = catch_up(task, ctx, wrapped=True)
    return task, ctx, epoch
