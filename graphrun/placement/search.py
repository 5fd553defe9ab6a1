"""IFS (initial feasible placement), ETP (Markov-chain exploration) and simulated annealing.

ETP is a Metropolis chain over placements (every task on any machine, feasible or
not). A step proposes, with probability ``exchange_prob``, to exchange all the tasks
of two machines drawn uniformly (a co-located group moves at once), with probability
``swap_prob`` to swap the machines of two tasks drawn uniformly among all pairs (a
no-op if they share a machine), with probability ``peer_swap_prob`` to swap a
uniformly drawn sampler with a uniformly drawn sampler of another trainer (a no-op
for other tasks), otherwise to relocate a uniformly drawn task to a uniformly drawn
other machine. All four proposals are symmetric (the swaps and exchanges are
involutions drawn uniformly, a peer relation is symmetric), so accepting with
``min(1, exp(-beta * (c' - c) / scale))`` makes the stationary distribution
proportional to ``exp(-beta * cost / scale)``. ``scale`` is the initial placement's
cost unless given, so ``beta`` is unit-free. With ``tempering``, chains at those
betas run beside the ``beta`` chain and exchange states (replica exchange, see
:func:`_exchange`); each keeps its own Boltzmann distribution. The uniform draw
comes first, so a proposal whose cost floor (:meth:`Evaluator.cost_floor`, no
simulation) already exceeds the acceptance threshold is rejected unsimulated — the
same decision, much cheaper for overloaded placements. The best
*feasible* placement seen is returned, with the anytime curve of its improvements.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from graphrun.errors import ArgumentError, SpecError
from graphrun.placement.cost import (
    Evaluator,
    Placement,
    capacity_matrix,
    check_feasible,
    demand_matrix,
    expected_traffic,
)

_KIND_ORDER = {"store": 0, "trainer": 1, "sampler": 2, "ps": 3}
TEMPERING = (100.0, 400.0)  # replica betas of `graphrun plan` and the benchmark


@dataclass(frozen=True)
class CurvePoint:
    step: int
    seconds: float
    makespan: float


#: where a long search stands: ``(steps, seconds spent, seconds left or None with a step
#: budget, best makespan so far)``, told every ``PROGRESS_EVERY_S`` seconds
Progress = Callable[[int, float, "float | None", float], None]
PROGRESS_EVERY_S = 3.0


@dataclass(frozen=True)
class SearchResult:
    placement: Placement
    makespan: float
    steps: int
    simulations: int
    rejected_early: int  # proposals rejected on their cost floor, never simulated
    seconds: float
    curve: tuple[CurvePoint, ...]


def ifs(ev: Evaluator) -> Placement:
    """Greedy feasible placement: stores (largest memory first), trainers, samplers, PS.

    Each task goes to the machine with room that has the most expected traffic with
    the tasks already there; ties go to the faster NIC, then the lowest index.
    """
    cluster, job = ev.cluster, ev.job
    check_feasible(cluster, job)
    dem, free = demand_matrix(job), capacity_matrix(cluster).copy()
    traffic = expected_traffic(job)
    speed = np.minimum(cluster.egress, cluster.ingress)
    order = sorted(
        range(len(job.tasks)),
        key=lambda t: (_KIND_ORDER[job.tasks[t].kind], -dem[t, 1], t),
    )
    place = [-1] * len(job.tasks)
    on: list[list[int]] = [[] for _ in range(cluster.size)]
    for t in order:
        fits = [m for m in range(cluster.size) if np.all(free[m] >= dem[t] - 1e-9)]
        if not fits:
            raise SpecError(f"placement: no machine has room left for {job.tasks[t].role}")
        m = max(fits, key=lambda m: (traffic[t, on[m]].sum(), speed[m], -m))
        place[t] = m
        on[m].append(t)
        free[m] -= dem[t]
    return tuple(place)


@dataclass(frozen=True)
class _Moves:
    """Proposal probabilities (the rest is relocation) and each task's peers, the tasks
    it may trade machines with in a peer swap (a symmetric relation)."""

    machines: int
    swap: float
    exchange: float
    peer_swap: float
    peers: tuple[tuple[int, ...], ...]


def _moves(ev: Evaluator, swap: float, exchange: float, peer_swap: float) -> _Moves:
    # samplers of different trainers (the same demands and similar traffic, different
    # consumers); swapping samplers of one trainer or two PS barely changes the cost
    ts = ev.job.tasks
    peers = tuple(
        tuple(j for j, u in enumerate(ts) if t.kind == u.kind == "sampler" and t.index != u.index)
        for t in ts
    )
    if min(swap, exchange, peer_swap) < 0 or swap + exchange + peer_swap > 1:
        raise ArgumentError("search: move probabilities must be >= 0 and sum to <= 1")
    return _Moves(ev.cluster.size, swap, exchange, peer_swap, peers)


def _pair(rng: np.random.Generator, n: int) -> tuple[int, int]:
    """A uniformly drawn ordered pair of distinct integers below ``n``."""
    i = int(rng.integers(n))
    j = int(rng.integers(n - 1))
    return i, j + (j >= i)


def _propose(x: list[int], rng: np.random.Generator, mv: _Moves) -> None:
    n, machines = len(x), mv.machines
    u = rng.random()
    if machines >= 2 and u < mv.exchange:
        # exchange every task of two machines: moves a co-located group (a partition's
        # store, trainer and samplers) to a faster NIC in one step
        a, b = _pair(rng, machines)
        for i, m in enumerate(x):
            if m == a:
                x[i] = b
            elif m == b:
                x[i] = a
    elif n >= 2 and u < mv.exchange + mv.swap:
        i, j = _pair(rng, n)
        x[i], x[j] = x[j], x[i]
    elif n >= 2 and u < mv.exchange + mv.swap + mv.peer_swap:
        # a task and a uniformly drawn peer trade machines: keeps every machine's load
        i = int(rng.integers(n))
        if mv.peers[i]:
            j = mv.peers[i][int(rng.integers(len(mv.peers[i])))]
            x[i], x[j] = x[j], x[i]
    elif machines >= 2:
        i = int(rng.integers(n))
        m = int(rng.integers(machines - 1))
        x[i] = m if m < x[i] else m + 1


@dataclass
class _Replica:
    """One Metropolis chain of a search: its state, cost and inverse temperature."""

    x: list[int]
    cost: float
    beta: float


@dataclass
class _Best:
    placement: Placement
    makespan: float
    curve: list[CurvePoint]


def _step(ev: Evaluator, rep: _Replica, rng: np.random.Generator, scale: float, mv: _Moves) -> bool:
    """One Metropolis step of ``rep``; True when it was rejected on its cost floor."""
    y = rep.x[:]
    _propose(y, rng, mv)
    key = tuple(y)
    # Metropolis: accept iff c' < c - scale * ln(u) / beta. A proposal whose cost
    # floor already exceeds that threshold is rejected without simulating it.
    threshold = rep.cost - scale * math.log(1.0 - rng.random()) / rep.beta
    if ev.cost_floor(key) >= threshold:
        return True
    if (cy := ev.cost(key)) < threshold:
        rep.x, rep.cost = y, cy
    return False


def _exchange(reps: list[_Replica], rng: np.random.Generator, scale: float) -> None:
    """Replica exchange: propose to swap the states of one uniformly drawn pair of
    neighbouring temperatures; accepted w.p. ``min(1, exp((b_i - b_j)(c_i - c_j)/scale))``,
    which keeps the product of the replicas' Boltzmann distributions stationary."""
    i = int(rng.integers(len(reps) - 1))
    a, b = reps[i], reps[i + 1]
    if math.log(1.0 - rng.random()) < (a.beta - b.beta) * (a.cost - b.cost) / scale:
        a.x, b.x = b.x, a.x
        a.cost, b.cost = b.cost, a.cost


