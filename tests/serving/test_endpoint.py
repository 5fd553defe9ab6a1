"""The endpoint end to end: real HTTP requests to a real `graphrun infer serve` process
over a real served graph and a real trained job's checkpoint."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from graphrun.distributed import DistGraph, DistNodeDataLoader, initialize
from graphrun.job.spec import load_job
from graphrun.rpc.auth import load_keys
from graphrun.train import inference
from graphrun.train.checkpoint import load_checkpoint
from graphrun.train.distdata import DistGraphData
from graphrun.train.models import SAGE

from .conftest import TOKEN, Served

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def infer(served: Served, ids: list[int], **params: object) -> dict[str, np.ndarray]:
    body = {
        "inputs": [{"name": "node_ids", "shape": [len(ids)], "datatype": "INT64", "data": ids}],
        "parameters": params,
        "outputs": [{"name": "logits"}, {"name": "predictions"}, {"name": "embeddings"}],
    }
    with served.client() as c:
        r = c.post("/v2/models/small/infer", json=body)
    assert r.status_code == 200, r.text
    return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}


class Trainer:
    """What a trainer of the job computes: its model with the checkpoint's weights (built
    as NodeClassification builds it), over the store with the job key."""

    def __init__(self, served: Served) -> None:
        t = load_job(served.job_file).spec.training
        self.fanouts = list(t.fanouts)
        self.ctx = initialize(served.servers, job="small", keys=load_keys(served.key),
                              rank=0, world_size=1, heartbeat_interval=0)  # fmt: skip
        self.data = DistGraphData(DistGraph(self.ctx), 0, 1)
        classes = self.data.num_classes("_N", "label")
        self.model = SAGE(16, t.hidden, classes, len(t.fanouts), t.dropout, "csr", "fp32")
        ckpt = load_checkpoint(served.job_file.parent / "runs" / "small" / "checkpoints")
        assert ckpt is not None
        self.model.load_state_dict(ckpt.model)
        self.model.eval()

    def evaluate(self, ids: list[int], seed: int) -> torch.Tensor:
        """The evaluation forward of a batch of ``ids`` by a loader whose seed is ``seed``."""
        loader = DistNodeDataLoader(self.data.graph, torch.tensor(ids), self.fanouts,
                                    batch_size=len(ids), shuffle=False, seed=seed)  # fmt: skip
        loader.set_epoch(0)
        with torch.no_grad():
            d = next(iter(loader))
            out = self.model(d.x, d.edge_index, d.num_sampled_nodes, d.num_sampled_edges)
        loader.close()
        return out[: len(ids)]


@pytest.fixture(scope="module")
def trainer(served: Served) -> Iterator[Trainer]:
    t = Trainer(served)
    yield t
    t.ctx.close()


def test_health_metadata_and_the_token(served: Served) -> None:
    with served.client(token=None) as c:
        # liveness and readiness need no token (a kubelet's probes carry no secret)
        assert c.get("/v2/health/live").status_code == 200
        assert c.get("/v2/health/ready").json() == {"ready": True}
        for path in ("/v2/models/small", "/v2/models/small/ready", "/metrics"):
            r = c.get(path)
            assert r.status_code == 401 and "Bearer" in r.json()["error"], path
        body = {"inputs": [{"name": "node_ids", "shape": [1], "datatype": "INT64", "data": [1]}]}
        assert c.post("/v2/models/small/infer", json=body).status_code == 401
    with served.client(token=TOKEN[:-1] + "x") as c:
        assert c.get("/v2/models/small").status_code == 401
    with served.client() as c:
        assert c.get("/v2/health/ready").json() == {"ready": True}
        assert c.get("/v2/models/small/ready").status_code == 200
        meta = c.get("/v2/models/small").json()
        assert meta["name"] == "small"
        assert {"name": "features", "datatype": "FP32", "shape": [1, 16]} in meta["inputs"]


def test_sampled_answers_equal_the_trainers_evaluation_forward(served, trainer) -> None:
    ids = [3, 141, 59, 265, 358]
    for seed in (0, 7):
        got = infer(served, ids, seed=seed, mode="sampled")
        want = trainer.evaluate(ids, seed)
        torch.testing.assert_close(torch.from_numpy(got["logits"]).float(), want, atol=1e-5,
                                   rtol=1e-5)  # fmt: skip
        assert got["predictions"].tolist() == want.argmax(-1).tolist()
    # another seed samples other neighbours: other logits
    assert not np.allclose(
        infer(served, ids, seed=1)["logits"], infer(served, ids, seed=7)["logits"]
    )


def _forwards(served: Served) -> float:
    with served.client() as c:
        text = c.get("/metrics").text
    (line,) = [x for x in text.splitlines() if x.startswith("graphrun_serving_batch_ids_count")]
    return float(line.split()[-1])


def test_concurrent_requests_are_micro_batched_and_answered_as_alone(served) -> None:
    requests = [([i, i + 500], i % 3) for i in range(0, 40, 2)]
    alone = {i: infer(served, ids, seed=s)["logits"] for i, (ids, s) in enumerate(requests)}
    got: dict[int, np.ndarray] = {}
    start = threading.Barrier(len(requests))

    def ask(i: int) -> None:
        start.wait(30)
        got[i] = infer(served, requests[i][0], seed=requests[i][1])["logits"]

    before = _forwards(served)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(got) == set(alone)
    for i in alone:
        np.testing.assert_allclose(got[i], alone[i], atol=1e-5, rtol=1e-5)
    # requests that arrive while a forward runs share the next one
    assert _forwards(served) - before < len(requests)


def test_full_neighbour_answers_equal_layerwise_evaluation(served, trainer) -> None:
    ids = list(range(0, 1000, 37))
    got = infer(served, ids, mode="full")
    want = inference.layerwise(trainer.model, trainer.data, "_N", "feat", torch.tensor(ids), 4096,
                               lambda: None)  # fmt: skip
    torch.testing.assert_close(torch.from_numpy(got["logits"]).float(), want, atol=1e-5, rtol=1e-5)


def test_a_new_node_with_a_nodes_features_and_edges_answers_as_that_node(served, trainer) -> None:
    v = 42
    src, _ = trainer.data.in_edges(torch.tensor([v]))
    feats = trainer.data.node_table("_N", "feat")[torch.tensor([v])].float()
    body = {
        "parameters": {"mode": "full"},
        "inputs": [
            {"name": "features", "shape": [1, 16], "datatype": "FP32", "data": feats.tolist()},
            {"name": "neighbors", "shape": [src.numel()], "datatype": "INT64",
             "data": src.tolist()},
        ],
    }  # fmt: skip
    with served.client() as c:
        r = c.post("/v2/models/small/infer", json=body)
    assert r.status_code == 200, r.text
    logits = np.asarray(r.json()["outputs"][0]["data"], dtype=np.float32)
    np.testing.assert_allclose(logits, infer(served, [v], mode="full")["logits"][0], atol=1e-5)


BAD = [
    (b"not json", "not JSON"),
    (b"[]", "JSON object"),
    (b'{"inputs": []}', "inputs"),
    (b'{"inputs": [{"name": "node_ids", "shape": [2], "datatype": "INT64", "data": [1]}]}',
     "holds 2"),
    (b'{"inputs": [{"name": "node_ids", "shape": [1], "datatype": "FP32", "data": [1]}]}', "INT64"),
    (b'{"inputs": [{"name": "node_ids", "shape": [1], "datatype": "INT64", "data": [1000]}]}',
     "not a node"),
    (b'{"inputs": [{"name": "node_ids", "shape": [2], "datatype": "INT64", "data": [4, 4]}]}',
     "twice"),
    (b'{"inputs": [{"name": "node_ids", "shape": [1], "datatype": "INT64", "data": [true]}]}',
     "integers"),
    (b'{"parameters": {"mode": "fast"}, "inputs": [{"name": "node_ids", "shape": [1], '
     b'"datatype": "INT64", "data": [1]}]}', "parameters.mode"),
    (b'{"parameters": {"seed": -1}, "inputs": [{"name": "node_ids", "shape": [1], '
     b'"datatype": "INT64", "data": [1]}]}', "parameters.seed"),
    (b'{"inputs": [{"name": "features", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},'
     b'{"name": "neighbors", "shape": [1], "datatype": "INT64", "data": [1]}]}', "[1, 16]"),
    (b'{"inputs": [{"name": "node_ids", "shape": [1], "datatype": "INT64", "data": [1]}],'
     b'"outputs": [{"name": "secrets"}]}', "outputs"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # nested past the parser's depth
    (b" " * (2 << 20), "at most 1048576"),  # past the body bound
    (b'{"inputs": [{"name": "node_ids", "shape": [2000], "datatype": "INT64", "data": ['
     + b",".join(b"%d" % (i % 1000) for i in range(2000)) + b"]}]}", "at most 1024"),
]  # fmt: skip


@pytest.mark.parametrize("body,says", BAD)
def test_bad_requests_get_400_and_one_line_and_the_server_goes_on(served, body, says) -> None:
    with served.client() as c:
        r = c.post("/v2/models/small/infer", content=body)
        assert r.status_code == 400, r.text
        message = r.json()["error"]
        assert says in message and "\n" not in message and "Traceback" not in message
        assert c.get("/v2/health/ready").status_code == 200  # still serving
    assert served.proc.poll() is None


def test_precomputed_answers_are_the_stored_full_pass(served) -> None:
    from graphrun.cli import main

    args = ["infer", "embed", str(served.job_file), "--key-file", str(served.key)]
    for s in served.servers:
        args += ["--store", s]
    assert main(args) == 0
    ids = [0, 17, 999]
    got, want = infer(served, ids, mode="precomputed"), infer(served, ids, mode="full")
    for k in ("logits", "predictions", "embeddings"):
        np.testing.assert_allclose(got[k], want[k], atol=1e-5)


def test_metrics_count_requests_errors_batches_and_store_time(served) -> None:
    infer(served, [1, 2, 3])
    with served.client() as c:
        assert c.post("/v2/models/small/infer", content=b"{").status_code == 400
        metrics = c.get("/metrics").text
    for line in (
        'graphrun_serving_errors_total{type="bad_request"}',
        'graphrun_serving_requests_total{code="400",route="/v2/models/small/infer"}',
        'graphrun_serving_requests_total{code="200",route="/v2/models/small/infer"}',
        'graphrun_serving_request_seconds_bucket{le="0.005",route="/v2/models/small/infer"}',
        'graphrun_serving_store_seconds_count{stage="sample"}',
        'graphrun_serving_store_seconds_count{stage="fetch"}',
        'graphrun_serving_batch_ids_bucket{le="4.0"}',
    ):
        assert line in metrics, line


def test_a_head_past_16_kib_is_refused_without_a_token(served) -> None:
    """The HTTP parser is h11, which bounds a request's head; uvicorn's "auto" would take
    httptools where it is installed, which kept 50 MB of a stranger's headers."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(served.url)
    with socket.create_connection((url.hostname, url.port), timeout=20) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(1024):  # 1 MiB of headers at most
                s.sendall(b"X-Pad: " + b"a" * 1017 + b"\r\n")
            answer = s.recv(200)  # a parser still waiting for the head: timed out, failed
        except ConnectionError:
            answer = b""  # closed on us: refused
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400")
    with served.client() as c:
        assert c.get("/v2/health/ready").status_code == 200  # still serving
