"""A compacted live store restarts from its compacted partition directory and the rest of
its write-ahead log (issue 42, item 5)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from graphrun.errors import PartitionFormatError
from graphrun.partition import compacted
from graphrun.partition.format import load_partition
from graphrun.store.live_log import log_name
from graphrun.store.wal import WriteAheadLog
from tests.store.test_compact import compact
from tests.store.test_live_durable import check_all_visible, cluster, write_batches  # noqa: F401
from tests.store.test_live_store import in_edges

pytestmark = pytest.mark.integration


def records(log, tmp_path) -> int:
    """The records in a copy of a running server's log (opening it takes a generation)."""
    shutil.copy(log, tmp_path / "copy.wal")
    with WriteAheadLog(tmp_path / "copy.wal") as wal:
        return wal.count


def test_kill_9_after_compaction_replays_the_compacted_directory_and_the_log(
    cluster,  # noqa: F811
    keys,
    tmp_path,
):
    with cluster.client(keys) as c:
        base_in = in_edges(c, np.asarray([3, 500], np.int64))
        written = write_batches(c, cluster.parts, 6)
        head = c.follow()
        logs = [cluster.live / log_name(p, 0) for p in (0, 1)]
        before = [records(f, tmp_path) for f in logs]
        stats = [compact(c, p) for p in (0, 1)]
        assert [s["version"] for s in stats] == [head, head] and all(s["truncated"] for s in stats)
        after = [records(f, tmp_path) for f in logs]
        assert all(a < b for a, b in zip(after, before, strict=True))
        for p in (0, 1):
            assert compacted.read_pointer(cluster.parts, p).live_version == head
            assert (cluster.parts / f"part-{p}.c{head}" / "compact.json").is_file()
        written |= write_batches(c, cluster.parts, 2, first=6)  # in the log only
    for p in (1, 0):  # a partition, then the sequencer (its state: the snapshot)
        cluster.kill(p)
    for p in (0, 1):
        cluster.start(p)
    with cluster.client(keys) as c:
        assert c.follow() == head + 2
        check_all_visible(c, written, base_in)
        written |= write_batches(c, cluster.parts, 2, first=8)  # ids and versions go on
        assert c.follow() == head + 4
        check_all_visible(c, written, base_in)


def test_a_compacted_directory_is_checked_and_a_crashed_write_left_aside(tmp_path):
    root = tmp_path
    (root / "part-0").mkdir()
    a = np.arange(10, dtype=np.int64)
    np.save(root / "part-0" / "nodes.npy", a)
    assert compacted.read(root, 0) is None
    (root / ".part-0.c3.tmp-1-abcd").mkdir()  # a writer killed mid-way: never read
    d = compacted.write(root, 0, 3, {"indptr.npy": a}, {"nodes.npy": root / "part-0/nodes.npy"}, {})
    assert compacted.part_dir(root, 0, "part-0") == d == root / "part-0.c3"
    assert not (root / ".part-0.c3.tmp-1-abcd").exists()
    (root / "part-0.c5").mkdir()  # renamed by a writer killed before its pointer: unused
    (root / "part-0.c5" / "junk").write_bytes(b"x")
    assert compacted.part_dir(root, 0, "part-0") == d
    d5 = compacted.write(root, 0, 5, {"indptr.npy": a + 1}, {}, {})
    assert not (d5 / "junk").exists()
    assert not d.exists() and compacted.read_pointer(root, 0).dir == d5.name
    np.save(d5 / "indptr.npy", a + 2)  # damage no compaction leaves
    with pytest.raises(PartitionFormatError, match=r"indptr.npy: its size or CRC-32"):
        compacted.read(root, 0)


def test_a_partition_loads_from_its_compacted_directory(tmp_path, cluster, keys):  # noqa: F811
    with cluster.client(keys) as c:
        write_batches(c, cluster.parts, 3)
        head = c.follow()
        compact(c, 1)
    p = load_partition(cluster.parts, 1)
    assert int(p.eids.max()) >= p.book.num_edges  # the new in-edges are in its CSC
    assert compacted.read(cluster.parts, 1)[1].live_version == head


def test_a_new_store_on_a_compacted_directory_sees_the_live_graph(cluster, keys):  # noqa: F811
    """Stopped, its logs gone: the compacted directories alone are the live graph (a new
    store on them), and writes go on from the versions and ids they hold."""
    with cluster.client(keys) as c:
        base_in = in_edges(c, np.asarray([3, 500], np.int64))
        written = write_batches(c, cluster.parts, 4)
        head = c.follow()
        assert [compact(c, p)["version"] for p in (0, 1)] == [head, head]
    cluster.stop()
    for f in cluster.live.iterdir():
        f.unlink()
    for p in (0, 1):
        cluster.start(p)
    with cluster.client(keys) as c:
        assert c.follow() == head
        check_all_visible(c, written, base_in)
        written |= write_batches(c, cluster.parts, 2, first=4)
        assert c.follow() == head + 2
        check_all_visible(c, written, base_in)