def _chain(
    ev: Evaluator,
    init: Sequence[int],
    betas: Callable[[float], Sequence[float]],
    *,
    seed: int,
    max_steps: int | None,
    max_seconds: float | None,
    scale: float | None,
    moves: _Moves,
    exchange_every: int = 10,
    on_step: Callable[[Placement], None] | None,
    progress: Progress | None = None,
) -> SearchResult:
    """Metropolis chains, one per entry of ``betas(fraction of the budget used)``, all
    from ``init``; with several, a replica exchange every ``exchange_every`` rounds."""
    if max_steps is None and max_seconds is None:
        raise ArgumentError("search: give max_steps or max_seconds")
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    sims0 = ev.simulations
    c0 = ev.cost(init)
    scale = scale or c0 or 1.0
    reps = [_Replica([int(m) for m in init], c0, b) for b in betas(0.0)]
    ms0 = ev.makespan(init) if ev.violation(init) == 0 else math.inf
    best = _Best(
        tuple(int(m) for m in init), ms0, [CurvePoint(0, 0.0, ms0)] if ms0 < math.inf else []
    )
    step = rejected_early = rounds = 0
    last_report = -math.inf  # the first report at the start, then every few seconds
    while True:
        elapsed = time.perf_counter() - t0
        if progress is not None and elapsed - last_report >= PROGRESS_EVERY_S:
            last_report = elapsed
            left = max(0.0, max_seconds - elapsed) if max_seconds is not None else None
            progress(step, elapsed, left, best.makespan)
        if max_steps is not None and step >= max_steps:
            break
        if max_seconds is not None and elapsed >= max_seconds:
            break
        frac = step / max_steps if max_steps else elapsed / (max_seconds or 1.0)
        for rep, beta in zip(reps, betas(frac), strict=True):
            rep.beta = beta
            step += 1
            rejected_early += _step(ev, rep, rng, scale, moves)
            if rep.cost < best.makespan and ev.violation(rep.x) == 0:
                best.placement, best.makespan = tuple(rep.x), ev.makespan(rep.x)
                best.curve.append(CurvePoint(step, time.perf_counter() - t0, best.makespan))
            if on_step is not None:
                on_step(tuple(rep.x))
        rounds += 1
        if len(reps) > 1 and rounds % exchange_every == 0:
            _exchange(reps, rng, scale)
    if best.makespan == math.inf:
        raise SpecError("placement: the search found no feasible placement")
    return SearchResult(
        placement=best.placement,
        makespan=best.makespan,
        steps=step,
        simulations=ev.simulations - sims0,
        rejected_early=rejected_early,
        seconds=time.perf_counter() - t0,
        curve=tuple(best.curve),
    )


