"""The engine in this process, over the served graph: one query's failure is its own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from graphrun.errors import BadRequest
from graphrun.job.spec import load_job
from graphrun.rpc.auth import load_keys
from graphrun.serving.engine import Engine
from graphrun.serving.model import ModelSpec
from graphrun.serving.protocol import Query

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


def test_embed_of_a_three_layer_model_equals_layerwise_and_leaves_no_scratch(
    served: Served,
) -> None:
    """Three layers: the first two run layer-wise through scratch tables of the pass's own
    (deleted when done), the last from the stored embeddings."""
    import torch

    from graphrun.distributed import DistGraph, initialize
    from graphrun.serving.embed import embed, table_name
    from graphrun.store.dist_tensor import DistTensor
    from graphrun.train import inference
    from graphrun.train.distdata import DistGraphData
    from graphrun.train.models import SAGE

    torch.manual_seed(0)
    model = SAGE(16, 8, 4, 3, 0.5, "csr", "fp32").eval()
    keys = load_keys(served.store_key)
    with initialize(served.servers, job="deep", keys=keys, heartbeat_interval=0) as ctx:
        data = DistGraphData(DistGraph(ctx), 0, 1)
        got = embed(model, data, "_N", "feat", batch_size=256)
        assert got["nodes"] == 1000 and got["embedding_dim"] == 8 and got["classes"] == 4
        left = [t.name for t in ctx.client.list_tensors() if t.name.startswith("scratch/")]
        assert left == []
        every = torch.arange(1000)
        want = inference.layerwise(model, data, "_N", "feat", every, 256, lambda: None)
        stored = DistTensor(ctx.client, table_name("_N", "logits"))[every]
        torch.testing.assert_close(stored, want, atol=1e-5, rtol=1e-5)
        for name in [
            t.name for t in ctx.client.list_tensors()
        ]:  # this test's job leaves nothing behind
            if name.startswith(("scratch/", "serving/")):
                ctx.client.delete_tensor(name)


def test_a_micro_batch_never_passes_max_batch_ids(served: Served) -> None:
    """The app in this process (its lifespan, a real engine): six requests of three ids
    within one long window, four ids a forward at most: six forwards, none larger."""
    import asyncio

    import httpx

    from graphrun.serving.app import Server, Settings, build_app
    from graphrun.serving.protocol import Bounds

    spec = ModelSpec.of(load_job(served.job_file))
    ckpt = served.job_file.parent / "runs" / "small" / "checkpoints"
    engine = Engine(spec, ckpt, served.servers, load_keys(served.key), "small")
    settings = Settings("small", Bounds(max_batch_ids=4), window_s=0.2, probe_s=60)
    server = Server(engine, settings, lambda: True)
    app = build_app(server)

    async def run() -> list[int]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:

                async def ask(i: int) -> int:
                    ids = [3 * i, 3 * i + 1, 3 * i + 2]
                    node_ids = {"name": "node_ids", "shape": [3], "datatype": "INT64", "data": ids}
                    body = {"inputs": [node_ids]}
                    return (await c.post("/v2/models/small/infer", json=body)).status_code

                return await asyncio.gather(*(ask(i) for i in range(6)))

    assert asyncio.run(run()) == [200] * 6
    metric = server.metrics.batch
    values = {(s.name, s.labels.get("le")): s.value for s in metric.collect()[0].samples}
    assert values[("graphrun_serving_batch_ids_count", None)] == 6
    assert values[("graphrun_serving_batch_ids_sum", None)] == 18
    assert values[("graphrun_serving_batch_ids_bucket", "4.0")] == 6


@pytest.mark.parametrize("follow,version", [("head", None), ("pinned", 0)])
def test_an_engine_following_the_live_graph_reads_at_its_version(
    served: Served, follow: str, version: int | None
) -> None:
    """Nothing written: the head is version 0, the base graph, and the answers are the
    base graph's (a graph written to is `tests/serving/test_refresh.py`'s)."""
    spec = ModelSpec.of(load_job(served.job_file))
    ckpt = served.job_file.parent / "runs" / "small" / "checkpoints"
    keys = load_keys(served.key)
    live = Engine(spec, ckpt, served.servers, keys, "small", follow=follow, version=version)
    base = Engine(spec, ckpt, served.servers, keys, "small")
    try:
        ids = np.array([3, 4, 999], dtype=np.int64)
        got = live.answer([Query("full", 0, ("logits",), ids=ids)]).rows[0]
        want = base.answer([Query("full", 0, ("logits",), ids=ids)]).rows[0]
        assert live.data.graph.version == 0 and base.data.graph.version is None
        assert not isinstance(got, BadRequest) and not isinstance(want, BadRequest)
        np.testing.assert_array_equal(got["logits"], want["logits"])
    finally:
        live.close()
        base.close()


def test_a_micro_batch_pulls_its_features_once_and_answers_each_query_as_alone(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight sampled queries (overlapping neighbourhoods) and a full one: one feature
    pull for the whole forward, each distinct node once; every answer equals its own
    query answered alone."""
    spec = ModelSpec.of(load_job(served.job_file))
    ckpt = served.job_file.parent / "runs" / "small" / "checkpoints"
    engine = Engine(spec, ckpt, served.servers, load_keys(served.key), "small")
    pulls: list[int] = []
    pull = engine.features.node_feature

    def counted(ntype: str, name: str, ids: torch.Tensor) -> torch.Tensor | None:
        pulls.append(int(ids.numel()))
        assert ids.unique().numel() == ids.numel()  # each distinct id once
        return pull(ntype, name, ids)

    monkeypatch.setattr(engine.features, "node_feature", counted)
    try:
        queries = [Query("sampled", s, ("logits",), ids=np.array([s, 500 + s])) for s in range(8)]
        queries.append(Query("full", 0, ("logits",), ids=np.array([3, 999])))
        together = engine.answer(queries).rows
        assert len(pulls) == 1
        for q, got in zip(queries, together, strict=True):
            alone = engine.answer([q]).rows[0]
            assert not isinstance(got, BadRequest) and not isinstance(alone, BadRequest)
            np.testing.assert_allclose(got["logits"], alone["logits"], atol=1e-6)
        assert len(pulls) == 1 + len(queries)
    finally:
        engine.close()


