"""``graphrun plan --timeline``: the drawn schedule is the simulator's."""

from __future__ import annotations

import io

import numpy as np
import pytest
import yaml
from matplotlib.figure import Figure
from PIL import Image

from graphrun.cli import main
from graphrun.placement.baselines import colocation
from graphrun.placement.cluster import load_cluster
from graphrun.placement.job import job_from_dict
from graphrun.placement.plan import load_plan
from graphrun.placement.schedule import read_schedules, schedule, schedule_file
from graphrun.placement.workload import make_scenario
from graphrun.report.plots import draw_timeline, timeline_bars

CLUSTER = {
    "apiVersion": "graphrun.io/v1alpha1",
    "kind": "Cluster",
    "machines": [
        {"name": f"m{i}", "cpu": 32, "memory_gb": 256, "gpus": 2, "bandwidth_gbps": b}
        for i, b in enumerate([50, 10, 10])
    ],
}
JOB = {
    "apiVersion": "graphrun.io/v1alpha1",
    "kind": "PlacementJob",
    "partitions": 3,
    "trainers": 3,
    "samplers_per_trainer": 1,
    "parameter_servers": 1,
    "iterations": 3,
    "demands": {"store": {"cpu": 2, "memory_gb": 100}},
}


@pytest.fixture
def files(tmp_path):
    c, j = tmp_path / "cluster.yaml", tmp_path / "job.yaml"
    c.write_text(yaml.safe_dump(CLUSTER))
    j.write_text(yaml.safe_dump(JOB))
    return c, j


def test_plan_writes_the_schedules_of_the_plan_and_co_location_and_draws_them(
    tmp_path, files, capsys
):
    c, j = files
    out, png = tmp_path / "plan.yaml", tmp_path / "timeline.png"
    argv = ["plan", str(c), str(j), "-o", str(out), "--steps", "20", "--timeline", str(png)]
    assert main(argv) == 0
    assert f"{png}: the simulated schedules drawn" in capsys.readouterr().out
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > 500
    got = read_schedules(schedule_file(out))
    assert [s.label for s in got] == ["plan", "co-location"]
    # the same schedules, simulated again from the files and the plan
    cluster, job = load_cluster(c), job_from_dict(yaml.safe_load(j.read_text()), str(j))
    plan = load_plan(out, machines=list(cluster.names))
    x = [cluster.names.index(plan.assignments[str(r)]) for r in job.roles]
    sc = make_scenario(job, 0)
    assert got == [
        schedule(cluster, sc, x, "plan"),
        schedule(cluster, sc, colocation(cluster, job), "co-location"),
    ]
    assert got[0].makespan <= got[1].makespan + 1e-12  # a plan is never worse than co-location


def test_the_timeline_draws_every_task_on_its_machine_and_every_flow_on_its_link(files):
    c, j = files
    cluster, job = load_cluster(c), job_from_dict(yaml.safe_load(j.read_text()), str(j))
    shift = {"store": 0, "trainer": 1, "sampler": 2, "ps": 0}
    x = [(t.index + shift[t.kind]) % cluster.size for t in job.tasks]
    s = schedule(cluster, make_scenario(job, 0), x, "spread")
    rows, bars = timeline_bars(s)
    assert rows[: cluster.size] == list(cluster.names)
    assert rows[cluster.size :] == [f"{a} → {b}" for a, b in s.links()]
    assert len(bars) == len(s.tasks) + len(s.flows)
    ax = Figure().add_subplot()
    drawn = draw_timeline(ax, s)
    assert drawn == bars
    rects = ax.patches
    assert len(rects) == len(bars)
    expect = [(t.machine, t.start, t.end) for t in s.tasks]
    expect += [(f"{f.src} → {f.dst}", f.start, f.end) for f in s.flows]
    for rect, (row, start, end) in zip(rects, expect, strict=True):
        assert rect.get_x() == pytest.approx(start)
        assert rect.get_width() == pytest.approx(end - start)
        centre = rect.get_y() + rect.get_height() / 2
        assert rows[int(np.rint(centre))] == row
    buf = io.BytesIO()
    ax.figure.savefig(buf, format="png")
    assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
