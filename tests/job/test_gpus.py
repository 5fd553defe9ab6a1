"""runtime.gpusPerMachine / runtime.gpus: machines x GPUs, one trainer per GPU."""

from __future__ import annotations

from typing import Any

import pytest

from graphrun.errors import SpecError
from graphrun.job.gpus import split_document, split_gpus
from graphrun.job.spec import parse_job


def doc(**runtime: Any) -> dict[str, Any]:
    return {
        "apiVersion": "graphrun.io/v1alpha1", "kind": "GraphJob", "metadata": {"name": "g"},
        "spec": {"graph": {"dataset": "data"}, "runtime": runtime,
                 "training": {"task": "node-classification"}},
    }  # fmt: skip


def test_one_trainer_per_gpu_by_default() -> None:
    r = parse_job(doc(machines=2, gpusPerMachine=4)).spec.runtime
    assert (r.machines, r.machine_gpus, r.trainers_per_machine) == (2, 4, 4)
    assert parse_job(doc(machines=2, gpusPerMachine=4)).spec.num_trainers == 8
    # said otherwise: kept (trainers share the GPUs round-robin)
    r = parse_job(doc(gpusPerMachine=2, trainersPerMachine=1)).spec.runtime
    assert (r.machine_gpus, r.trainers_per_machine) == (2, 1)
    r = parse_job(doc()).spec.runtime  # CPU trainers
    assert (r.machine_gpus, r.trainers_per_machine) == (0, 1)


def test_gpu_trainers_get_sampler_workers_by_default() -> None:
    assert parse_job(doc(gpusPerMachine=1)).spec.runtime.sampler_workers_per_trainer == 4
    r = parse_job(doc(gpusPerMachine=1, samplerWorkersPerTrainer=0)).spec.runtime
    assert r.sampler_workers_per_trainer == 0
    assert parse_job(doc()).spec.runtime.sampler_workers_per_trainer == 0


def test_a_total_with_one_of_its_factors() -> None:
    r = parse_job(doc(gpus=8, gpusPerMachine=4)).spec.runtime
    assert (r.machines, r.machine_gpus, r.trainers_per_machine) == (2, 4, 4)
    r = parse_job(doc(gpus=6, machines=3)).spec.runtime
    assert (r.machines, r.machine_gpus, r.trainers_per_machine) == (3, 2, 2)
    r = parse_job(doc(gpus=3)).spec.runtime  # alone, locally: all on the one machine
    assert (r.machines, r.machine_gpus) == (1, 3)


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ({"gpus": 6, "gpusPerMachine": 4}, "gpus: 6 is not a multiple of gpusPerMachine"),
        ({"gpus": 8, "gpusPerMachine": 4, "machines": 3}, "make 2 machines, not machines"),
        ({"gpus": 5, "machines": 2}, "gpus: 5 does not divide among machines"),
        ({"gpusPerMachine": -1}, "gpusPerMachine"),
        ({"gpusPerMachine": 65}, "gpusPerMachine"),
        ({"gpus": 0}, "gpus"),
        ({"gpuFeatureCacheMb": -1}, "gpuFeatureCacheMb"),
    ],
)
def test_bad_gpu_fields_are_one_line_naming_the_field(
    runtime: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=message) as err:
        parse_job(doc(**runtime))
    assert "\n" not in str(err.value).strip()


def test_split_like_the_mpi_operator() -> None:
    assert split_gpus(3, 8) == (1, 3)
    assert split_gpus(8, 8) == (1, 8)
    assert split_gpus(16, 8) == (2, 8)
    assert split_gpus(32, 4) == (8, 4)
    with pytest.raises(SpecError, match="not a multiple"):
        split_gpus(12, 8)
    with pytest.raises(SpecError):
        split_gpus(0, 8)


def test_the_operator_splits_a_total_given_alone() -> None:
    job = parse_job(split_document(doc(gpus=16), per_node=8))
    r = job.spec.runtime
    assert (r.machines, r.machine_gpus, r.trainers_per_machine) == (2, 8, 8)
    given = doc(gpus=16, machines=4)  # the user's factors win
    assert split_document(given, 8) is given
    plain = doc(machines=2)
    assert split_document(plain, 8) is plain
