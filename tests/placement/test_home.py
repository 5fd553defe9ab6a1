"""A trainer's home partition means the same to the placement model as to the runtime.

The model took trainer ``r``'s partition as ``r % P``, the runtime as ``r * P // W``: with
more trainers than partitions (examples/jobs/planned.yaml: W=4, P=2) the model charged
trainers 1 and 2 their "own" bytes at the wrong store, and its co-location baseline was
not the runtime's co-located placement.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from graphrun.distributed.split import node_split
from graphrun.job.planning import graphjob_to_placement
from graphrun.job.spec import job_roles, load_job
from graphrun.names import RoleName
from graphrun.placement.baselines import colocation
from graphrun.placement.cluster import make_cluster
from graphrun.placement.cost import expected_traffic
from graphrun.placement.profile import QUANTITIES
from graphrun.placement.workload import make_scenario
from graphrun.testing.store import range_book as _book

ROOT = Path(__file__).resolve().parents[2]
OWN, OTHER = 1000.0, 1.0


def _profile(path: Path) -> Path:
    """Every quantity 1, but a trainer's own partition's bytes 1000: what the model
    charges where is read off the scenario."""
    quantities = {q: [OWN if q.endswith("_own") else OTHER] for q in QUANTITIES}
    path.write_text(json.dumps({"format": "graphrun-profile", "version": 1,
                                "quantities": quantities}))  # fmt: skip
    return path


def test_the_model_charges_own_bytes_at_the_runtimes_home_partition(tmp_path: Path) -> None:
    job_path = ROOT / "examples" / "jobs" / "planned.yaml"
    gj = load_job(job_path)
    world, parts = gj.spec.num_trainers, gj.spec.num_parts
    assert world > parts  # trainersPerMachine > 1

    # the runtime: the partition whose training ids node_split gives each trainer
    book = _book([50] * parts)
    ids = np.arange(book.num_nodes)
    runtime_home = []
    for rank in range(world):
        mine = node_split(ids, book, rank, world).numpy()
        owners = np.bincount(book.nid2part(mine), minlength=parts)
        assert owners.max() == len(mine)  # each trainer's ids all on one partition
        runtime_home.append(int(owners.argmax()))
    assert runtime_home == [0, 0, 1, 1]

    # the model of the same job
    job = graphjob_to_placement(gj, job_path, str(_profile(tmp_path / "p.json")), 2).job
    scenario = make_scenario(job, seed=0)
    traffic = expected_traffic(job)
    role = {t.role: i for i, t in enumerate(job.tasks)}
    for rank, home in enumerate(runtime_home):
        charged = scenario.structure[:, rank, :]
        assert (charged[:, home] == OWN).all()
        assert (np.delete(charged, home, axis=1) == OTHER).all()
        trainer = role[RoleName.trainer(rank)]
        per_store = [traffic[role[RoleName.store(q)], trainer] for q in range(parts)]
        assert int(np.argmax(per_store)) == home

    # co-location: each trainer beside its home partition's store, as graphrun run places it
    cluster = make_cluster([10.0] * gj.spec.runtime.machines)
    placed = colocation(cluster, job)
    default = {r.id: gj.spec.machine_names.index(r.machine) for r in job_roles(gj.spec)}
    for rank, home in enumerate(runtime_home):
        trainer = placed[role[RoleName.trainer(rank)]]
        assert trainer == placed[role[RoleName.store(home)]]
        assert trainer == default[RoleName.trainer(rank)]
