from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from graphrun.errors import SpecError
from graphrun.names import RoleName
from graphrun.placement.baselines import (
    colocation,
    exhaustive,
    first_fit_decreasing,
    random_feasible,
)
from graphrun.placement.bounds import lower_bounds
from graphrun.placement.cluster import make_cluster
from graphrun.placement.cost import Evaluator, violation
from graphrun.placement.job import Demand, Demands, JobSpec, job_from_spec
from graphrun.placement.oes import Policy, simulate
from graphrun.placement.profile import builtin_profile
from graphrun.placement.search import _Moves, _propose, anneal, etp, ifs
from graphrun.placement.workload import build_workload, make_scenario


def tiny(machines=(50, 10), iterations=2, samplers=1, trainers=1, **kw):
    cluster = make_cluster(list(machines), cpu=16, memory_gb=64, gpus=1)
    spec = JobSpec(
        partitions=1,
        trainers=trainers,
        samplers_per_trainer=samplers,
        parameter_servers=1,
        iterations=iterations,
        demands=Demands(
            store=Demand(cpu=1, memory_gb=8),
            trainer=Demand(cpu=1, memory_gb=8, gpus=1),
            sampler=Demand(cpu=1, memory_gb=8),
            ps=Demand(cpu=1, memory_gb=8),
        ),
        **kw,
    )
    return cluster, job_from_spec(spec, builtin_profile("products"))


@pytest.mark.parametrize(
    ("machines", "exchange_prob", "peer_swap_prob", "trainers", "thin"),
    [((50, 10), 0.1, 0.0, 1, 4), ((50, 10, 25), 0.6, 0.0, 1, 4), ((50, 10), 0.1, 0.4, 2, 12)],
)
def test_etp_visits_follow_the_boltzmann_distribution(
    machines, exchange_prob, peer_swap_prob, trainers, thin
):
    """Relocations, swaps, peer swaps (the samplers of two trainers) and machine
    exchanges are all symmetric proposals."""
    cluster, job = tiny(machines, trainers=trainers)
    ev = Evaluator(cluster, make_scenario(job, seed=1))
    states = list(itertools.product(range(cluster.size), repeat=len(job.tasks)))
    cost = np.array([ev.cost(x) for x in states])
    scale, beta = float(cost.mean()), 3.0
    assert cost.max() / cost.min() > 1.3  # the distribution is far from uniform
    target = np.exp(-beta * cost / scale)
    target /= target.sum()
    visits: Counter = Counter()
    step = [0]

    def record(x):
        step[0] += 1
        if step[0] % thin == 0:  # thinned: the test assumes independent draws
            visits[x] += 1

    etp(
        ev,
        states[0],
        beta=beta,
        scale=scale,
        seed=7,
        max_steps=10_000 * thin,
        exchange_prob=exchange_prob,
        peer_swap_prob=peer_swap_prob,
        on_step=record,
    )
    observed = np.array([visits[x] for x in states], dtype=float)
    n = observed.sum()
    p = chisquare(observed, target * n).pvalue
    print("chi-square p", p)
    assert p > 1e-3
    # and the test can fail: the visits are not uniform
    assert chisquare(observed, np.full(len(states), n / len(states))).pvalue < 1e-9


def test_a_machine_exchange_moves_whole_groups():
    def groups(z):
        return {frozenset(i for i, m in enumerate(z) if m == k) for k in range(4)}

    rng = np.random.default_rng(0)
    x = [0, 0, 1, 2, 2, 2, 3]  # every machine holds a task
    for _ in range(20):
        y = x[:]
        _propose(y, rng, _Moves(4, swap=0.0, exchange=1.0, peer_swap=0.0, peers=((),) * 7))
        assert y != x and groups(y) == groups(x)
        assert sum(a != b for a, b in zip(x, y, strict=True)) >= 2


def test_a_peer_swap_trades_machines_within_one_kind():
    rng = np.random.default_rng(1)
    peers = ((1,), (0,), (), (4,), (3,))  # kinds: a a b c c
    x = [0, 1, 2, 3, 4]
    moved = set()
    for _ in range(50):
        y = x[:]
        _propose(y, rng, _Moves(5, swap=0.0, exchange=0.0, peer_swap=1.0, peers=peers))
        assert sorted(y) == x and y[2] == 2  # a permutation; the lone kind never moves
        moved.add(tuple(i for i in range(5) if y[i] != x[i]))
    assert moved == {(0, 1), (3, 4), ()}  # () when the lone task was drawn


def test_etp_is_reproducible_and_never_worse_than_its_start(hetero):
    cluster, job = hetero
    ev = Evaluator(cluster, make_scenario(job, seed=0))
    start = ifs(ev)
    assert ev.violation(start) == 0
    a = etp(ev, start, seed=3, max_steps=300)
    b = etp(Evaluator(cluster, make_scenario(job, seed=0)), start, seed=3, max_steps=300)
    assert a.placement == b.placement and a.makespan == b.makespan
    assert a.makespan <= ev.makespan(start)
    assert ev.violation(a.placement) == 0
    assert [p.makespan for p in a.curve] == sorted((p.makespan for p in a.curve), reverse=True)
    sa = anneal(ev, start, seed=3, max_steps=300)
    assert ev.violation(sa.placement) == 0 and sa.makespan <= ev.makespan(start)


