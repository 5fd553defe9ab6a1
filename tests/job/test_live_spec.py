"""``spec.live``: a job that follows a live graph (issue 42, docs/live.md)."""

from __future__ import annotations

from typing import Any

import pytest

from graphrun.job.spec import parse_job
from tests.job.test_spec import error_of, job


def test_live_follow_defaults_to_epoch_and_is_optional() -> None:
    assert parse_job(job()).spec.live is None
    assert parse_job(job(live={})).spec.live.follow == "epoch"
    assert parse_job(job(live={"follow": "pinned"})).spec.live.follow == "pinned"
    assert parse_job(job(live={"logDir": "/var/lib/g"})).spec.live.log_dir == "/var/lib/g"
    # the version each batch is read at reaches the sampler workers (docs/live.md)
    workers = job(live={}, runtime={"samplerWorkersPerTrainer": 2})
    assert parse_job(workers).spec.runtime.sampler_workers_per_trainer == 2
    # a heterograph's job follows too (tests/distributed/test_live_hetero.py)
    hetero = job(live={}, training={"task": "hetero-node-classification"})
    assert parse_job(hetero).spec.live.follow == "epoch"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"live": {"follow": "always"}}, "spec.live.follow"),
        ({"live": {"logDir": ""}}, "spec.live.logDir"),
        ({"live": {"logDir": "a\x00b"}}, "spec.live.logDir"),
        ({"live": {"logDir": "logs"},
          "graph": {"store": {"addresses": ["tcp://h:1"], "keyFile": "k"}}},
         "live.logDir: the job's own store servers log there"),
    ],
)  # fmt: skip
def test_live_errors(spec: dict[str, Any], expected: str) -> None:
    assert expected in error_of(job(**spec))
