"""Parameter servers in the placement model: their measured CPU (``ps_update_s`` from the
servers' records) is charged to their machine, and an asynchronous PS (``staleness``)
is simulated as the runtime runs it, not as a synchronous one."""

from __future__ import annotations

import pytest

from graphrun.errors import SpecError
from graphrun.placement.cluster import ClusterSpec, MachineSpec, cluster_from_spec
from graphrun.placement.cost import Evaluator
from graphrun.placement.job import Demand, Demands, JobSpec, job_from_spec
from graphrun.placement.profile import (
    BatchRecord,
    PSRecord,
    ServeRecord,
    profile_from_records,
    read_metrics,
)
from graphrun.placement.workload import make_scenario


def cluster(cpus, gbps=10.0):
    machines = [
        MachineSpec(name=f"m{i}", cpu=c, memory_gb=64, bandwidth_gbps=gbps)
        for i, c in enumerate(cpus)
    ]
    return cluster_from_spec(ClusterSpec(machines=machines))


def record(i, r, compute_cpu=0.05):
    return BatchRecord(
        rank=r, partition=r, iteration=i, sample_s=0.03, fetch_s=0.01, compute_s=0.06,
        structure_bytes={0: 1000, 1: 100}, feature_bytes={r: 10_000, 1 - r: 1000},
        batch_bytes=5000, grad_bytes=100, sample_cpu_s=0.02, compute_cpu_s=compute_cpu,
        threads=1,
    )  # fmt: skip


def ps_job(profile, staleness=0, iterations=8):
    spec = JobSpec(
        partitions=2, trainers=2, samplers_per_trainer=0, sync="ps", parameter_servers=1,
        staleness=staleness, iterations=iterations, prefetch=0,
        demands=Demands(store=Demand(memory_gb=1), trainer=Demand(memory_gb=1),
                        ps=Demand(memory_gb=1)),
    )  # fmt: skip
    return job_from_spec(spec, profile)


def test_the_servers_records_give_the_ps_cpu_per_step(tmp_path):
    recs = [record(i, r) for i in range(4) for r in range(2)]
    (tmp_path / "trainer-0.jsonl").write_text("".join(r.to_json() + "\n" for r in recs))
    # two shards: 0.6 s for 40 pushes of 2 trainers (0.03 s a step), 0.2 s for 40 (0.01)
    lines = [
        PSRecord(index=0, cpu_s=0.6, pushes=40, trainers=2).to_json(),
        PSRecord(index=1, cpu_s=0.2, pushes=40, trainers=2).to_json(),
    ]
    (tmp_path / "ps-0.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "store-0.jsonl").write_text(
        ServeRecord(part=0, cpu_s=1.0, reply_bytes=10**8).to_json() + "\n"
    )
    batches, servers = read_metrics(sorted(tmp_path.glob("*.jsonl")))
    prof = profile_from_records(batches, "p", servers)
    assert prof["ps_update_s"].values == pytest.approx((0.01, 0.03))
    assert prof["serve_cpu_s_per_byte"].mean == pytest.approx(1e-8)  # the store's alone
    # without parameter-server records the update is not measured: 0, as before
    assert profile_from_records(batches, "p")["ps_update_s"].values == (0.0,)
    # a server that got no push says nothing about a step
    assert PSRecord(index=0, cpu_s=0.5, pushes=0, trainers=2).cpu_s_per_step is None
    (tmp_path / "ps-0.jsonl").write_text('{"kind": "ps", "v": 1, "index": 0, "cpu_s": 1}\n')
    with pytest.raises(SpecError, match=r"ps-0\.jsonl:1: pushes: missing"):
        read_metrics(sorted(tmp_path.glob("*.jsonl")))


def test_the_ps_update_runs_on_its_machine_s_cores():
    """A shard's measured CPU seconds a step take longer on a slow machine; a
    profile's 0 (nothing measured) costs nothing anywhere."""
    recs = [record(i, r) for i in range(8) for r in range(2)]
    prof = profile_from_records(
        recs, "p", [PSRecord(index=0, cpu_s=0.5, pushes=20, trainers=2)]
    )  # 0.05 s a step
    job = ps_job(prof)
    cl = cluster([1.0, 1.0, 0.1])  # m2: a tenth of a core
    ev = Evaluator(cl, make_scenario(job, 0))
    # stores and trainers on m0 and m1; ps:0 on a fast host or on the slow one
    base = (0, 1, 0, 1)
    fast, slow = ev.makespan((*base, 1)), ev.makespan((*base, 2))
    # 8 updates of 0.05 CPU-s at 0.1 core: 3.6 s more than on a full core
    assert slow > fast + 3.0
    unmeasured = ps_job(profile_from_records(recs, "p"))
    ev0 = Evaluator(cl, make_scenario(unmeasured, 0))
    assert ev0.makespan((*base, 2)) == pytest.approx(ev0.makespan((*base, 1)), rel=1e-4)


def test_an_asynchronous_ps_does_not_wait_for_the_slowest_trainer_every_step():
    """Steps that are slow on one trainer at a time: synchronous, every step waits for
    the slower of the two; with staleness 2 each trainer runs at its own pace."""
    recs = [record(i, r, compute_cpu=0.5 if (i + r) % 2 else 0.01)
            for i in range(40) for r in range(2)]  # fmt: skip
    prof = profile_from_records(recs, "p", [PSRecord(index=0, cpu_s=0.02, pushes=20, trainers=2)])
    cl = cluster([1.0, 1.0, 1.0])
    x = (0, 1, 0, 1, 2)
    sync = Evaluator(cl, make_scenario(ps_job(prof, 0, 16), 3)).makespan(x)
    stale = Evaluator(cl, make_scenario(ps_job(prof, 2, 16), 3)).makespan(x)
    assert stale < 0.85 * sync
    # the same draws and the same work: never faster than each trainer's own steps
    alone = Evaluator(cl, make_scenario(ps_job(prof, 1000, 16), 3)).makespan(x)
    assert alone <= stale + 1e-9


def test_staleness_needs_parameter_servers():
    with pytest.raises(ValueError, match="staleness"):
        JobSpec(partitions=1, trainers=1, sync="allreduce", parameter_servers=0, staleness=2)
