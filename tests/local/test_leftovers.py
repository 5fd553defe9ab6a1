"""What a job leaves in the temporary directory: nothing of PyG's generated modules."""

from __future__ import annotations

import pytest

from graphrun.testing.jobs import local_job, nothing_left, small_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("warm_start", [True, False], ids=["warm", "cold"])
def test_a_job_leaves_no_pyg_template_in_the_temporary_directory(tmp_path, monkeypatch, warm_start):
    """PyG writes each message-passing class's ``propagate`` to a new file of the
    temporary directory and never removes it: four per warm server, one per cold trainer,
    every run (480 in /tmp after a day)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the job's processes' temporary directory
    path = small_job(tmp_path / "job", nodes=400)
    job, _ = local_job(path, warm_start=warm_start)
    report = job.run()
    assert set(report.exits.values()) == {0}
    nothing_left(job)
    assert sorted(p.name for p in tmp.rglob("*.py")) == []
