"""Epochs around a task: equal step counts, evaluation, checkpoints, metrics, profiles.

:func:`fit` runs a built-in task; :func:`run_training` is what a trainer process
calls: it joins the trainers' process group, then runs the task or the user's entry
point with the same :class:`~graphrun.train.context.TrainContext`.

Every trainer takes the same number of steps per epoch (the minimum over trainers,
agreed with one all-reduce), so DDP's gradient all-reduces always pair up.
Evaluation runs on every trainer's share of the split and the counts are summed.
Rank 0 prints one JSON line per epoch::

    {"epoch": 0, "loss": 1.2, "train_acc": 0.61, "val_acc": 0.70, "test_acc": 0.69,
     "epoch_s": 12.3, "seeds_per_s": 8130.0, "steps": 49}

(link prediction: ``train_auc``/``val_auc``/``test_auc``, ``val_mrr``, ...), then the
breakdown gathered from every trainer (:func:`breakdown`: ``world_size``, ``step``
seconds per step of sampling, fetching, compute and the all-reduce within it,
``cache_hit_rate``, ``trainers`` with each one's epoch, CPU seconds, peak RSS and
machine) and writes the checkpoint; with ``tensorboard_dir`` the metrics log writes the
same record as TensorBoard scalars (:mod:`graphrun.train.tensorboard`).
With ``profile_file`` every trainer appends one :class:`~graphrun.placement.profile.BatchRecord`
JSON line per step.
"""

from __future__ import annotations

import importlib
import math
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from functools import partial
from typing import IO, Any

import msgspec
import numpy as np
import torch

from graphrun.errors import ArgumentError, Suspended, UserError
from graphrun.placement.profile import BatchRecord
from graphrun.record import UNSET, FirstStep, Model, Resumed, emit
from graphrun.record import Suspended as SuspendedAt
from graphrun.store.disk import epoch_fields
from graphrun.train.checkpoint import Checkpoint, load_checkpoint, load_states, save_checkpoint
from graphrun.train.config import TrainConfig
from graphrun.train.context import TrainContext
from graphrun.train.data import Batch, GraphData
from graphrun.train.ddp import (
    AllreduceTimer,
    DDPConfig,
    all_gather_rows,
    all_min,
    all_sum,
    barrier,
    process_group,
    unwrap,
)
from graphrun.train.elastic import EpochWork, Regroup
from graphrun.train.membership import membership
from graphrun.train.metrics import MetricsLog, Progress
from graphrun.train.suspend import Position, StopFlag, StopVote, gather_position
from graphrun.train.tasks import Task, describe, make_task


def _nbytes(data: Any) -> int:
    total = 0
    for store in data.stores if hasattr(data, "stores") else [data]:
        for v in store.values():
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
    return total


class Profiler:
    """Per-step BatchRecord lines (placement profile schema) to a file, or nothing."""

    def __init__(self, ctx: TrainContext, model: torch.nn.Module) -> None:
        self.ctx = ctx
        path = ctx.config.profile_file
        self.out: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.out = path.open("a", buffering=1)  # a line per step, readable as it goes
        self.grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self.iteration = 0

    def record(self, batch: Batch, compute_s: float, cpu_s: tuple[float, float]) -> None:
        """``cpu_s``: the process's CPU seconds while it got ``batch`` (sampling and
        fetching, or waiting for a sampler worker) and while it computed the step."""
        self.iteration += 1
        if self.out is None:
            return
        rec = BatchRecord(
            **msgspec.structs.asdict(batch.cost),
            rank=self.ctx.rank, partition=self.ctx.data.partition, iteration=self.iteration,
            compute_s=compute_s, batch_bytes=_nbytes(batch.data), grad_bytes=self.grad_bytes,
            sample_cpu_s=cpu_s[0], compute_cpu_s=cpu_s[1], threads=torch.get_num_threads(),
        )  # fmt: skip
        self.out.write(rec.to_json() + "\n")

    def close(self) -> None:
        if self.out is not None:
            self.out.close()


