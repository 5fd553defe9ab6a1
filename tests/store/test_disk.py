"""Node features served from the partition's files through a bounded cache (store/disk.py)."""

import shutil
from dataclasses import replace

import numpy as np
import pytest

from graphrun.errors import PartitionFormatError, StoreError
from graphrun.partition.format import load_partition
from graphrun.store.disk import DiskRows
from graphrun.store.server import ServerConfig, hot_rows, load_main_state, open_node_features
from graphrun.testing.store import store_threads
from tests.store.conftest import connect, reference_rows

FEAT = "node/_N/feat"


def disk_config(parts, keys, cache_bytes, **kw):
    return ServerConfig(
        parts, 0, keys=keys, heartbeat_timeout=30, features="disk",
        disk_cache_bytes=cache_bytes, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("use_shm", [True, False], ids=["co-located", "through-server"])
@pytest.mark.parametrize("cache_bytes", [0, 2000, 1 << 20])
def test_disk_pulls_equal_the_graph_and_count_hits(homo, keys, rng, cache_bytes, use_shm):
    """Co-located, the client reads the shared cache and the file and counts; through the
    server (use_shm False, as a remote client) the server reads and counts."""
    graph, parts = homo
    ids = rng.integers(0, graph.num_nodes, 1500)
    with (
        store_threads(disk_config(parts, keys, cache_bytes), 2) as s,
        connect(s, keys, use_shm=use_shm) as c,
    ):
        assert c.meta(FEAT).disk and c.meta("node/_N/label").disk
        got = c.pull(FEAT, ids)
        np.testing.assert_array_equal(got, reference_rows(graph, parts, "node", "_N", "feat", ids))
        labels = c.pull("node/_N/label", ids)
        ref = reference_rows(graph, parts, "node", "_N", "label", ids)
        np.testing.assert_array_equal(labels, ref)
        served = [c.stats(p)["disk"] for p in (0, 1)]
        assert all(d["cache_bytes"] <= cache_bytes for d in served)
        here = c.catalog.disk_counters()
        assert sum(d["hits"] + d["misses"] for d in served) == (0 if use_shm else 2 * len(ids))
        assert here["hits"] + here["misses"] == (2 * len(ids) if use_shm else 0)
        disk = [here] if use_shm else served
        hits = sum(d["hits"] for d in disk)
        if cache_bytes == 0:
            assert hits == 0
        elif cache_bytes == 1 << 20:  # the whole partition fits: nothing read from the file
            assert sum(d["disk_bytes"] for d in disk) == 0
        else:
            assert 0 < hits < 2 * len(ids)
        # every row pulled was one feature row (32 B) and one label row (8 B)
        pulled = sum(d["hit_bytes"] + d["disk_bytes"] for d in disk)
        assert pulled == len(ids) * (32 + 8)


def test_cache_never_exceeds_its_bytes(homo):
    _, parts = homo
    p = load_partition(parts, 0)
    for budget in (0, 1, 39, 40, 41, 1000, 5000, 10**9):
        disk = open_node_features(p, budget)
        held = sum(d.cache_bytes for d in disk.values())
        assert held <= budget
        if budget >= 10**6:  # room for all: every row cached
            assert all(len(d.rows) == len(d.mapping) for d in disk.values())


def test_the_hot_set_is_the_rows_with_most_in_edges(homo):
    _, parts = homo
    p = load_partition(parts, 1)
    order = hot_rows(p, "_N")
    deg = np.diff(p.indptr[: p.num_inner_nodes + 1])
    assert sorted(order.tolist()) == list(range(p.num_inner_nodes))
    assert (np.diff(deg[order]) <= 0).all()
    feat = p.node_feats["_N"]["feat"]
    index = 4 * len(feat)  # the slot index comes first
    per_row = feat.dtype.itemsize * feat.shape[1]
    d = DiskRows.build(parts / "part-1/node/_N/feat.npy", feat, order, index + 10 * per_row + 5)
    assert sorted(d.rows.tolist()) == sorted(order[:10].tolist())
    assert d.cache_bytes == index + 10 * per_row
    assert len(DiskRows.build(parts / "f", feat, order, index).rows) == 0  # the index alone: none
    rows = np.array([order[0], order[-1], order[0]])
    np.testing.assert_array_equal(d.take(rows), feat[rows])
    assert (d.counters.hits, d.counters.misses) == (2, 1)
    assert d.counters.disk_bytes == per_row and d.counters.hit_bytes == 2 * per_row


def test_disk_features_take_no_shared_memory_and_are_read_only(homo, keys, tmp_path):
    _, parts = homo
    shm = tmp_path / "shm"
    shm.mkdir()
    mem = load_main_state(ServerConfig(parts, 0, shm_dir=shm))
    used_mem = sum(f.stat().st_size for f in shm.iterdir())
    mem.close()
    disk = load_main_state(disk_config(parts, None, 0, shm_dir=shm))
    try:
        used_disk = sum(f.stat().st_size for f in shm.iterdir())
        node_bytes = sum(
            a.nbytes
            for named in load_partition(parts, 0).node_feats.values()
            for a in named.values()
        )
        assert used_mem - used_disk == node_bytes
    finally:
        disk.close()
    with (
        store_threads(disk_config(parts, keys, 0), 2) as s,
        connect(s, keys) as c,
        pytest.raises(StoreError, match="served from disk, read-only"),
    ):
        c.push(FEAT, [0], np.zeros((1, 8), np.float32))


def test_the_cache_is_shared_memory_within_its_bytes(homo, tmp_path):
    """The hot rows and slot index live in shared memory, once per partition, and take no
    more than the cache's bytes (co-located clients map them, they copy nothing)."""
    _, parts = homo
    shm = tmp_path / "shm"
    shm.mkdir()
    used = {}
    for budget in (0, 3000, 6000, 10**6):
        state = load_main_state(disk_config(parts, None, budget, shm_dir=shm))
        try:
            used[budget] = sum(f.stat().st_size for f in shm.iterdir())
            assert sum(d.cache_bytes for d in state.disk.values()) <= budget
            for name, d in state.disk.items():
                info = state.tensors[("", name)].info
                assert info.cache_rows == len(d.cache) and bool(info.cache[0]) == bool(len(d.cache))
        finally:
            state.close()
    assert used[0] < used[3000] < used[6000] < used[10**6]
    for budget in (3000, 6000, 10**6):
        assert used[budget] - used[0] <= budget


def test_a_client_that_cannot_map_the_file_pulls_from_the_server(homo, keys, rng, tmp_path):
    """Another file at the server's path (another mount namespace, a file replaced): the
    client refuses to read it and the server answers, with the same rows."""
    graph, parts = homo
    out = copy_parts(parts, tmp_path)
    ids = rng.integers(0, graph.num_nodes, 300)
    with store_threads(disk_config(out, keys, 2000), 2) as s, connect(s, keys) as c:
        f = out / "part-0" / "node" / "_N" / "feat.npy"
        f.chmod(0o640)  # the same bytes, but not the file the server opened (its ctime)
        got = c.pull(FEAT, ids)
        np.testing.assert_array_equal(got, reference_rows(graph, out, "node", "_N", "feat", ids))
        assert c.stats(0)["disk"]["hits"] + c.stats(0)["disk"]["misses"] > 0  # the server
        assert c.stats(1)["disk"]["hits"] + c.stats(1)["disk"]["misses"] == 0  # read here


def copy_parts(parts, tmp_path):
    out = tmp_path / "parts"
    shutil.copytree(parts, out)
    return out


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_truncated_file_is_one_clear_error(homo, tmp_path, damage):
    _, parts = homo
    out = copy_parts(parts, tmp_path)
    f = out / "part-0" / "node" / "_N" / "feat.npy"
    if damage == "missing":
        f.unlink()
    else:
        with open(f, "r+b") as fh:
            fh.truncate(f.stat().st_size - 40)
    shm = tmp_path / "shm"
    shm.mkdir()
    with pytest.raises(PartitionFormatError, match=str(f)):
        load_main_state(disk_config(out, None, 1000, shm_dir=shm))
    assert list(shm.iterdir()) == []  # nothing made before the check


def test_backups_serve_disk_tensors_from_the_files(homo, keys, rng):
    graph, parts = homo
    from graphrun.testing.store import StoreThread

    ids = rng.integers(0, graph.num_nodes, 400)
    with store_threads(disk_config(parts, keys, 4000), 2) as s:
        backup = StoreThread(
            replace(s[0].cfg, main_address=s[0].address, backup_index=1, part=0)
        ).start()
        try:
            with connect(s, keys) as c:
                got = (
                    c.session.part(0)
                    .conns[1]
                    .call(
                        "pull", {**c.session.base(), "name": FEAT}, (np.arange(5, dtype=np.int64),)
                    )
                )
                ref = c.pull(FEAT, np.arange(5))
                np.testing.assert_array_equal(got.tensors[0], ref)
                assert c.stats(0, 1)["disk"]["hits"] + c.stats(0, 1)["disk"]["misses"] == 5
                np.testing.assert_array_equal(
                    c.pull(FEAT, ids), reference_rows(graph, parts, "node", "_N", "feat", ids)
                )
        finally:
            backup.stop()


def test_a_backup_shares_the_main_servers_cache(homo, keys):
    """A backup reads the main's cache (shared memory, read-only) and the files: the host
    holds one cache per partition, not one per server."""
    from graphrun.rpc.transport import RpcClient
    from graphrun.store.server import attach_backup_state

    _, parts = homo
    with store_threads(disk_config(parts, keys, 4000), 2) as s:
        cfg = replace(s[0].cfg, main_address=s[0].address, backup_index=1)
        main = RpcClient(s[0].address, keys=keys, timeout=10)
        state = attach_backup_state(cfg, main)
        try:
            rows = state.disk[FEAT]
            assert len(rows.cache) and not rows.cache.flags.writeable
            assert not rows.slot.flags.writeable
            np.testing.assert_array_equal(rows.cache, rows.mapping[rows.rows])
        finally:
            state.close()
            main.close()


def test_graphrun_serve_says_which_file_is_truncated_in_one_line(homo, tmp_path):
    from graphrun.testing.procs import run_graphrun

    _, parts = homo
    out = copy_parts(parts, tmp_path)
    f = out / "part-1" / "node" / "_N" / "label.npy"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size - 8)
    shm = tmp_path / "shm"
    shm.mkdir()
    proc = run_graphrun(
        "serve", str(out), "--part", "1", "--insecure", "--shm-dir", str(shm),
        "--features", "disk", "--disk-cache-mb", "1",
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert f"{f}: not a readable .npy array" in lines[0]
    assert list(shm.iterdir()) == []


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [("features", "ssd", "features: 'ssd' is not one of"),
     ("disk_cache_bytes", -1, "disk_cache_bytes: expected an integer"),
     ("disk_cache_bytes", 1.5, "disk_cache_bytes: expected an integer")],
)  # fmt: skip
def test_a_bad_feature_setting_is_refused_before_loading(homo, field, value, text):
    from graphrun.errors import ArgumentError
    from graphrun.store.server import run_server

    _, parts = homo
    with pytest.raises(ArgumentError, match=text):
        run_server(replace(ServerConfig(parts, 0), **{field: value}))


def test_the_epoch_hit_rate_is_of_the_bytes_pulled():
    from graphrun.store.disk import epoch_fields

    before = {"hits": 10, "misses": 10, "hit_bytes": 100, "disk_bytes": 300, "cache_bytes": 5}
    after = {"hits": 30, "misses": 40, "hit_bytes": 400, "disk_bytes": 900, "cache_bytes": 5}
    assert epoch_fields(before, after) == {"disk_hit_rate": 0.3333, "disk_bytes": 600}
    assert epoch_fields(after, after) == {"disk_hit_rate": None, "disk_bytes": 0}
    assert epoch_fields(None, after) == {} and epoch_fields(before, None) == {}
    # what co-located trainers read themselves (their batches' counts) adds to the servers'
    assert epoch_fields(before, after, 900, 300) == {"disk_hit_rate": 0.5714, "disk_bytes": 900}
    assert epoch_fields(None, None, 100, 300) == {"disk_hit_rate": 0.25, "disk_bytes": 300}
