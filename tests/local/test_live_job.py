"""``graphrun run`` of a job that follows a live graph on its own store servers: each
server logs to its partition's directory (spec.live, docs/live.md)."""

from __future__ import annotations

import pytest
import yaml

from graphrun.names import RoleName
from graphrun.testing.jobs import job_metrics, local_job, nothing_left, small_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_live_job_s_store_servers_keep_their_logs_in_the_run_dir(tmp_path):
    path = small_job(tmp_path, runtime={"replicas": 2})
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["live"] = {"follow": "epoch"}
    path.write_text(yaml.safe_dump(doc))
    job, _ = local_job(path)
    job.run()
    live = tmp_path / "runs" / "small" / "live"
    logs = sorted(str(p.relative_to(live)) for p in live.glob("*/*.wal"))
    assert logs == ["0/part-0-replica-1.wal", "0/part-0.wal",
                    "1/part-1-replica-1.wal", "1/part-1.wal"]  # fmt: skip
    assert all((live / p).stat().st_mode & 0o777 == 0o700 for p in ("0", "1"))
    nothing_left(job)


def test_a_live_hetero_job_follows_its_graph_and_trains(tmp_path):
    """hetero-node-classification with spec.live (refused before issue 42's hetero42):
    the trainers follow the graph's head at each epoch and train the target type."""
    path = small_job(tmp_path, hetero=True, nodes=3000, task="hetero-node-classification",
                     targetNodeType="paper", fanouts=[4, 3], epochs=2, lr=0.03)  # fmt: skip
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["live"] = {"follow": "epoch"}
    path.write_text(yaml.safe_dump(doc))
    job, sink = local_job(path)
    report = job.run()
    assert all(report.exits[RoleName.trainer(r)] == 0 for r in range(2))
    assert '"model": "HeteroGNN"' in sink.getvalue()
    assert job_metrics(path)[-1]["test_acc"] > 0.5  # 4 classes: chance is 0.25
    nothing_left(job)