def _resume(task: Task, ctx: TrainContext) -> tuple[int, Position | None]:
    """Load the last checkpoint into the task; returns the first epoch to run and, for a
    checkpoint taken mid-epoch, where in it to start."""
    cfg = ctx.config
    if not cfg.resume or cfg.checkpoint_dir is None:
        return 0, None
    ckpt = load_checkpoint(cfg.checkpoint_dir)
    if ckpt is None:
        return 0, None
    where = str(cfg.checkpoint_dir)
    pos = Position.from_dict(ckpt.position, where) if ckpt.position is not None else None
    if pos is not None:
        pos.of_rank(ctx.rank, ctx.world_size, where)  # the same trainers, or one clear line
    load_states(ckpt, where, model=unwrap(task.model), optimizer=task.opt)
    if task.embedding is not None and "embedding" in ckpt.sparse and ctx.is_main:
        task.embedding.load_state(ckpt.sparse["embedding"])
    if ctx.is_main:
        emit(Resumed(from_epoch=ckpt.epoch, at_step=UNSET if pos is None else pos.step))
    return ckpt.epoch + 1, pos


def _save(
    task: Task, ctx: TrainContext, epoch: int, metrics: dict[str, Any],
    position: Position | None = None,
) -> None:  # fmt: skip
    if ctx.config.checkpoint_dir is None or not ctx.is_main:
        return
    sparse = {"embedding": task.embedding.state()} if task.embedding is not None else {}
    ckpt = Checkpoint(
        epoch, unwrap(task.model).state_dict(), task.opt.state_dict(), sparse, metrics,
        position.to_dict() if position is not None else None,
    )  # fmt: skip
    save_checkpoint(ctx.config.checkpoint_dir, ckpt)


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of ``torch``'s default generator for ``epoch`` on trainer ``rank``."""
    entropy = [seed & (2**63 - 1), epoch, rank, 0x5EED]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 2)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


# one trainer's epoch as ``fit`` gathers it (all_gather_rows), in this order
_PARTS = ("epoch_s", "sample_s", "fetch_s", "compute_s", "allreduce_s", "cpu_s",
          "peak_rss_mb", "cache_bytes", "remote_bytes", "disk_hit_bytes", "disk_bytes")  # fmt: skip


class _Stopped(Exception):  # control flow in this module only: outside the error tree
    def __init__(self, position: Position) -> None:
        self.position = position