@pytest.mark.parametrize("use_shm", [False, True])
def test_the_precomputed_queries_of_a_micro_batch_share_one_request_an_owner(
    served: Served, monkeypatch: pytest.MonkeyPatch, use_shm: bool
) -> None:
    """Overlapping ids in two queries: over the network one ``pull_tables`` request an
    owner partition for the three tables (logits, embeddings, predictions) of both, no
    ``pull``; from shared memory a pull a table, no request. Each query gets its own
    rows, the full pass's."""
    from graphrun.cli import main
    from graphrun.serving import engine as engine_mod

    args = ["infer", "embed", str(served.job_file), "--key-file", str(served.key)]
    assert main([*args, *(a for s in served.servers for a in ("--store", s))]) == 0
    spec = ModelSpec.of(load_job(served.job_file))
    ckpt = served.job_file.parent / "runs" / "small" / "checkpoints"
    join = engine_mod.initialize
    monkeypatch.setattr(engine_mod, "initialize", lambda *a, **kw: join(*a, **kw, use_shm=use_shm))
    engine = Engine(spec, ckpt, served.servers, load_keys(served.key), "small")
    try:
        engine.answer([Query("precomputed", 0, ("logits",), ids=np.array([1]))])  # tables found
        assert engine.ctx is not None
        client, pulls, ops = engine.ctx.client, list[str](), list[str]()
        pull, request = client.pull, client.session.request

        def counted(name: str, ids: np.ndarray, **kw: Any) -> np.ndarray:
            pulls.append(name)
            return pull(name, ids, **kw)

        def sent(part: int, op: str, *a: Any, **kw: Any) -> Any:
            ops.append(op)
            return request(part, op, *a, **kw)

        monkeypatch.setattr(client, "pull", counted)
        monkeypatch.setattr(client.session, "request", sent)
        a, b = np.array([0, 17]), np.array([17, 5, 999])
        got = engine.answer([Query("precomputed", 0, ("logits",), ids=a),
                             Query("precomputed", 0, ("logits",), ids=b)]).rows  # fmt: skip
        if use_shm:
            assert len(pulls) == 3 and ops == []
        else:
            assert pulls == [] and set(ops) == {"pull_tables"}
            assert 1 <= len(ops) <= len(served.servers)
        for ids, rows in zip((a, b), got, strict=True):
            want = engine.answer([Query("full", 0, ("logits",), ids=ids)]).rows[0]
            assert not isinstance(rows, BadRequest) and not isinstance(want, BadRequest)
            np.testing.assert_allclose(rows["logits"], want["logits"], atol=1e-5)
            np.testing.assert_array_equal(rows["predictions"], want["predictions"])
            assert rows["embeddings"].shape == want["embeddings"].shape
    finally:
        engine.close()
