"""A store server killed (``kill -9``) and started again on its address while a client
was idle. The client's next request is answered by the restarted server (issue 42: it
failed "connection lost", the old connection's loss, read only then), unless the
partition has a replica: the restarted primary does not know the client's session, so
the session fails over as it did. On real store processes."""

from __future__ import annotations

import numpy as np
import pytest

from graphrun.local.stores import StoreProcess, start_store
from graphrun.rpc.auth import load_keys
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.shm import DEFAULT_SHM_DIR, clean_stale
from graphrun.testing.store import make_partition_dir
from tests.rpc.test_reconnect import port_of, wait_reconnected
from tests.store.test_live_durable import running
from tests.store.test_replicas import FEAT, _wait_replicas

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path):
    with running(tmp_path) as c:  # a key of its own
        yield c


def _config(addresses, keys) -> ClientConfig:
    """One connection a server (no heartbeat's): the one :func:`wait_reconnected` sees."""
    return ClientConfig(addresses, keys=keys, timeout=20, heartbeat_interval=0, use_shm=False)


def test_a_client_is_answered_by_its_restarted_server(cluster):
    with KVClient(_config(cluster.addresses, load_keys(cluster.key_file))) as c:
        assert c.stats(1)["part"] == 1
        cluster.kill(1)
        cluster.start(1)
        wait_reconnected(port_of(cluster.addresses[1]))
        assert c.stats(1)["part"] == 1


def test_a_primary_restarted_while_idle_is_failed_over_from(tmp_path, key_file, keys):
    """Its replica answers the next read, with the rows pushed before (the restarted
    primary, without a log, has none of them and no session of this client's)."""
    parts = make_partition_dir(tmp_path / "parts", 2)[1]
    kw = {"key_file": key_file, "log_dir": tmp_path}
    procs: list[StoreProcess] = []
    try:
        procs += [start_store(parts, p, **kw) for p in (0, 1)]
        primary = procs[0]
        procs.append(start_store(parts, 0, extra_args=["--replica-of", primary.address], **kw))
        _wait_replicas(primary, key_file)
        with KVClient(_config([sp.address for sp in procs[:2]], keys)) as c:
            ids = np.arange(c.meta(FEAT).num_rows)
            c.init_tensor("acc", "node:_N", (1,), "float64")
            c.push("acc", ids, np.ones((len(ids), 1)), reducer="add")
            primary.kill()
            procs.append(start_store(parts, 0, address=primary.address, **kw))
            wait_reconnected(port_of(primary.address))
            np.testing.assert_array_equal(c.pull("acc", ids), np.ones((len(ids), 1)))
            assert c.session.failovers == [(0, primary.address, procs[2].address)]
    finally:
        for sp in procs:
            sp.stop()
        clean_stale(DEFAULT_SHM_DIR)