def train_epoch(
    task: Task,
    ctx: TrainContext,
    epoch: int,
    prof: Profiler,
    timer: AllreduceTimer | None = None,
    at: Position | None = None,
    work: EpochWork | None = None,
    rest: torch.Tensor | None = None,
) -> dict[str, Any]:
    """One epoch (from ``at``, a mid-epoch checkpoint's position, if given). Raises
    :class:`_Stopped` before a step once any trainer was told to stop.

    ``work`` keeps what the epoch did so far across a re-formed group
    (:mod:`graphrun.train.membership`); ``rest`` is then this trainer's seed nodes for
    the rest of the epoch."""
    # Every random draw of an epoch (dropout masks; the loaders seed their own generators
    # from (seed, epoch, batch)) follows from (seed, epoch, rank), not from the epochs
    # before: a run resumed from the checkpoint of epoch e - 1 trains epoch e exactly as
    # the uninterrupted run did. A mid-epoch checkpoint adds the step and the RNG state.
    work = work if work is not None else EpochWork()
    it: Iterator[Batch]
    if rest is None:
        torch.manual_seed(epoch_seed(ctx.config.seed, epoch, ctx.rank))
        t0, c0 = time.perf_counter(), time.process_time()
        it = task.epoch_batches(epoch)  # loaders start (sampler workers: seconds) off the clock
        work.t0 += time.perf_counter() - t0
        work.cpu0 += time.process_time() - c0
        # after the loader began the epoch: a followed live graph's new seeds count
        steps = all_min(task.steps_per_epoch(), ctx.ddp)
    else:
        steps = work.done + all_min(-(-int(rest.numel()) // ctx.config.batch_size), ctx.ddp)
        it = task.rest_batches(rest, epoch)
    progress = Progress(steps, f"epoch {epoch}", enabled=ctx.is_main, trainers=ctx.world_size)
    progress.done = work.done
    # this trainer's breakdown: seconds per part, CPU, cache and remote feature bytes
    own = work.own or dict.fromkeys(_PARTS, 0.0)
    work.own = own
    local = set(getattr(ctx.data, "local_parts", (ctx.data.partition,)))
    first = work.done
    if at is not None:  # the loader's position: its first batches again, dropped
        rng, sums = at.of_rank(ctx.rank, ctx.world_size, "")
        work.sums, first = sums, at.step
        for _ in range(first):
            next(it, None)
        torch.set_rng_state(rng)
    loss_sum, correct, counted_f, seeds_f = work.sums
    counted, seeds = int(counted_f), int(seeds_f)
    vote = StopVote(ctx.stop, ctx.ddp)
    for i in range(first, steps):
        if vote.agreed():
            sums = [loss_sum, correct, float(counted), float(seeds)]
            raise _Stopped(gather_position(epoch, i, sums, ctx.ddp))
        vote.send()
        c0 = time.process_time()
        batch = next(it, None)
        if batch is None:
            raise ArgumentError(f"epoch {epoch}: the loader ended before {steps} steps")
        t0, c1 = time.perf_counter(), time.process_time()
        loss, c, n = task.step(batch)
        if not math.isfinite(loss):
            raise UserError(
                f"epoch {epoch}: the training loss became {loss} (trainer {ctx.rank}); "
                "lower training.lr or check the features"
            )
        compute_s = time.perf_counter() - t0
        prof.record(batch, compute_s, (c1 - c0, time.process_time() - c1))
        if prof.iteration == 1 and ctx.is_main:
            emit(FirstStep(time=time.time()))
        loss_sum, correct, counted, seeds = loss_sum + loss, correct + c, counted + n, seeds + n
        work.done, work.last_step_at = i + 1, time.time()
        work.sums = [loss_sum, correct, float(counted), float(seeds)]
        own["sample_s"] += batch.cost.sample_s
        own["fetch_s"] += batch.cost.fetch_s
        own["compute_s"] += compute_s
        own["allreduce_s"] += timer.take() if timer is not None else 0.0
        own["cache_bytes"] += batch.cost.cache_bytes
        own["disk_hit_bytes"] += batch.cost.disk_hit_bytes or 0
        own["disk_bytes"] += batch.cost.disk_bytes or 0
        own["remote_bytes"] += sum(b for q, b in batch.cost.feature_bytes.items() if q not in local)
        progress.update(batch.seeds)
    vote.close()
    elapsed = time.perf_counter() - work.t0
    device_stats = task.path.end_epoch(elapsed)  # stops the feed; GPU idle share, cache hits
    own.update(epoch_s=elapsed, cpu_s=time.process_time() - work.cpu0, peak_rss_mb=_peak_rss_mb())
    tot = all_sum([loss_sum, float(steps), correct, float(counted), float(seeds)], ctx.ddp)
    rows = all_gather_rows([own[k] for k in _PARTS], ctx.ddp)
    return {
        "loss": tot[0] / max(tot[1], 1.0),
        "train": tot[2] / max(tot[3], 1.0),
        "seeds_per_s": tot[4] / max(elapsed, 1e-9),
        "epoch_s": elapsed,
        "steps": steps,
        "trainers": [dict(zip(_PARTS, row, strict=True)) for row in rows],
        **device_stats,
    }


def breakdown(
    trainers: list[dict[str, float]], steps: int, machines: tuple[str, ...],
    allreduce: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """The metrics record's ``world_size``, ``step`` (seconds per step, the trainers'
    mean), ``cache_hit_rate`` (of the remote feature bytes, what the cache served) and
    ``trainers`` (each one's epoch: seconds per part, CPU seconds, peak RSS in MiB).
    Without ``allreduce`` (``training.sync: ps``: the parameter servers' pulls and pushes
    are not timed apart, they are in compute) ``allreduce_s`` is None, not a 0 that
    reads as no synchronisation at all."""
    w = max(len(trainers), 1)
    per_step: dict[str, float | None] = {
        f"{part}_s": round(sum(t[f"{part}_s"] for t in trainers) / w / max(steps, 1), 6)
        for part in ("sample", "fetch", "compute", "allreduce")
    }
    none = {} if allreduce else {"allreduce_s": None}
    per_step.update(none)
    cached = sum(t["cache_bytes"] for t in trainers)
    remote = cached + sum(t["remote_bytes"] for t in trainers)
    out: list[dict[str, Any]] = []
    for r, t in enumerate(trainers):
        row: dict[str, Any] = {"rank": r}
        if r < len(machines):
            row["machine"] = machines[r]
        row.update({k: round(t[k], 4) for k in _PARTS[:6]})
        row["peak_rss_mb"] = round(t["peak_rss_mb"], 1)
        mine = t["cache_bytes"] + t["remote_bytes"]
        row["cache_hit_rate"] = round(t["cache_bytes"] / mine, 4) if mine else None
        out.append({**row, **none})
    return {
        "world_size": len(trainers),
        "step": per_step,
        "cache_hit_rate": round(cached / remote, 4) if remote else None,
        "trainers": out,
    }


def evaluate(task: Task, ctx: TrainContext, final: bool = True) -> dict[str, float]:
    """``{"val_<metric>": .., "test_<metric>": ..}``, averaged over every trainer's seeds
    (``final``: every seed; before it, ``eval_subset`` may limit them)."""
    out = {}
    for split, (sums, count) in task.evaluate_splits(("val", "test"), final).items():
        tot = all_sum([*sums.values(), float(count)], ctx.ddp)
        for name, value in zip(sums, tot, strict=False):
            out[f"{split}_{name}"] = value / max(tot[-1], 1.0)
    return out


def fit(ctx: TrainContext) -> dict[str, Any]:
    """Train a built-in task for ``config.epochs``; returns the last epoch's metrics."""
    torch.manual_seed(ctx.config.seed)
    group = membership(ctx)
    if group.joining:
        joined = group.join()
        if joined is None:
            return {}
        task, start = joined
        at: Position | None = None
    else:
        task = make_task(ctx)
        if ctx.is_main:
            emit(Model(**describe(task)))
        start, at = _resume(task, ctx)
        if ctx.config.resume and ctx.is_main:
            ctx.metrics.rewind(start)  # the epochs run again: their records go
        if ctx.world_size > 1:
            barrier()  # rank 0 restores shared embeddings before anyone reads them
        group.start()
    group.bind(task)
    prof = Profiler(group.ctx, task.model)
    metric = "auc" if ctx.config.task == "link-prediction" else "acc"
    record: dict[str, Any] = {}
    try:
        for epoch in range(start, ctx.config.epochs):
            disk0 = _disk_counters(group.ctx)
            attempt = partial(train_epoch, task, epoch=epoch, prof=prof)
            try:
                tr = group.train(epoch, attempt, at if epoch == start else None, epoch > start)
            except _Stopped as stopped:
                _suspend(task, group.ctx, stopped.position, record)
            record = {"epoch": epoch, "loss": round(tr["loss"], 5)}
            local = [sum(t[k] for t in tr["trainers"]) for k in ("disk_hit_bytes", "disk_bytes")]
            record.update(epoch_fields(disk0, _disk_counters(group.ctx), *local))
            record[f"train_{metric}"] = round(tr["train"], 5)
            last = epoch == ctx.config.epochs - 1
            if epoch % ctx.config.eval_every == 0 or last:
                t0 = time.perf_counter()
                scores = group.evaluate(
                    epoch, int(tr["steps"]), partial(evaluate, task, final=last)
                )
                record.update({k: round(v, 5) for k, v in scores.items()})
                record["eval_s"] = round(time.perf_counter() - t0, 3)
            record.update(
                epoch_s=round(tr["epoch_s"], 4), seeds_per_s=round(tr["seeds_per_s"], 1),
                steps=int(tr["steps"]),
            )  # fmt: skip
            record.update(group.fields())  # elastic: the group's sizes, re-forms, re-joins
            record.update(
                breakdown(tr["trainers"], int(tr["steps"]), group.machines(),
                          allreduce=ctx.ps is None)
            )  # fmt: skip
            record.update({k: v for k, v in tr.items() if k.startswith(("gpu_", "h2d_"))})
            group.ctx.metrics.write(record)
            _save(task, group.ctx, epoch, record)
    finally:
        prof.close()
        group.close()
    return record


def _disk_counters(ctx: TrainContext) -> dict[str, int] | None:
    """The store's disk counters (rank 0, a distributed job whose store serves features
    from disk; else None): the epoch record's ``disk_hit_rate`` and ``disk_bytes``."""
    client = getattr(getattr(ctx.graph, "ctx", None), "client", None)
    return client.disk_counters() if client is not None and ctx.is_main else None


def _suspend(task: Task, ctx: TrainContext, pos: Position, record: dict[str, Any]) -> None:
    """Write the mid-epoch checkpoint (rank 0), wait for it on every trainer, raise
    :class:`~graphrun.errors.Suspended`."""
    _save(task, ctx, pos.epoch - 1, record, pos)
    if ctx.world_size > 1:
        barrier()  # nobody leaves (and the stores stay up) until rank 0 has saved
    if ctx.is_main:
        emit(SuspendedAt(epoch=pos.epoch, step=pos.step))
    raise Suspended(f"stopped before step {pos.step} of epoch {pos.epoch}; checkpoint written")


def load_entry_point(spec: str) -> Callable[[TrainContext], Any]:
    module, _, func = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise ArgumentError(f"entry point {spec!r}: cannot load ({exc})") from exc
    if not callable(fn):
        raise ArgumentError(f"entry point {spec!r}: not callable")
    return fn


def run_training(
    config: TrainConfig,
    data: GraphData,
    ddp: DDPConfig,
    metrics: MetricsLog | None = None,
    graph: Any = None,
    on_done: Callable[[], None] | None = None,
    stop: StopFlag | None = None,
    on_finished: Callable[[int], None] | None = None,
    ps: Any = None,
    join: bool = False,
) -> Any:
    """Join the process group, then run the task or the entry point. Returns its result.

    ``on_finished(rank)`` runs on every rank once its training is over, before the final
    barrier (e.g. to leave the store); ``on_done`` runs on rank 0 once every trainer has
    finished (after that barrier), e.g. to stop the job's store servers, and also once
    they stopped on ``stop`` (raising :class:`~graphrun.errors.Suspended` after their
    checkpoint). ``ps`` (:class:`graphrun.train.ps.PSSettings`): the dense parameters
    live on parameter servers instead of being all-reduced. ``join``: this trainer comes
    into a running elastic group at an epoch boundary instead of forming the first one
    (:mod:`graphrun.train.elastic`, "Re-join"); ``on_finished(-1)`` if it never came in.
    """
    if join and (config.elastic is None or config.entry_point is not None or ddp.world_size < 2):
        raise ArgumentError(
            "--join: only a built-in task of a job with runtime.elastic and more than one "
            "trainer joins a running group"
        )
    metrics = metrics or MetricsLog(
        config.metrics_file, enabled=ddp.rank == 0 and not join,
        tensorboard_dir=config.tensorboard_dir,
    )  # fmt: skip
    sockets: set[tuple[int, int]] = set()  # the first group's connections: a re-form shuts them
    group = process_group(ddp, join, sockets) if ddp.world_size > 1 else nullcontext()
    with group as store:
        regroup = None
        if config.elastic is not None and ddp.world_size > 1 and config.entry_point is None:
            regroup = Regroup(ddp, config.elastic, config.machines, store, join, sockets)
        ctx = TrainContext(config, data, ddp, metrics, graph, stop, ps, regroup)
        try:
            if config.entry_point is not None:
                result = load_entry_point(config.entry_point)(ctx)
            else:
                result = fit(ctx)
        except Suspended:
            if on_done is not None and _rank_now(ddp, regroup) == 0:
                on_done()
            raise
        finally:
            metrics.close()
        if regroup is not None and regroup.joining and not regroup.joined:
            if on_finished is not None:
                on_finished(-1)  # it never came in: in no group
            return result
        now = regroup.ddp if regroup is not None else ddp  # the group it ended in
        if on_finished is not None:
            on_finished(now.rank)
        if now.world_size > 1:
            barrier()
        if on_done is not None and now.rank == 0:
            on_done()
        return result


def _rank_now(ddp: DDPConfig, regroup: Regroup | None) -> int:
    return regroup.ddp.rank if regroup is not None else ddp.rank


def single_process(config: TrainConfig, data: GraphData) -> dict[str, Any]:
    """Train in this process alone (baselines, tests)."""
    ddp = DDPConfig(0, 1, "127.0.0.1:0")
    result = run_training(config, data, ddp)
    return dict(result) if isinstance(result, dict) else {"result": result}
