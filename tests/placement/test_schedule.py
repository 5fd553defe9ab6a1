"""The simulated schedule: tasks per machine and flows per link, as the simulator ran them."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from graphrun.errors import SpecError
from graphrun.placement.baselines import colocation
from graphrun.placement.cost import Evaluator
from graphrun.placement.profile import ServeRecord, profile_from_records
from graphrun.placement.schedule import (
    read_schedules,
    schedule,
    schedule_file,
    write_schedules,
)
from graphrun.placement.workload import make_scenario, traffic_matrix

from .test_cpu_model import cluster, job, record


def _spread(cl, j):
    """Every trainer off its store's machine, samplers off their trainer's: flows on
    every link."""
    shift = {"store": 0, "trainer": 1, "sampler": 2, "ps": 1}
    return tuple((t.index + shift[t.kind]) % cl.size for t in j.tasks)


def test_the_schedule_is_the_simulation_of_the_placement(hetero):
    cl, j = hetero
    sc = make_scenario(j, 0)
    x = _spread(cl, j)
    s = schedule(cl, sc, x, "spread")
    assert s.makespan == pytest.approx(Evaluator(cl, sc).makespan(x))
    assert s.iteration_s == pytest.approx(s.makespan / sc.iterations)
    where = dict(zip(j.roles, (cl.names[m] for m in x), strict=True))
    assert s.placement == where
    # every task runs where the placement puts its role; compute takes its duration
    stages = {t.stage for t in s.tasks}
    assert stages == {"sample", "train", "update"}
    for t in s.tasks:
        assert t.machine == where[t.role]
        assert 0 <= t.start < t.end <= s.makespan + 1e-12
    trains = [t for t in s.tasks if t.stage == "train"]
    assert len(trains) == sc.iterations * j.spec.trainers
    got = sorted(t.end - t.start for t in trains)
    assert got == pytest.approx(sorted(sc.compute_s.ravel().tolist()))
    # flows cross the network from their sender's machine to their receiver's, and
    # carry exactly the bytes the traffic matrix puts between those machines
    assert {f.stage for f in s.flows} >= {"structure", "feature", "batch", "gradient"}
    per_link: dict[tuple[str, str], float] = defaultdict(float)
    for f in s.flows:
        assert f.src == where[f.src_role] and f.dst == where[f.dst_role] and f.src != f.dst
        assert f.bytes > 0 and 0 <= f.start <= f.end <= s.makespan + 1e-12
        per_link[f.src, f.dst] += f.bytes
    traffic = traffic_matrix(sc)
    want: dict[tuple[str, str], float] = defaultdict(float)
    for a, b in zip(*np.nonzero(traffic), strict=True):
        if x[a] != x[b]:
            want[cl.names[x[a]], cl.names[x[b]]] += traffic[a, b]
    assert per_link.keys() == want.keys()
    for link, n in want.items():
        assert per_link[link] == pytest.approx(n)
    assert s.links() == sorted(want)


def test_co_location_sends_nothing_on_a_link_it_does_not_use(hetero):
    cl, j = hetero
    sc = make_scenario(j, 0)
    co = schedule(cl, sc, colocation(cl, j), "co-location")
    assert co.makespan == pytest.approx(Evaluator(cl, sc).makespan(colocation(cl, j)))
    assert all(f.stage not in ("batch",) for f in co.flows)  # samplers beside trainers


def test_cpu_steps_and_serving_are_tasks_of_their_machine():
    recs = [record(i, r) for i in range(8) for r in range(2)]
    prof = profile_from_records(recs, "p", [ServeRecord(part=0, cpu_s=1.0, reply_bytes=10_000_000)])
    j = job(prof)
    cl = cluster([1.0, 1.0])
    sc = make_scenario(j, 0)
    x = _spread(cl, j)
    s = schedule(cl, sc, x)
    assert s.makespan == pytest.approx(Evaluator(cl, sc).makespan(x))
    assert {t.stage for t in s.tasks} == {"sample", "train", "serve", "serve-charge"}
    serve = [t for t in s.tasks if t.stage.startswith("serve")]
    assert all(t.role.kind == "store" and t.machine == s.placement[t.role] for t in serve)
    assert {"allreduce"} <= {f.stage for f in s.flows}


def test_schedules_round_trip_and_bad_files_are_named(tmp_path, hetero):
    cl, j = hetero
    sc = make_scenario(j, 0, iterations=2)
    s = [schedule(cl, sc, _spread(cl, j)), schedule(cl, sc, colocation(cl, j), "co-location")]
    path = schedule_file(tmp_path / "plan.yaml")
    assert path.name == "plan.schedule.json"
    write_schedules(path, s)
    assert read_schedules(path) == s
    path.write_text('{"format": "graphrun-schedule", "version": 9, "schedules": []}')
    with pytest.raises(
        SpecError,
        match=r"schedule\.json: field 'version' is 9; this graphrun reads",
    ):
        read_schedules(path)
    path.write_text('{"format": "graphrun-schedule", "version": 1, "schedules": [{}]}')
    with pytest.raises(SpecError, match=r"plan\.schedule\.json: schedules\[0\]\.label: missing"):
        read_schedules(path)
    with pytest.raises(SpecError, match="cannot read"):
        read_schedules(tmp_path / "missing.json")
