"""A client on another "host" (network namespace) gets the same bytes over the network."""

import json
import subprocess
import sys

import numpy as np
import pytest

from graphrun.local.netns import NetnsNetwork, unavailable_reason
from graphrun.local.stores import start_store
from graphrun.testing.procs import child_env
from tests.store.conftest import reference_rows

pytestmark = [
    pytest.mark.netns,
    pytest.mark.integration,
    pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason())),
]

CLIENT = """
import json, sys, numpy as np
from graphrun.rpc.auth import load_keys
from graphrun.store.client import ClientConfig, KVClient
addr, key, ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with KVClient(ClientConfig([addr], keys=load_keys(key), use_shm=False, timeout=20)) as c:
    x = c.pull("node/_N/feat", np.array(ids))
    print(json.dumps({"local": c.local_parts, "hex": x.tobytes().hex()}))
"""


def test_client_in_another_namespace(tmp_path, key_file):
    from graphrun.testing.store import make_partition_dir

    graph, parts = make_partition_dir(tmp_path / "parts", 1)
    ids = [0, 5, 599, 17, 5]
    with NetnsNetwork(["a", "b"]) as net:
        a = net.address("a")
        store = start_store(
            parts, 0, key_file=key_file, address=f"tcp://{a}:0", launcher=net.prefix("a")
        )
        try:
            assert store.address.startswith(f"tcp://{a}:")
            env = child_env()
            cmd = [
                *net.prefix("b"),
                sys.executable,
                "-c",
                CLIENT,
                store.address,
                str(key_file),
                json.dumps(ids),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
            assert out.returncode == 0, out.stderr
            got = json.loads(out.stdout)
            ref = reference_rows(graph, parts, "node", "_N", "feat", np.array(ids))
            assert got["local"] == [] and bytes.fromhex(got["hex"]) == ref.tobytes()
        finally:
            assert store.stop() == 0
