"""``graphrun bench train --sync``: the modes it takes and what each line adds."""

from __future__ import annotations

import argparse

import pytest

from graphrun.bench.train import sync_fields, sync_modes
from graphrun.errors import ArgumentError


def test_sync_modes_are_checked():
    assert sync_modes("allreduce, ps,ps-async", 2, 1) == ["allreduce", "ps", "ps-async"]
    for text, flag in [("ps,ps", "--sync"), ("nccl", "--sync"), ("", "--sync")]:
        with pytest.raises(ArgumentError, match=flag):
            sync_modes(text, 2, 1)
    with pytest.raises(ArgumentError, match="--staleness"):
        sync_modes("ps-async", 0, 1)
    with pytest.raises(ArgumentError, match="--parameter-servers"):
        sync_modes("ps", 2, 0)


def test_ps_lines_compare_with_the_allreduce_run():
    args = argparse.Namespace(parameter_servers=2, staleness=3)
    base = {"test_acc": 0.70, "epoch_s": 2.0}
    out = sync_fields("ps-async", args, {"test_acc": 0.695, "epoch_s": 1.5}, base)
    assert out == {
        "sync": "ps-async", "parameter_servers": 2, "staleness": 3,
        "test_acc_minus_allreduce": -0.005, "epoch_ratio_to_allreduce": 0.75,
    }  # fmt: skip
    assert sync_fields("ps", args, base, None)["staleness"] == 0
    assert sync_fields("allreduce", args, base, None) == {"sync": "allreduce"}


def test_placement_real_job_with_parameter_servers_is_a_valid_graphjob(tmp_path):
    from graphrun.bench.placement_real import job_data
    from graphrun.job.spec import job_roles, parse_job

    data = job_data(tmp_path, ["m0", "m1", "m2"], tmp_path / "parts", 4, 1000, 2)
    roles = [r.name for r in job_roles(parse_job(data).spec)]
    assert "ps:1" in roles and "ps:2" not in roles
    plain = parse_job(job_data(tmp_path, ["m0", "m1"], tmp_path / "parts", 4)).spec
    assert plain.training.sync == "allreduce" and plain.num_ps == 0


def test_an_asynchronous_ps_job_is_planned_with_its_staleness(tmp_path):
    # the placement job carries training.staleness (it was planned as a synchronous PS)
    from graphrun.bench.placement_real import job_data
    from graphrun.job.planning import graphjob_to_placement
    from graphrun.job.spec import parse_job

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.npy").write_bytes(b"0" * 1000)
    data = job_data(tmp_path / "data", ["m0", "m1"], tmp_path / "parts", 4, 1000, 1, 2)
    job_file = tmp_path / "job.yaml"
    gp = graphjob_to_placement(parse_job(data, str(job_file)), job_file, "products", 8)
    assert gp.job.spec.sync == "ps" and gp.job.spec.staleness == 2
    sync = job_data(tmp_path / "data", ["m0", "m1"], tmp_path / "parts", 4, 1000, 1)
    assert graphjob_to_placement(parse_job(sync), job_file, "products", 8).job.spec.staleness == 0
