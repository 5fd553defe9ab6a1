"""A store server killed (``kill -9``) and started again on its address: a client that
was idle meanwhile is answered by it at its first request once connected again (issue
42: that request failed "connection lost", the old connection's loss, read only then).
On real store processes."""

from __future__ import annotations

import pytest

from graphrun.rpc.auth import generate_keys, load_keys
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.shm import DEFAULT_SHM_DIR, clean_stale
from tests.rpc.test_reconnect import port_of, wait_reconnected
from tests.store.test_live_durable import Cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path):
    key_file = tmp_path / "store.key"
    generate_keys(key_file)
    c = Cluster(tmp_path, key_file)
    try:
        c.start(0)
        c.start(1)
        yield c
    finally:
        c.stop()
        clean_stale(DEFAULT_SHM_DIR)


def test_a_client_is_answered_by_its_restarted_server(cluster):
    cfg = ClientConfig(cluster.addresses, keys=load_keys(cluster.key_file), timeout=20,
                       heartbeat_interval=0, use_shm=False)  # fmt: skip
    with KVClient(cfg) as c:
        assert c.stats(1)["part"] == 1
        cluster.kill(1)
        cluster.start(1)
        wait_reconnected(port_of(cluster.addresses[1]))
        assert c.stats(1)["part"] == 1
