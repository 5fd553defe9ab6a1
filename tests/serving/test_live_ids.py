"""Requests naming the live graph's new nodes (issue 43, item 1): an endpoint following a
live graph answers for a node written after the base, in every mode, and a new node's id
that is none at its version is that request's 400 (graphrun/serving/live_ids.py)."""

from __future__ import annotations

import numpy as np
import pytest

from graphrun.cli import main
from graphrun.distributed.writer import GraphWriter
from graphrun.errors import BadRequest
from graphrun.job.spec import load_job
from graphrun.local.stores import start_store
from graphrun.partition import load_id_mapping
from graphrun.rpc.auth import load_keys
from graphrun.serving import refresh
from graphrun.serving.engine import Engine
from graphrun.serving.model import ModelSpec
from graphrun.serving.protocol import Bounds, parse
from graphrun.store.client import ClientConfig, KVClient

from .conftest import TOKEN, Served, serve_endpoint

pytestmark = pytest.mark.integration

ORIG = 10**9  # the new nodes' original ids


def add(servers: list[str], writer, parts, k: int, src: list[int], dst: list[int]) -> None:
    """New node ``ORIG + k`` (features all ``k``) with in-edges from base ids ``src`` and
    out-edges to ``dst``."""
    orig = load_id_mapping(parts).orig_nids
    with KVClient(ClientConfig(servers, job="writer", keys=load_keys(writer))) as c:
        w = GraphWriter(c)
        flags = {m: np.zeros(1, bool) for m in ("train_mask", "val_mask", "test_mask")}
        feat = np.full((1, 16), float(k), np.float32)
        w.add_nodes("_N", [ORIG + k], {"feat": feat, **flags}, label=np.zeros(1, np.int64))
        me = np.full(len(src) + len(dst), ORIG + k, np.int64)
        w.add_edges("_E", np.concatenate([orig[src], me[len(src) :]]),
                    np.concatenate([me[: len(src)], orig[dst]]), orig=True)  # fmt: skip
        w.commit()


def ids_body(ids: list[int], mode: str) -> dict[str, object]:
    node_ids = {"name": "node_ids", "shape": [len(ids)], "datatype": "INT64", "data": ids}
    return {"parameters": {"mode": mode}, "inputs": [node_ids]}


def new_node_body(k: int, neighbors: list[int]) -> dict[str, object]:
    return {"parameters": {"mode": "full"}, "inputs": [
        {"name": "features", "shape": [1, 16], "datatype": "FP32", "data": [float(k)] * 16},
        {"name": "neighbors", "shape": [len(neighbors)], "datatype": "INT64", "data": neighbors},
    ]}  # fmt: skip


