"""Readiness follows the store: a store server stopped (readiness false, requests 503) and
started again at its address (readiness true, answers as before). In a module of its own,
after the others: it restarts a server of the package's store."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from .conftest import Served
from .test_endpoint import infer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _ready(served: Served) -> bool:
    with served.client() as c:
        return bool(c.get("/v2/health/ready").json()["ready"])


def _wait(cond: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_readiness_follows_the_store_away_and_back(served) -> None:
    before = infer(served, [5, 6], mode="full")["logits"]
    served.stores[1].stop()
    assert _wait(lambda: not _ready(served), 20), "ready while a store server is gone"
    with served.client() as c:
        r = c.get("/v2/health/ready")
        assert r.status_code == 503
        body = {"inputs": [{"name": "node_ids", "shape": [1], "datatype": "INT64", "data": [5]}]}
        r = c.post("/v2/models/small/infer", json=body)
        assert r.status_code == 503 and "store" in r.json()["error"]
    served.restart_store(1)
    assert _wait(lambda: _ready(served), 60), "not ready after the store came back"
    np.testing.assert_allclose(infer(served, [5, 6], mode="full")["logits"], before, atol=1e-6)
    with served.client() as c:
        metrics = c.get("/metrics").text
    assert 'graphrun_serving_errors_total{type="store_unavailable"}' in metrics
