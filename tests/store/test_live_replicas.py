"""A live graph's pieces reach a partition's replica before the write is acknowledged
(issue 42): the replica serves them when its primary is gone."""

from __future__ import annotations

import os
import signal

import pytest

from graphrun.distributed.writer import GraphWriter
from graphrun.local.stores import StoreProcess, start_store
from graphrun.partition import load_id_mapping
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.shm import DEFAULT_SHM_DIR, clean_stale
from graphrun.testing.store import make_partition_dir
from tests.store.test_live_store import FEAT, node_rows
from tests.store.test_replicas import _wait_replicas

pytestmark = pytest.mark.integration


@pytest.fixture
def replicated_live(tmp_path, key_file):
    parts = make_partition_dir(tmp_path / "parts", 2)[1]
    procs: list[StoreProcess] = []
    try:
        primaries = [start_store(parts, p, key_file=key_file, log_dir=tmp_path) for p in (0, 1)]
        procs += primaries
        replica = start_store(parts, 1, key_file=key_file, log_dir=tmp_path,
                              extra_args=["--replica-of", primaries[1].address])  # fmt: skip
        procs.append(replica)
        _wait_replicas(primaries[1], key_file)
        yield parts, primaries, replica
    finally:
        for sp in procs:
            if sp.alive():
                os.kill(sp.pid, signal.SIGCONT)
            sp.stop()
        clean_stale(DEFAULT_SHM_DIR)


def test_a_replica_holds_the_acknowledged_pieces_of_its_partition(replicated_live, keys):
    parts, primaries, replica = replicated_live
    servers = [p.address for p in primaries]
    with KVClient(ClientConfig(servers, keys=keys, timeout=10)) as c:
        w = GraphWriter(c)
        w.add_nodes("_N", [10**9], node_rows(c, 1, 3.0))
        to_500 = load_id_mapping(parts).orig_nids[[500]]  # the node goes to partition 1
        w.add_edges("_E", to_500, [10**9], orig=True)
        v = w.commit()  # acknowledged: held by partition 1's primary and its replica
        new = int(w.lookup([10**9])[0])
    primaries[1].kill()
    cfg = ClientConfig(servers, keys=keys, timeout=5, replicas=[[], [replica.address]])
    with KVClient(cfg) as r:
        assert r.follow() == v
        assert (r.pull(FEAT, [new]) == 3.0).all()
        assert r.session.failovers[0][2] == replica.address
