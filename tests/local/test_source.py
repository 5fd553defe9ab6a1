"""Partitions remember their dataset: stale ones are made again, never used."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from graphrun.graph import save_dataset
from graphrun.graph.generate import GenParams, community
from graphrun.job.spec import load_job
from graphrun.local.runner import LocalJob
from graphrun.local.source import current, read_source, stale_reason, write_source
from graphrun.testing.jobs import small_job


def _dataset(d: Path, nodes: int) -> None:
    shutil.rmtree(d, ignore_errors=True)
    params = GenParams(nodes=nodes, avg_degree=8, feat_dim=16, classes=4, seed=0)
    save_dataset(community(params), d)


def test_source_tells_a_changed_dataset_and_settings(tmp_path: Path) -> None:
    data, parts = tmp_path / "data", tmp_path / "parts"
    _dataset(data, 200)
    parts.mkdir()
    assert stale_reason(parts, current(data, ["--parts", "2"])) is None  # no record: unknown
    write_source(parts, current(data, ["--parts", "2"]))
    assert read_source(parts) is not None
    assert stale_reason(parts, current(data, ["--parts", "2"])) is None
    assert "settings changed" in str(stale_reason(parts, current(data, ["--parts", "3"])))
    _dataset(data, 300)
    assert "changed since" in str(stale_reason(parts, current(data, ["--parts", "2"])))
    other = tmp_path / "other"
    _dataset(other, 200)
    assert "made from" in str(stale_reason(parts, current(other, ["--parts", "2"])))


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_stale_partitions_are_made_again(tmp_path: Path) -> None:
    path = small_job(tmp_path, nodes=400)
    shutil.rmtree(tmp_path / "parts")  # the job partitions it itself, and says from what
    sink = io.StringIO()
    job = LocalJob(load_job(path), path, sink=sink)
    job.check_inputs()
    job._partition()
    assert read_source(tmp_path / "parts") is not None
    assert job._stale() is None  # partitioning did not change the dataset
    job._partition()
    assert "using the partitions in" in sink.getvalue()
    _dataset(tmp_path / "data", 600)  # the dataset changed since
    job = LocalJob(load_job(path), path, sink=sink)
    job.check_inputs()  # a stale partition is not checked against the job: it is rebuilt
    job._partition()
    assert "are stale" in sink.getvalue()
    meta = json.loads((tmp_path / "parts" / "partition.json").read_text())
    assert meta["num_nodes"] == 600
    assert job._stale() is None
    assert not (tmp_path / ".parts.stale").exists()