def test_requests_name_new_nodes_of_the_live_graph(served: Served, tmp_path) -> None:
    # stores of their own on the served job's partitions, with a writer: the writes stay
    # in their memory, not in the package's shared stores
    d = tmp_path
    assert main(["keygen", str(d / "store.key")]) == 0
    for name, more in (("small", []), ("writer", ["--grants", "write_graph"])):
        assert main(["keygen", str(d / f"{name}.key"), "--store", str(d / "store.key"),
                     "--clients", str(d / "clients"), *more]) == 0  # fmt: skip
    extra = ["--clients", str(d / "clients")]
    stores = [start_store(served.parts, p, key_file=d / "store.key", extra_args=extra)
              for p in range(2)]  # fmt: skip
    servers = [s.address for s in stores]
    spec = ModelSpec.of(load_job(served.job_file))
    ckpt = served.job_file.parent / "runs" / "small" / "checkpoints"
    keys = load_keys(d / "small.key")
    engine = base = None
    try:
        add(servers, d / "writer.key", served.parts, 0, [1, 2, 3], [4])
        engine = Engine(spec, ckpt, servers, keys, "small", follow="head")
        base = Engine(spec, ckpt, servers, keys, "small")
        (new,) = engine.ctx.client.live_nodes()[0].tolist()
        assert new >= 1000
        # the parse's bound is the base graph's for an engine that does not follow
        with pytest.raises(BadRequest, match=f"id {new} is not a node"):
            parse(ids_body([new], "full"), base.graph, Bounds())
        full = parse(ids_body([new, 5], "full"), engine.graph, Bounds())
        sampled = parse(ids_body([new], "sampled"), engine.graph, Bounds())
        alike = parse(new_node_body(0, [1, 2, 3]), engine.graph, Bounds())
        none = parse(ids_body([new + 1, 5], "full"), engine.graph, Bounds())
        stored = parse(ids_body([new, 5], "precomputed"), engine.graph, Bounds())
        got = engine.answer([full, sampled, alike, none, stored]).rows
        assert engine.connected  # a bad id is its request's, not a store gone away
        # the written node equals a request carrying its features and in-neighbours
        assert not isinstance(got[0], BadRequest) and not isinstance(got[2], BadRequest)
        np.testing.assert_allclose(got[0]["logits"][0], got[2]["logits"][0], atol=1e-5)
        assert not isinstance(got[1], BadRequest) and got[1]["logits"].shape == (1, 4)
        assert isinstance(got[3], BadRequest)
        assert f"id {new + 1} is not a node of the live graph at version 1" in str(got[3])
        assert isinstance(got[4], BadRequest) and "--live" in str(got[4])
        # the kept states hold its rows: precomputed answers equal the full forward
        refresh.full(engine.model, engine.data, engine.ntype, spec.feature, 256)
        rows = engine.answer([stored]).rows[0]
        assert not isinstance(rows, BadRequest)
        for k in ("logits", "embeddings", "predictions"):
            np.testing.assert_allclose(rows[k], got[0][k], atol=1e-5, err_msg=k)
        # a node added since has none until a refresh
        add(servers, d / "writer.key", served.parts, 1, [7], [])
        engine.ctx.client.follow()
        (newer,) = np.setdiff1d(engine.ctx.client.live_nodes()[0], [new]).tolist()
        later = parse(ids_body([newer], "precomputed"), engine.graph, Bounds())
        (before,) = engine.answer([later]).rows
        assert isinstance(before, BadRequest) and "--refresh" in str(before)
        refresh.refresh(engine.model, engine.data, engine.ntype, spec.feature, 256)
        (after,) = engine.answer([later]).rows
        want = engine.answer([parse(ids_body([newer], "full"), engine.graph, Bounds())]).rows[0]
        assert not isinstance(after, BadRequest) and not isinstance(want, BadRequest)
        np.testing.assert_allclose(after["logits"], want["logits"], atol=1e-5)
        # over HTTP: an endpoint following the head answers for the new node
        (d / "token").write_text(TOKEN)
        args = [
            str(served.job_file),
            "--key-file",
            str(d / "small.key"),
            "--token-file",
            str(d / "token"),
            "--follow",
            "head",
            *(a for s in servers for a in ("--store", s)),
        ]
        proc, url, _ = serve_endpoint(d, args)
        try:
            import httpx

            with httpx.Client(base_url=url, timeout=30,
                              headers={"Authorization": f"Bearer {TOKEN}"}) as c:  # fmt: skip
                ok = c.post("/v2/models/small/infer", json=ids_body([new, 5], "full"))
                bad = c.post("/v2/models/small/infer", json=ids_body([newer + 1], "full"))
        finally:
            proc.terminate()
            proc.wait(30)
        assert ok.status_code == 200, ok.text
        logits = np.asarray(ok.json()["outputs"][0]["data"]).reshape(2, 4)
        np.testing.assert_allclose(logits[0], got[0]["logits"][0], atol=1e-5)
        assert bad.status_code == 400 and "is not a node of the live graph" in bad.text
    finally:
        for e in (engine, base):
            if e is not None:
                e.close()
        for s in stores:
            s.stop()