def test_etp_finds_the_exhaustive_optimum_on_a_tiny_instance():
    cluster, job = tiny(machines=(50, 10, 25))
    ev = Evaluator(cluster, make_scenario(job, seed=2))
    best, best_ms = exhaustive(ev)
    got = etp(ev, ifs(ev), seed=0, max_steps=3000)
    assert got.makespan == pytest.approx(best_ms)
    assert got.makespan >= lower_bounds(build_workload(cluster, ev.scenario, best)).value * (
        1 - 1e-9
    )


def test_baselines_are_feasible(hetero):
    cluster, job = hetero
    for x in (
        colocation(cluster, job),
        first_fit_decreasing(cluster, job),
        random_feasible(cluster, job, np.random.default_rng(0)),
    ):
        assert len(x) == len(job.tasks)
        assert violation(cluster, job, x) == 0


def test_colocation_is_what_distdgl_does(hetero):
    cluster, job = hetero
    x = dict(zip(job.roles, colocation(cluster, job), strict=True))
    for p in range(4):
        assert x[RoleName.store(p)] == x[RoleName.trainer(p)] == x[RoleName.sampler(p, 0)] == p


def test_infeasible_cluster_names_the_field():
    cluster = make_cluster([10, 10], cpu=16, memory_gb=64, gpus=0)
    _, job = tiny()
    with pytest.raises(SpecError, match=r"demands\.trainer\.gpus"):
        ifs(Evaluator(cluster, make_scenario(job)))
    small = make_cluster([10], cpu=2, memory_gb=64, gpus=1)
    with pytest.raises(SpecError, match="total cpu"):
        ifs(Evaluator(small, make_scenario(job)))


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**31),
    st.sampled_from(["ps", "allreduce"]),
    st.integers(0, 4),
    st.integers(2, 6),
    st.integers(0, 2),
)
def test_simulated_job_makespan_is_at_least_its_lower_bound(
    seed, sync, prefetch, iterations, samplers
):
    """Every bound, the energetic one included, with prefetch windows 0..4; with no sampler
    workers the trainers sample for themselves (their compute must stay serial: the
    busiest-task bound was once above the makespan there)."""
    cluster = make_cluster([50, 10, 25], cpu=64, memory_gb=512, gpus=2)
    spec = JobSpec(
        partitions=3,
        trainers=3,
        samplers_per_trainer=samplers,
        sync=sync,
        parameter_servers=2,
        prefetch=prefetch,
        iterations=iterations,
    )
    job = job_from_spec(spec, builtin_profile("papers100m"))
    sc = make_scenario(job, seed)
    rng = np.random.default_rng(seed)
    x = tuple(int(m) for m in rng.integers(0, cluster.size, size=len(job.tasks)))
    w = build_workload(cluster, sc, x)
    bounds = lower_bounds(w)
    bound = bounds.value
    assert bounds.energetic >= max(bounds.port, bounds.chain) * (1 - 1e-12)
    for policy in Policy:
        ms = simulate(w.dag, policy).makespan
        assert math.isfinite(ms) and ms >= bound * (1 - 1e-9)


def test_cost_floor_matches_the_dag_and_bounds_the_cost(hetero):
    cluster, job = hetero
    ev = Evaluator(cluster, make_scenario(job, seed=4))
    rng = np.random.default_rng(4)
    for _ in range(5):
        x = tuple(int(m) for m in rng.integers(0, cluster.size, size=len(job.tasks)))
        dag = build_workload(cluster, ev.scenario, x).dag
        per_port = dag.port_bytes() / np.asarray(dag.port_capacity)
        assert ev.port_floor(x) == pytest.approx(per_port.max())
        assert ev.cost_floor(x) <= ev.cost(x) * (1 + 1e-9)


def test_replica_exchange_keeps_each_temperature_boltzmann():
    """With tempering, the visits of the beta chain still follow exp(-beta * cost)
    (the replicas' joint distribution is the product of their Boltzmann laws); a
    wrong exchange rule (the sign flipped) fails this test with p ~ 1e-16."""
    cluster, job = tiny((50, 10))
    ev = Evaluator(cluster, make_scenario(job, seed=1))
    states = list(itertools.product(range(cluster.size), repeat=len(job.tasks)))
    cost = np.array([ev.cost(x) for x in states])
    scale, beta = float(cost.mean()), 3.0
    target = np.exp(-beta * cost / scale)
    target /= target.sum()
    visits: Counter = Counter()
    seen = [0]

    def record(x):  # replicas step in ladder order (0.2, 3, 30): the second
        seen[0] += 1
        if seen[0] % 12 == 2:  # every 4th round
            visits[x] += 1

    etp(
        ev,
        states[0],
        beta=beta,
        tempering=(0.2, 30.0),
        exchange_every=1,
        scale=scale,
        seed=5,
        max_steps=3 * 40_000,
        on_step=record,
    )
    observed = np.array([visits[x] for x in states], dtype=float)
    n = observed.sum()
    assert chisquare(observed, target * n).pvalue > 1e-3
    assert chisquare(observed, np.full(len(states), n / len(states))).pvalue < 1e-9


def test_tempered_etp_is_reproducible_and_feasible(hetero):
    cluster, job = hetero
    ev = Evaluator(cluster, make_scenario(job, seed=0))
    start = ifs(ev)
    a = etp(ev, start, seed=3, max_steps=400, tempering=(50.0, 800.0))
    b = etp(
        Evaluator(cluster, make_scenario(job, seed=0)),
        start,
        seed=3,
        max_steps=400,
        tempering=(50.0, 800.0),
    )
    assert a.placement == b.placement and a.makespan <= ev.makespan(start)
    assert ev.violation(a.placement) == 0 and a.steps == 400 + 2  # whole rounds of 3
