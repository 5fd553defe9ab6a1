"""The CPU model: a profile with CPU seconds makes a step as long as its CPU seconds over
the share of its machine's cores the placement gives it."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from graphrun.errors import SpecError
from graphrun.placement.baselines import colocation, random_feasible
from graphrun.placement.cluster import ClusterSpec, MachineSpec, cluster_from_spec
from graphrun.placement.cost import Evaluator
from graphrun.placement.job import Demand, Demands, JobSpec, job_from_spec
from graphrun.placement.profile import (
    BatchRecord,
    Profile,
    builtin_profile,
    load_profile,
    profile_from_records,
    read_records,
    save_profile,
)
from graphrun.placement.workload import build_workload, make_scenario, make_template


def cluster(cpus, gbps=10.0):
    return cluster_from_spec(
        ClusterSpec(
            machines=[
                MachineSpec(name=f"m{i}", cpu=c, memory_gb=64, bandwidth_gbps=gbps)
                for i, c in enumerate(cpus)
            ]
        )
    )


def record(i, r, sample_cpu=0.02, compute_cpu=0.05, threads=1):
    return BatchRecord(
        rank=r, partition=r, iteration=i, sample_s=0.03, fetch_s=0.01, compute_s=0.06,
        structure_bytes={0: 1000, 1: 100}, feature_bytes={r: 10_000, 1 - r: 1000},
        batch_bytes=5000, grad_bytes=100, sample_cpu_s=sample_cpu, compute_cpu_s=compute_cpu,
        threads=threads,
    )  # fmt: skip


def records(n=8):
    return [record(i, r) for i in range(n) for r in range(2)]


def job(profile: Profile, trainers=2):
    spec = JobSpec(
        partitions=2, trainers=trainers, samplers_per_trainer=0, sync="allreduce",
        parameter_servers=0, iterations=6, prefetch=0,
        demands=Demands(store=Demand(memory_gb=1), trainer=Demand(memory_gb=1)),
    )  # fmt: skip
    return job_from_spec(spec, profile)


def test_cpu_seconds_survive_records_and_profile_files(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in records()))
    recs = read_records(path)
    assert recs[0].compute_cpu_s == 0.05 and recs[0].threads == 1
    prof = profile_from_records(recs, "p")
    assert prof.cpu_seconds and prof["compute_cpu_s"].mean == pytest.approx(0.05)
    save_profile(prof, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == prof
    # records of an older runtime carry none: the profile has none, and is not scaled
    old = [msgspec.structs.replace(r, sample_cpu_s=None, compute_cpu_s=None, threads=None)
           for r in recs]  # fmt: skip
    assert "compute_cpu_s" not in json.loads(old[0].to_json())
    assert not profile_from_records(old, "p").cpu_seconds
    assert not builtin_profile("products").cpu_seconds


def test_trainers_on_one_machine_share_its_cores_and_one_alone_gets_them_all():
    """Two trainers on a machine of one core each take twice their CPU seconds when both
    compute all the time; while one waits for the network the other gets the whole core,
    so sharing is never slower than an even split of the cores."""
    prof = profile_from_records(records(), "p")
    j = job(prof)
    one, two = cluster([1.0, 1.0]), cluster([1.0, 2.0])
    ev = Evaluator(one, make_scenario(j, 0))
    apart = ev.makespan(colocation(one, j))
    together = tuple(0 if t.kind == "trainer" else i for i, t in enumerate(j.tasks))
    shared = ev.makespan(together)
    assert apart < shared < 2.0 * apart + 1e-9
    # the same two on a machine of two cores: a core each, as apart (no link used
    # between trainers and their stores' machine makes it no slower than apart)
    ev2 = Evaluator(two, make_scenario(j, 0))
    both_on_two = tuple(1 if t.kind == "trainer" else i for i, t in enumerate(j.tasks))
    assert ev2.makespan(both_on_two) < shared
    # a 4-thread trainer uses 4 cores of 8; a one-thread one, one
    prof4 = profile_from_records([record(i, r, threads=4) for i in range(8) for r in range(2)], "p")
    j4 = job(prof4)
    big = cluster([8.0, 8.0])
    assert Evaluator(big, make_scenario(j4, 0)).makespan(colocation(big, j4)) < Evaluator(
        big, make_scenario(j, 0)
    ).makespan(colocation(big, j))


def test_a_trainer_on_a_slower_machine_makes_a_longer_epoch():
    prof = profile_from_records(records(), "p")
    j = job(prof)
    fast, slow = cluster([1.0, 1.0]), cluster([1.0, 0.25])
    x = colocation(fast, j)
    t_fast = Evaluator(fast, make_scenario(j, 0)).makespan(x)
    t_slow = Evaluator(slow, make_scenario(j, 0)).makespan(x)
    # the slow trainer's sampling and compute take 4x their CPU seconds, and the
    # allreduce makes everyone wait for it
    assert t_slow > 3.0 * t_fast
    # the same placement with both trainers on the fast machine shares its core
    both = tuple(0 if t.kind == "trainer" else i for i, t in enumerate(j.tasks))
    t_shared = Evaluator(slow, make_scenario(j, 0)).makespan(both)
    assert t_fast < t_shared < t_slow


def test_a_profile_without_cpu_seconds_ignores_the_cores():
    j = job(builtin_profile("products"))
    x = colocation(cluster([1.0, 1.0]), j)
    a = Evaluator(cluster([1.0, 1.0]), make_scenario(j, 0)).makespan(x)
    b = Evaluator(cluster([1.0, 0.1]), make_scenario(j, 0)).makespan(x)
    assert a == b


def test_the_floor_stays_below_every_placement():
    """The floor scales each step by its best share, not by placement 0's (which put
    every trainer on a slow first machine and was above better placements)."""
    prof = profile_from_records(records(), "p")
    j = job(prof)
    cl = cluster([0.1, 1.0, 1.0])
    ev = Evaluator(cl, make_scenario(j, 0))
    rng = np.random.default_rng(0)
    xs = [random_feasible(cl, j, rng) for _ in range(30)]
    assert ev.floor() <= min(ev.makespan(x) for x in xs) + 1e-12
    tpl = make_template(ev.scenario)
    assert tpl.best_slowdown(cl) == pytest.approx(np.ones(len(j.tasks)))
    # the bounds' DAG (every step as fast as alone on its machine) stays below too
    from graphrun.placement.bounds import lower_bounds

    for x in xs[:5]:
        assert lower_bounds(build_workload(cl, ev.scenario, x)).value <= ev.makespan(x) + 1e-9


def test_store_servers_records_give_the_serving_cost(tmp_path):
    from graphrun.placement.profile import SERVE, ServeRecord, read_metrics

    (tmp_path / "trainer-0.jsonl").write_text("".join(r.to_json() + "\n" for r in records()))
    for part, cpu_s, sent in ((0, 2.0, 1000), (1, 1.0, 2000)):
        serve = ServeRecord(part=part, cpu_s=cpu_s, reply_bytes=sent)
        (tmp_path / f"store-{part}.jsonl").write_text(serve.to_json() + "\n")
    batches, serves = read_metrics(sorted(tmp_path.glob("*.jsonl")))
    assert len(batches) == 16 and [s.part for s in serves] == [0, 1]
    prof = profile_from_records(batches, "p", serves)
    assert prof[SERVE].values == (pytest.approx(1e-3),)  # 3 CPU seconds for 3000 bytes
    save_profile(prof, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == prof
    with pytest.raises(SpecError, match="no batch records"):  # stores alone make no profile
        read_metrics([tmp_path / "store-0.jsonl"])
    (tmp_path / "bad.jsonl").write_text('{"kind": "serve", "v": 1, "part": 0}\n')
    with pytest.raises(SpecError, match=r"bad\.jsonl:1: cpu_s: missing"):
        read_metrics([tmp_path / "trainer-0.jsonl", tmp_path / "bad.jsonl"])


def test_a_store_serving_from_a_slow_machine_costs_that_machine_s_cpu():
    from graphrun.placement.profile import SERVE, Empirical

    base = profile_from_records(records(), "p")
    costly = Profile("p", {**base.quantities, SERVE: Empirical.of([2e-5])})  # 0.2 s / 10 kB
    j = job(costly)
    cl = cluster([1.0, 1.0, 0.1])
    ev, free = Evaluator(cl, make_scenario(j, 0)), Evaluator(cl, make_scenario(job(base), 0))
    # tasks: store:0, store:1, trainer:0, trainer:1
    fast, slow = (0, 1, 0, 1), (2, 1, 0, 1)  # store:0 apart, on a fast or the slow machine
    assert free.makespan(slow) == pytest.approx(free.makespan(fast), rel=0.05)
    assert ev.makespan(slow) > 2 * ev.makespan(fast)
    # what a store serves to its own machine goes through shared memory: no serving
    assert ev.makespan((0, 0, 0, 0)) == free.makespan((0, 0, 0, 0))


def test_a_store_alone_on_a_quota_machine_answers_at_a_core_s_speed():
    """A machine's ``cpu`` is a quota of whole cores: a store alone on a 0.1-core machine
    computes a reply at a core's speed (pr7's plan, stores 0 and 3 alone on 0.2-CPU
    hosts, was over-predicted while the replies crawled at 0.2 cores), and its CPU
    seconds still count against the machine's share: a trainer beside it slows down, and
    so does the epoch when the share cannot keep up with the serving."""
    from graphrun.placement.profile import SERVE, Empirical

    base = profile_from_records(records(), "p")
    j0 = job(base)
    # tasks: store:0, store:1, trainer:0, trainer:1; ~12 kB leave store:0 per iteration
    per_iteration = (
        make_scenario(j0, 0).structure[:, :, 0].sum(1).mean()
        + make_scenario(j0, 0).feature[:, :, 0].sum(1).mean()
    )
    serve = 0.004 / per_iteration  # 4 ms of one core per iteration, 40 ms of 0.1 core
    j = job(Profile("p", {**base.quantities, SERVE: Empirical.of([serve])}))
    cl = cluster([1.0, 1.0, 0.1])
    ev = Evaluator(cl, make_scenario(j, 0))
    iters = ev.scenario.iterations
    fast, slow = (0, 1, 0, 1), (2, 1, 0, 1)  # store:0 apart, on a fast or the slow machine
    assert ev.makespan(slow) < 1.1 * ev.makespan(fast)
    # the replies' CPU seconds are the slow machine's: trainer:1 beside store:0 pays for
    # the ~3.6 ms an iteration it serves trainer:0 (its own bytes stay on the machine)
    beside = (2, 1, 0, 2)
    alone = Evaluator(cl, make_scenario(job(base), 0)).makespan(beside)
    assert ev.makespan(beside) > alone + 0.5 * iters * 0.0036 / 0.1
    # a share too small for the serving bounds the epoch: 100x the cost is 0.4 s of one
    # core per iteration, 4 s of 0.1 core
    heavy = job(Profile("p", {**base.quantities, SERVE: Empirical.of([100 * serve])}))
    bound = iters * 0.4 / 0.1
    assert Evaluator(cl, make_scenario(heavy, 0)).makespan(slow) >= 0.95 * bound
