"""A whole job on hosts with a memory limit each, from a cluster file (issue 44, item 3):
partitioned in distributed mode, served from disk and trained on netns hosts whose
cgroups hold what the file says (benchmarks/README.md runs the 2M-node graph on four
hosts of 1.5 GiB the same way)."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from graphrun.local.netns import PREFIX, _own_cgroup, unavailable_reason
from graphrun.names import RoleName
from graphrun.testing.jobs import job_metrics as metrics
from graphrun.testing.jobs import local_job as run
from graphrun.testing.jobs import nothing_left

from .test_jobs import distributed_job

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.netns,
    pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason())),
]

CLUSTER = """
machines:
  - {name: m0, cpu: 0, memory_gb: 1.0, bandwidth_gbps: 1}
  - {name: m1, cpu: 0, memory_gb: 1.25, bandwidth_gbps: 1}
"""


class Limits(threading.Thread):
    """The memory cgroups of this launcher's hosts while the job runs: each one's limit,
    peak and whether a process ran in it, by cgroup (one per step: partition, serve)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: dict[str, dict[str, int]] = {}
        self.done = threading.Event()

    def run(self) -> None:
        root = _own_cgroup("memory")
        while not self.done.wait(0.1):
            for g in root.glob(f"{PREFIX}{os.getpid()}-*"):
                try:
                    limit = int((g / "memory.limit_in_bytes").read_text())
                    peak = int((g / "memory.max_usage_in_bytes").read_text())
                    procs = len((g / "cgroup.procs").read_text().split())
                except OSError:  # removed meanwhile
                    continue
                mine = self.seen.setdefault(g.name, {"procs": 0})
                mine.update(limit=limit, peak=peak, procs=max(mine["procs"], procs))


def test_a_whole_job_runs_on_hosts_capped_by_a_cluster_file(tmp_path: Path) -> None:
    features = {"storage": "disk", "cacheMb": 1}
    path, _ = distributed_job(
        tmp_path, chunks=2, epochs=2, lr=0.03,
        runtime={"storeFeatures": features, "featureCacheMb": 1},
    )  # fmt: skip
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    job, sink = run(path, hosts="netns", cluster=tmp_path / "cluster.yaml")
    watch = Limits()
    watch.start()
    try:
        report = job.run()
    finally:
        watch.done.set()
        watch.join(timeout=10)
    out = sink.getvalue()
    assert "[partitioner:0@m0]" in out and "[partitioner:1@m1]" in out
    assert all(report.exits[RoleName.trainer(r)] == 0 for r in range(2))
    assert metrics(path)[-1]["test_acc"] > 0.5  # 4 classes: chance is 0.25
    # two steps on the hosts (the partitioners', then the stores' and trainers'), each
    # host in a cgroup of the file's limit, its processes in it, never above it
    want = {"m0": 2**30, "m1": int(1.25 * 2**30)}
    for machine, limit in want.items():
        groups = {g: v for g, v in watch.seen.items() if g.endswith(f"-{machine}")}
        assert len(groups) == 2, watch.seen
        for v in groups.values():
            assert v["limit"] == limit and v["procs"] > 0 and 0 < v["peak"] <= limit, v
    # and the launcher says, after each step, the most each host held of its limit
    said = re.findall(r"host memory \((partitioning|serving and training)\): (.*)", out)
    assert [step for step, _ in said] == ["partitioning", "serving and training"], out
    for _, hosts in said:
        for machine, limit in want.items():
            got = re.search(rf"{machine} ([\d,]+) of ([\d,]+) MiB", hosts)
            assert got is not None, hosts
            peak_mib, limit_mib = (int(x.replace(",", "")) for x in got.groups())
            assert limit_mib == limit >> 20 and 0 < peak_mib <= limit_mib, hosts
    nothing_left(job)
    assert not list(_own_cgroup("memory").glob(f"{PREFIX}{os.getpid()}-*"))
