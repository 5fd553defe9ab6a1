"""What a job leaves in the temporary directory: nothing of PyG's generated modules."""

from __future__ import annotations

import pytest

from graphrun.machine.warm import SHARED_ENV
from graphrun.testing.jobs import local_job, nothing_left, small_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize(
    "warm_start, shared", [(True, True), (True, False), (False, False)],
    ids=["shared", "warm", "cold"],
)  # fmt: skip
def test_a_job_leaves_no_pyg_template_in_the_temporary_directory(
    tmp_path, monkeypatch, warm_start, shared
):
    """PyG writes each message-passing class's ``propagate`` to a new file of the
    temporary directory and never removes it: four per warm server, one per cold trainer,
    every run (480 in /tmp after a day); the suite's shared server (``shared``) built
    its own before the job."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the job's processes' temporary directory
    if not shared:  # the job starts its own warm server (or none)
        monkeypatch.delenv(SHARED_ENV, raising=False)
    path = small_job(tmp_path / "job", nodes=400)
    job, _ = local_job(path, warm_start=warm_start)
    report = job.run()
    assert set(report.exits.values()) == {0}
    nothing_left(job)
    assert sorted(p.name for p in tmp.rglob("*.py")) == []
