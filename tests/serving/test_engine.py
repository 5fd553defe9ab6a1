"""The engine in this process, over the served graph: one query's failure is its own."""

from __future__ import annotations

import numpy as np
import pytest

from graphrun.job.spec import load_job
from graphrun.rpc.auth import load_keys
from graphrun.serving.engine import Engine
from graphrun.serving.model import ModelSpec
from graphrun.serving.protocol import BadRequest, Query

from .conftest import Served

pytestmark = pytest.mark.integration


def test_a_precomputed_query_without_embeddings_fails_alone_in_its_micro_batch(
    served: Served,
) -> None:
    spec = ModelSpec.of(load_job(served.job_file))
    ckpt = served.job_file.parent / "runs" / "small" / "checkpoints"
    # a job of its own (the admin key may act as any): no embeddings were written for it
    engine = Engine(spec, ckpt, served.servers, load_keys(served.store_key), "fresh")
    try:
        ids = np.array([3, 4], dtype=np.int64)
        stats = engine.answer([
            Query("precomputed", 0, ("logits",), ids=ids),
            Query("sampled", 0, ("logits",), ids=ids),
            Query("full", 0, ("logits",), ids=ids),
        ])  # fmt: skip
        bad, sampled, full = stats.rows
        assert isinstance(bad, BadRequest) and "graphrun infer embed" in str(bad)
        assert not isinstance(sampled, BadRequest) and sampled["logits"].shape == (2, 4)
        assert not isinstance(full, BadRequest) and full["predictions"].shape == (2,)
        assert stats.ids == 6
    finally:
        engine.close()