def etp(
    ev: Evaluator,
    init: Sequence[int],
    *,
    beta: float = 200.0,
    seed: int = 0,
    max_steps: int | None = None,
    max_seconds: float | None = None,
    scale: float | None = None,
    swap_prob: float = 0.3,
    exchange_prob: float = 0.1,
    peer_swap_prob: float = 0.3,
    tempering: Sequence[float] = (),
    exchange_every: int = 10,
    on_step: Callable[[Placement], None] | None = None,
    progress: Progress | None = None,
) -> SearchResult:
    """Metropolis exploration at fixed ``beta`` (see the module docstring); with
    ``tempering``, replica exchange over the chains at ``beta`` and those betas (one
    step of each per round, an exchange every ``exchange_every`` rounds)."""
    ladder = sorted({float(beta), *map(float, tempering)})
    if ladder[0] <= 0:
        raise ArgumentError(f"search: betas must be > 0 (got {ladder[0]:g})")
    return _chain(
        ev,
        init,
        lambda _: ladder,
        seed=seed,
        max_steps=max_steps,
        max_seconds=max_seconds,
        scale=scale,
        moves=_moves(ev, swap_prob, exchange_prob, peer_swap_prob),
        exchange_every=max(1, exchange_every),
        on_step=on_step,
        progress=progress,
    )


def anneal(
    ev: Evaluator,
    init: Sequence[int],
    *,
    beta0: float = 10.0,
    beta1: float = 2000.0,
    seed: int = 0,
    max_steps: int | None = None,
    max_seconds: float | None = None,
    swap_prob: float = 0.3,
    exchange_prob: float = 0.1,
    peer_swap_prob: float = 0.3,
) -> SearchResult:
    """Simulated annealing: the same moves, beta rising geometrically over the budget."""
    ratio = beta1 / beta0
    return _chain(
        ev,
        init,
        lambda frac: (beta0 * ratio ** min(frac, 1.0),),
        seed=seed,
        max_steps=max_steps,
        max_seconds=max_seconds,
        scale=None,
        moves=_moves(ev, swap_prob, exchange_prob, peer_swap_prob),
        on_step=None,
    )
