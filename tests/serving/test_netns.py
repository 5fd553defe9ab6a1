"""A non-loopback bind, for real: the endpoint (and a store of its own) in one network
namespace listening on its 10.x address, asked from another namespace over the veth
link; the token is wanted on every route but the two health routes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from graphrun.local.netns import NetnsNetwork, unavailable_reason
from graphrun.local.stores import start_store

from .conftest import TOKEN, Served, serve_endpoint

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason())),
]

ASK = """
import json, sys, httpx
url, token = sys.argv[1], sys.argv[2]
body = {"inputs": [{"name": "node_ids", "shape": [1], "datatype": "INT64", "data": [7]}]}
out = {}
with httpx.Client(base_url=url, timeout=30) as c:
    out["live"] = c.get("/v2/health/live").status_code
    out["ready"] = c.get("/v2/health/ready").status_code
    out["no_token"] = c.post("/v2/models/small/infer", json=body).status_code
    auth = {"Authorization": "Bearer " + token}
    r = c.post("/v2/models/small/infer", json=body, headers=auth)
    out["token"] = r.status_code
    out["shape"] = r.json()["outputs"][0]["shape"]
print(json.dumps(out))
"""


def test_a_non_loopback_bind_wants_the_token(served: Served) -> None:
    d = served.job_file.parent
    with NetnsNetwork(["srv", "cli"], subnet="10.77.43") as net:
        stores = []
        try:
            for p in range(2):  # the store the endpoint reaches, on srv's own loopback
                stores.append(start_store(
                    served.parts, p, key_file=served.store_key, launcher=net.prefix("srv"),
                    extra_args=["--clients", str(served.clients)],
                ))  # fmt: skip
            host = net.address("srv")
            args = [str(served.job_file), "--key-file", str(served.key), "--host", host,
                    "--token-file", str(d / "token")]  # fmt: skip
            for s in stores:
                args += ["--store", s.address]
            proc, url, log = serve_endpoint(d, args, net.prefix("srv"))
            try:
                assert url.startswith(f"http://{host}:")
                asked = subprocess.run(
                    [*net.prefix("cli"), sys.executable, "-c", ASK, url, TOKEN],
                    capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                assert asked.returncode == 0, asked.stderr + log.read_text()
                got = json.loads(asked.stdout.strip().splitlines()[-1])
                assert got == {"live": 200, "ready": 200, "no_token": 401, "token": 200,
                               "shape": [1, 4]}  # fmt: skip
            finally:
                proc.terminate()
                proc.wait(30)
        finally:
            for s in stores:
                s.stop()
