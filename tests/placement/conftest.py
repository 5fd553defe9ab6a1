from __future__ import annotations

import pytest

from graphrun.placement.cluster import make_cluster
from graphrun.placement.job import Demand, Demands, JobSpec, job_from_spec
from graphrun.placement.profile import builtin_profile

HETERO_DEMANDS = Demands(
    store=Demand(cpu=2, memory_gb=100),
    trainer=Demand(cpu=8, memory_gb=16, gpus=1),
    sampler=Demand(cpu=4, memory_gb=4),
    ps=Demand(cpu=1, memory_gb=4),
)


@pytest.fixture
def hetero():
    """The paper's setting: 4 machines at 50 Gbit/s, two limited to 10 Gbit/s."""
    cluster = make_cluster([50, 50, 10, 10], cpu=32, memory_gb=256, gpus=2)
    spec = JobSpec(
        partitions=4,
        trainers=4,
        samplers_per_trainer=2,
        parameter_servers=2,
        prefetch=2,
        iterations=4,
        demands=HETERO_DEMANDS,
    )
    return cluster, job_from_spec(spec, builtin_profile("products"))
