"""The compiled OES kernel against the pure-Python reference simulator it replaced."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from graphrun.names import RoleName
from graphrun.placement import _kernel
from graphrun.placement.dag import DagBuilder
from graphrun.placement.oes import Policy, dag_arrays, simulate
from tests.placement import reference_oes
from tests.placement.test_oes import random_dags


def _subnormal_steps():
    # found by hypothesis in CI once the kernel's tolerance lost its absolute floor:
    # the reference kept it (the two must share their semantics)
    b = DagBuilder(egress=(0.5e9, 0.5e9), ingress=(0.5e9, 0.5e9))
    b.flow(5e-324, 0, 1, 0, ())
    b.compute(0.0, 0, ())
    b.compute(5e-324, 0, ())
    return b.build()


@settings(max_examples=150, deadline=None)
@given(random_dags())
@example(_subnormal_steps())
def test_kernel_matches_the_reference_simulator(dag):
    for policy in Policy:
        got = simulate(dag, policy)
        want = reference_oes.simulate(dag, policy)
        assert got.finish == pytest.approx(want.finish, rel=1e-12, abs=1e-15, nan_ok=True)
        assert got.events == want.events


@settings(max_examples=30, deadline=None)
@given(random_dags())
def test_compiled_and_interpreted_kernels_agree(dag):
    a = dag_arrays(dag)
    args = (a.duration, a.size, a.src, a.dst, a.iteration, a.succ_ptr, a.succ_idx, a.npred)
    for code in (_kernel.PRIORITY, _kernel.FAIR, _kernel.FIFO):
        fin, ev, done = _kernel.run(*args, a.capacity, a.machines, code)
        fin2, ev2, done2 = _kernel.run.py_func(*args, a.capacity, a.machines, code)
        assert fin.tolist() == pytest.approx(fin2.tolist(), rel=0, abs=0, nan_ok=True)
        assert (ev, done) == (ev2, done2)


def test_placing_a_template_merges_the_flows_of_stores_on_one_machine(hetero):
    """Stores 0 and 1 on machine 0 send trainer 2 (machine 2) one feature flow each
    iteration carrying both stores' bytes; the other group members become free steps."""
    from graphrun.placement.cost import Evaluator
    from graphrun.placement.oes import simulate_arrays
    from graphrun.placement.workload import build_workload, make_scenario, make_template

    cluster, job = hetero
    sc = make_scenario(job, seed=0)
    x = [3] * len(job.tasks)  # only the stores on machines 0 and 1, trainer 2 on 2
    x[job.index(RoleName.parse("store:0"))] = x[job.index(RoleName.parse("store:1"))] = 0
    x[job.index(RoleName.parse("store:2"))] = x[job.index(RoleName.parse("store:3"))] = 1
    x[job.index(RoleName.parse("trainer:2"))] = 2
    a = make_template(sc).place(cluster, x)
    into = (a.src == 0) & (a.dst == cluster.size + 2)  # machine 0 -> machine 2
    want = sorted(float(sc.feature[i, 2, 0] + sc.feature[i, 2, 1]) for i in range(sc.iterations))
    assert sorted(a.size[into].tolist()) == pytest.approx(want)
    assert simulate_arrays(a)[0] == simulate(build_workload(cluster, sc, x).dag).makespan
    assert Evaluator(cluster, sc).makespan(x) == simulate_arrays(a)[0]


@settings(max_examples=15, deadline=None)
@given(
    st.integers(0, 2**31),
    st.sampled_from(["ps", "allreduce"]),
    st.integers(0, 3),
    st.sampled_from([(50, 10, 25), (50, 50, 10, 10)]),
)
def test_the_placed_template_simulates_like_the_old_builder(seed, sync, prefetch, bw):
    """Same makespan as the per-placement builder it replaced, for every policy, on
    random placements (so merging and free local flows are the same)."""
    from graphrun.placement.cluster import make_cluster
    from graphrun.placement.job import JobSpec, job_from_spec
    from graphrun.placement.profile import builtin_profile
    from graphrun.placement.workload import build_workload, make_scenario
    from tests.placement import reference_workload

    cluster = make_cluster(list(bw), cpu=64, memory_gb=512, gpus=2)
    spec = JobSpec(
        partitions=len(bw),
        trainers=len(bw),
        samplers_per_trainer=2,
        sync=sync,
        parameter_servers=2,
        prefetch=prefetch,
        iterations=3,
    )
    job = job_from_spec(spec, builtin_profile("products"))
    sc = make_scenario(job, seed)
    rng = np.random.default_rng(seed)
    x = tuple(int(m) for m in rng.integers(0, cluster.size, size=len(job.tasks)))
    new = build_workload(cluster, sc, x).dag
    old = reference_workload.build_workload(cluster, sc, x)
    for policy in Policy:
        assert simulate(new, policy).makespan == simulate(old, policy).makespan
