"""A replica that never heard of its drop (its primary died before ``replica_dropped``
reached it: the replica paused or cut off then) reads its primary's record of drops,
``part-P.dropped.json`` in the log directory they share (a GraphJob gives a partition's
primary and replicas one): named there, it serves nothing and is never promoted, and
restarted it stops at once with one line, though the primary is gone."""

from __future__ import annotations

import numpy as np
import pytest

from graphrun.errors import StoreError, StoreFailed
from graphrun.local.stores import StoreProcess, start_store
from graphrun.rpc.transport import RpcClient
from graphrun.store.replicas import dropped_path, save_dropped
from graphrun.store.shm import DEFAULT_SHM_DIR, clean_stale
from graphrun.testing.store import make_partition_dir
from tests.store.test_replicas import FEAT, _client, _wait_replicas

pytestmark = pytest.mark.integration


def test_a_replica_named_in_its_primarys_record_is_never_failed_over_to(keys, key_file, tmp_path):
    """Partition 0's primary records its replica dropped (as it does, synced, before it
    answers a write without it) and dies before telling it. A reader that fails over to
    the replica is refused, and so is a writer (the replica is not promoted: it would
    serve without the writes acknowledged since the drop); restarted, the replica stops
    with one line naming ``replica_index``. Before, it served the reader, took the write
    and was promoted, and restarted it waited for the dead primary."""
    parts = make_partition_dir(tmp_path / "parts", 2)[1]
    live = tmp_path / "live"
    live.mkdir()
    kw = {"key_file": key_file, "log_dir": tmp_path}
    logged = ["--live-dir", str(live)]
    procs: list[StoreProcess] = []
    try:
        primaries = [start_store(parts, p, extra_args=logged, **kw) for p in (0, 1)]
        procs += primaries
        of = ["--replica-of", primaries[0].address]
        replica = start_store(parts, 0, extra_args=[*of, *logged], **kw)
        procs.append(replica)
        _wait_replicas(primaries[0], key_file)
        with _client(primaries, keys, timeout=5) as reader, _client(primaries, keys) as c:
            n = c.meta(FEAT).num_rows
            c.init_tensor("acc", "node:_N", (1,), "float64")
            c.push("acc", np.arange(n), np.ones((n, 1)), reducer="add")  # on both copies
            assert reader.pull("acc", np.arange(n)).sum() == n
            save_dropped(dropped_path(live, 0), 0, {1: "partition 0's primary: no answer"})
            primaries[0].kill()
            with pytest.raises(StoreError, match="dropped replica: replica 1 of partition 0"):
                reader.pull("acc", np.arange(n))
            with pytest.raises(StoreError, match="dropped replica"):
                c.push("acc", np.arange(n), np.ones((n, 1)), reducer="add")
        with RpcClient(replica.address, keys=keys, timeout=5) as admin:
            stats = admin.call("stats").body
        assert not stats["promoted"] and "no answer" in stats["dropped"]
        replica.kill()
        with pytest.raises(StoreFailed, match="exited with code 2") as refused:
            procs.append(start_store(parts, 0, extra_args=[*of, *logged], **kw))
        line = str(refused.value).splitlines()[-1]
        assert line.startswith("graphrun: error: replica_index: dropped replica: replica 1")
    finally:
        for sp in procs:
            sp.stop()
        clean_stale(DEFAULT_SHM_DIR)
