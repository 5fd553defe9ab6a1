"""Replicated partitions: a replica server per partition, failover, writes to both.

The chaos tests kill (SIGKILL) or stop (SIGSTOP) a server while a client pushes, at a
seeded moment, and check that every acknowledged push is in the surviving copy exactly
once (an ``add`` of ones: a lost update or one applied twice changes the sum).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from graphrun.errors import RpcTimeout
from graphrun.local.stores import StoreProcess, start_store
from graphrun.rpc.transport import RpcClient
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.registry import Request, Response
from graphrun.store.replicas import apply_write
from graphrun.store.shm import DEFAULT_SHM_DIR, clean_stale
from graphrun.store.state import ServerState
from graphrun.testing.store import make_partition_dir

FEAT = "node/_N/feat"


def test_a_write_id_is_applied_once_per_session():
    state = ServerState.__new__(ServerState)
    state.applied = {}
    calls = []

    def apply(req: Request) -> Response:
        calls.append(req.body["w"])
        return Response({})

    for w in (0, 1, 1, 0, 2):
        apply_write(state, Request("push", {"w": w}, session="s"), apply)
    apply_write(state, Request("push", {"w": 1}, session="t"), apply)
    assert calls == [0, 1, 2, 1]


def test_a_primarys_record_of_dropped_replicas_is_read_back_and_a_bad_one_named(tmp_path):
    """What a primary with a log directory keeps of the replicas it dropped: read back as
    written; a record of another partition, or with a field of the wrong type, is one
    ArgumentError naming the file and the field."""
    from graphrun.errors import ArgumentError
    from graphrun.store.replicas import dropped_path, load_dropped, save_dropped

    path = dropped_path(tmp_path, 3)
    assert load_dropped(path, 3) == {}
    save_dropped(path, 3, {1: "partition 3's primary: no answer", 2: "refused"})
    assert load_dropped(path, 3) == {1: "partition 3's primary: no answer", 2: "refused"}
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ArgumentError, match=f"{path}: field 'part' is 3, not partition 4"):
        load_dropped(path, 3 + 1)
    text = path.read_text().replace('"1":', '"one":')
    path.write_text(text)
    with pytest.raises(ArgumentError, match=f"{path}: dropped"):
        load_dropped(path, 3)
    path.write_text(text.replace('"version": 1', '"version": 9'))
    with pytest.raises(ArgumentError, match="field 'version' is 9"):
        load_dropped(path, 3)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return make_partition_dir(tmp_path_factory.mktemp("rep") / "parts", 2)[1]


def _wait_replicas(primary: StoreProcess, key_file, n: int = 1) -> None:
    from graphrun.rpc.auth import load_keys

    with RpcClient(primary.address, keys=load_keys(key_file), timeout=10) as c:
        deadline = time.monotonic() + 30
        while len(c.call("stats").body["replicas"]) < n:
            primary.check()
            assert time.monotonic() < deadline, "replica never registered"
            time.sleep(0.1)


@pytest.fixture
def replicated(parts, key_file, tmp_path, request):
    """Partition 0 and 1 primaries, each with a replica (its own shared memory); a
    test's ``heartbeat_timeout`` mark sets the servers' (30 s otherwise)."""
    mark = request.node.get_closest_marker("heartbeat_timeout")
    kw = {"key_file": key_file, "log_dir": tmp_path}
    if mark is not None:
        kw["heartbeat_timeout"] = mark.args[0]
    procs: list[StoreProcess] = []
    try:
        primaries = [start_store(parts, p, **kw) for p in (0, 1)]
        procs += primaries
        for sp in primaries:
            replica = start_store(parts, sp.part, extra_args=["--replica-of", sp.address], **kw)
            procs.append(replica)
            _wait_replicas(sp, key_file)
        yield procs[:2], procs[2:]
    finally:
        for sp in procs:
            if sp.alive():
                os.kill(sp.pid, signal.SIGCONT)
            sp.stop()
        clean_stale(DEFAULT_SHM_DIR)  # the segments of the servers a test killed


def _client(primaries, keys, **kw) -> KVClient:
    return KVClient(ClientConfig([p.address for p in primaries], keys=keys, **kw))


def _push_until(c: KVClient, n: int, rng: np.random.Generator, stop: threading.Event):
    """Pushes of ones to random rows until ``stop`` (and at least 20): the expected
    counts of the acknowledged ones."""
    expected = np.zeros(n)
    i = 0
    while not stop.is_set() or i < 20:
        ids = rng.choice(n, size=int(rng.integers(1, 200)), replace=False)
        c.push("acc", ids, np.ones((len(ids), 1)), reducer="add")
        expected[ids] += 1  # acknowledged: push returned
        i += 1
    return expected


@pytest.mark.integration
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("victim", ["primary", "replica"])
def test_a_killed_server_loses_no_acknowledged_push(replicated, keys, seed, victim):
    primaries, replicas = replicated
    rng = np.random.default_rng(seed)
    with _client(primaries, keys, timeout=20, use_shm=seed == 0) as c:
        assert all(len(c.session.part(p).replicas) == 1 for p in (0, 1))
        n = c.meta(FEAT).num_rows
        c.init_tensor("acc", "node:_N", (1,), "float64")
        feats = c.pull(FEAT, np.arange(n))
        stop = threading.Event()
        target = (primaries if victim == "primary" else replicas)[0]
        killer = threading.Timer(float(rng.uniform(0.2, 1.0)), lambda: (target.kill(), stop.set()))
        killer.start()
        try:
            expected = _push_until(c, n, rng, stop)
        finally:
            killer.join()
        assert not target.alive()
        np.testing.assert_array_equal(c.pull("acc", np.arange(n))[:, 0], expected)
        np.testing.assert_array_equal(c.pull(FEAT, np.arange(n)), feats)  # reads go on
        if victim == "primary":
            assert c.session.failovers == [(0, primaries[0].address, replicas[0].address)]
        else:
            assert c.session.failovers == []


@pytest.mark.integration
def test_the_replica_takes_a_push_of_several_tables(replicated, keys):
    """``push_tables`` is a write the replicas take: once partition 0's primary is killed,
    its replica answers the rows it wrote."""
    primaries, replicas = replicated
    with _client(primaries, keys, timeout=20, use_shm=False) as c:
        ids = np.arange(c.meta(FEAT).num_rows)
        c.init_tensor("a", "node:_N", (2,), "float32")
        c.init_tensor("b", "node:_N", (), "int64")
        va = np.random.default_rng(0).random((len(ids), 2), dtype=np.float32)
        c.push_tables([("a", ids, va), ("b", ids, ids * 3)])
        primaries[0].kill()
        np.testing.assert_array_equal(c.pull("a", ids), va)
        np.testing.assert_array_equal(c.pull("b", ids), ids * 3)
        assert c.session.failovers == [(0, primaries[0].address, replicas[0].address)]


@pytest.mark.integration
def test_the_replica_takes_the_sums_moved_on_the_primary(replicated, keys):
    """``move_sums`` (issue 43) is a write the replicas take: the replica moves its own
    copy of the rows by the same request, so once partition 0's primary is killed it
    answers the moved rows, their logits and predictions."""
    from .test_sum_moves import call, random_moves, read, tables

    primaries, replicas = replicated
    rng = np.random.default_rng(0)
    with _client(primaries, keys, timeout=20, use_shm=False) as c:
        tables(c, rng)
        mv = random_moves(rng, c.policy("s").part_rows(0))
        assert call(c, 0, mv)["moved"] == len(mv.rows)
        moved = read(c, 0, mv.rows)
        primaries[0].kill()
        for a, b in zip(read(c, 0, mv.rows), moved, strict=True):
            np.testing.assert_array_equal(a, b)
        assert call(c, 0, mv)["moved"] == 1  # stamped there too: the new node's row alone
        assert c.session.failovers == [(0, primaries[0].address, replicas[0].address)]


@pytest.mark.integration
def test_a_stopped_primary_is_fenced_and_nothing_acknowledged_is_lost(replicated, keys):
    """SIGSTOP the primary: one client fails over after its request timeout; the other
    client's writes to the resumed primary are refused (fenced) and go to the replica."""
    primaries, replicas = replicated
    with _client(primaries, keys, timeout=3) as a, _client(primaries, keys, timeout=60) as b:
        n = a.meta(FEAT).num_rows
        a.init_tensor("acc", "node:_N", (1,), "float64")
        ids = np.arange(n)
        ones = np.ones((n, 1))
        b.push("acc", ids, ones, reducer="add")
        os.kill(primaries[0].pid, signal.SIGSTOP)
        try:
            a.push("acc", ids, ones, reducer="add")  # times out on partition 0, fails over
        finally:
            os.kill(primaries[0].pid, signal.SIGCONT)
        assert [f[0] for f in a.session.failovers] == [0]
        b.push("acc", ids, ones, reducer="add")  # refused by the fenced primary: fails over
        assert b.session.failovers == [(0, primaries[0].address, replicas[0].address)]
        for c in (a, b):
            np.testing.assert_array_equal(c.pull("acc", ids), 3 * ones)


def _train_embedding(c: KVClient, name: str, steps: int, on_step=lambda i: None) -> np.ndarray:
    """DistEmbedding + SparseAdam steps towards a fixed target: the final table."""
    import torch

    from graphrun.store.embedding import DistEmbedding, SparseAdam

    n, d = c.meta(FEAT).num_rows, 4
    emb = DistEmbedding(c, n, d, name, init="normal", init_args={"std": 0.1, "seed": 3})
    opt = SparseAdam([emb], lr=0.05)
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(n, d, generator=gen)
    for i in range(steps):
        on_step(i)
        ids = torch.randint(0, n, (64,), generator=gen)
        opt.zero_grad()
        ((emb(ids) - target[ids]) ** 2).sum().backward()
        opt.step()  # returns once the store acknowledged every row's update
    return c.pull(name, np.arange(n)).copy()


@pytest.mark.integration
def test_dist_embedding_training_through_a_failover_equals_an_undisturbed_run(replicated, keys):
    """SparseAdam's rows and states move in the primary's order on both copies, each
    update once: the table after the primary of partition 1 is killed at step 7 equals
    the table of a run where nothing happened (bit for bit)."""
    primaries, _ = replicated
    with _client(primaries, keys, timeout=20) as c:
        undisturbed = _train_embedding(c, "a", 15)

        def chaos(i: int) -> None:
            if i == 7:
                primaries[1].kill()

        got = _train_embedding(c, "b", 15, chaos)
        assert [f[0] for f in c.session.failovers] == [1]
    np.testing.assert_array_equal(got, undisturbed)


@pytest.mark.integration
def test_a_co_located_reader_notices_its_dead_primary_before_reading_stale_memory(replicated, keys):
    """Client ``a`` reads partition 0 from the primary's shared memory; the primary is
    killed while ``a`` sends it nothing, ``b`` writes through the replica: ``a``'s next
    pull must see the write (the dead primary's memory still maps the old rows)."""
    primaries, replicas = replicated
    with _client(primaries, keys) as a, _client(primaries, keys, use_shm=False) as b:
        assert a.local_parts == [0, 1]
        n = a.meta(FEAT).num_rows
        a.init_tensor("acc", "node:_N", (1,), "float64")
        ids = np.arange(n)
        np.testing.assert_array_equal(a.pull("acc", ids), 0.0)
        primaries[0].kill()
        b.push("acc", ids, np.ones((n, 1)), reducer="add")
        np.testing.assert_array_equal(a.pull("acc", ids), 1.0)
        assert a.session.failovers == [(0, primaries[0].address, replicas[0].address)]


@pytest.mark.integration
def test_a_servers_counters_are_read_from_its_replica_once_the_primary_is_lost(replicated, keys):
    """A trainer reads the disk counters after each epoch: ``stats`` to a lost primary
    failed the trainer instead of failing over like every other request (a flaky CI run)."""
    primaries, replicas = replicated
    with _client(primaries, keys, use_shm=False) as c:
        assert set(c.session.in_use()) == {sp.address for sp in [*primaries, *replicas]}
        primaries[0].kill()
        assert "served" in c.stats(0)
        assert c.disk_counters() is None  # no server serves from disk; none is lost
        assert c.session.failovers == [(0, primaries[0].address, replicas[0].address)]
        # nor heartbeats: the lost primary cost every round a timeout
        assert primaries[0].address not in c.session.in_use()


@pytest.mark.integration
def test_a_client_started_after_its_primary_died_joins_the_replica(replicated, keys):
    primaries, replicas = replicated
    primaries[1].kill()
    servers = [p.address for p in primaries]
    cfg = ClientConfig(servers, keys=keys, timeout=3, replicas=[[], [replicas[1].address]])
    with KVClient(cfg) as c:
        assert c.session.failovers == [(1, primaries[1].address, replicas[1].address)]
        n = c.meta(FEAT).num_rows
        assert c.pull(FEAT, np.arange(n)).shape[0] == n
    # without the hosts file's replicas: no way around it, so a refusal is no answer
    with pytest.raises(RpcTimeout, match="never connected"):
        KVClient(ClientConfig(servers, keys=keys, timeout=3))


@pytest.mark.integration
@pytest.mark.timeout(120)  # a hang detector: each join below would wait 600 s for an answer
def test_a_client_does_not_wait_for_dead_servers_whose_host_refuses(replicated, keys, monkeypatch):
    """A re-joining trainer found its own machine's servers dead: the primary of partition
    1 and the replica of partition 0 (which partition 0's primary still announces). Their
    host refused the connects; the join waited 5 s and 3 s for them all the same. A
    refusal is the answer when there is somewhere else to go."""
    from graphrun.store import session

    monkeypatch.setattr(session, "PRIMARY_JOIN_S", 600.0)
    monkeypatch.setattr(session, "BACKUP_JOIN_S", 600.0)
    primaries, replicas = replicated
    primaries[1].kill()
    replicas[0].kill()
    servers = [p.address for p in primaries]
    cfg = ClientConfig(servers, keys=keys, timeout=600, replicas=[[], [replicas[1].address]])
    with KVClient(cfg) as c:
        assert c.session.failovers == [(1, primaries[1].address, replicas[1].address)]
        assert c.session.part(0).replicas == []  # skipped
        n = c.meta(FEAT).num_rows
        assert c.pull(FEAT, np.arange(n)).shape[0] == n


@pytest.mark.integration
def test_a_stopped_replica_leaves_the_write_set_and_the_primary_goes_on(replicated, keys):
    """SIGSTOP partition 0's replica: the primary's forward times out, drops it (logged,
    ``stats``) and acknowledges; nothing is lost on the primary, the client never fails
    over, and the replica, resumed, takes no more writes."""
    primaries, replicas = replicated
    with _client(primaries, keys, timeout=30) as c:
        n = c.meta(FEAT).num_rows
        c.init_tensor("acc", "node:_N", (1,), "float64")
        ids, ones = np.arange(n), np.ones((n, 1))
        os.kill(replicas[0].pid, signal.SIGSTOP)
        try:
            c.push("acc", ids, ones, reducer="add")
        finally:
            os.kill(replicas[0].pid, signal.SIGCONT)
        c.push("acc", ids, ones, reducer="add")
        np.testing.assert_array_equal(c.pull("acc", ids), 2 * ones)
        assert c.session.failovers == []
        assert (
            c.session.part(0).replicas == [] and len(c.session.part(1).replicas) == 1
        )  # never failed over to
        assert c.stats(0)["dropped_replicas"] == [replicas[0].address]
        assert c.stats(1)["dropped_replicas"] == []


@pytest.mark.integration
def test_a_write_refused_by_both_copies_keeps_the_replica(replicated, keys):
    from graphrun.errors import ArgumentError, StoreError

    primaries, _ = replicated
    with _client(primaries, keys) as c:
        c.init_tensor("acc", "node:_N", (1,), "float64")
        with pytest.raises(StoreError, match="does not exist"):
            c.session.call(
                0, "push", {"name": "nope"}, tensors=(np.zeros(1, np.int64), np.ones((1, 1)))
            )
        with pytest.raises(ArgumentError):
            c.push("acc", [0], np.ones((1, 1)), reducer="no-such-reducer")
        assert c.stats(0)["replicas"] and c.stats(0)["dropped_replicas"] == []
        assert len(c.session.part(0).replicas) == 1


@pytest.mark.integration
@pytest.mark.heartbeat_timeout(3.0)
def test_stopped_servers_do_not_hold_up_the_heartbeats_of_the_live_ones(replicated, keys):
    """Three of four servers stopped (SIGSTOP: connected, never answering): the live one
    still hears from the session every round, and a round costs one timeout, not one
    per stopped server. Before, the heartbeats went one after another, 0.2 s + more than
    1 s for each stopped server (one round in 6 s here), past the live server's 3 s
    heartbeat timeout. A likely cause of a CI failure: in
    tests/local/test_elastic.py a trainer's session lapsed on a live server after a
    machine with two servers was lost."""
    primaries, replicas = replicated
    stopped = [primaries[1], *replicas]
    with _client(primaries, keys, timeout=30, heartbeat_interval=0.2) as c:
        beat = c.session._heartbeat
        assert beat is not None
        for sp in stopped:
            os.kill(sp.pid, signal.SIGSTOP)
        try:
            rounds = beat.rounds
            time.sleep(6.0)
            # 0.2 s + one 1 s timeout a round: about 5 in 6 s (1 before)
            assert beat.rounds - rounds >= 4
            assert c.stats(0)["sessions"] == 1  # the session is known: it never lapsed
        finally:
            for sp in stopped:
                os.kill(sp.pid, signal.SIGCONT)


def _wait_told(replica: StoreProcess, key_file) -> None:
    """Wait (up to 10 s) for ``replica`` to hear from its primary that it was dropped."""
    from graphrun.rpc.auth import load_keys

    with RpcClient(replica.address, keys=load_keys(key_file), timeout=10) as c:
        deadline = time.monotonic() + 10
        while not c.call("stats").body.get("dropped") and time.monotonic() < deadline:
            time.sleep(0.1)


def _drop_replica_0(c: KVClient, replica: StoreProcess, n: int) -> None:
    """SIGSTOP partition 0's replica while ``c`` pushes: its primary drops it."""
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        c.push("acc", np.arange(n), np.ones((n, 1)), reducer="add")
    finally:
        os.kill(replica.pid, signal.SIGCONT)


@pytest.mark.integration
def test_a_client_never_fails_over_to_a_dropped_replica(replicated, keys, key_file):
    """A reader that joined before partition 0's replica was dropped still lists it (it
    never wrote: no answer told it the write set). A second push after the drop reaches
    the primary only. Partition 0's primary lost, the reader fails over to the dropped
    replica, which refuses reads and writes instead of answering stale rows or being
    promoted. Before, it answered 1 where 2 was acknowledged (the first push, queued in
    its socket while it was stopped, it applied when resumed)."""
    from graphrun.errors import StoreError

    primaries, replicas = replicated
    with _client(primaries, keys, timeout=10) as reader, _client(primaries, keys) as c:
        n = c.meta(FEAT).num_rows
        c.init_tensor("acc", "node:_N", (1,), "float64")
        assert len(reader.session.part(0).replicas) == 1
        _drop_replica_0(c, replicas[0], n)
        _wait_told(replicas[0], key_file)
        # a client joining as the primary drops it (listed in the join reply) skips it
        join = {**reader.session.base(), "client": "late"}
        assert reader.session._join_others("replica", [replicas[0].address], 0, join) == []
        c.push("acc", np.arange(n), np.ones((n, 1)), reducer="add")  # the primary only
        primaries[0].kill()
        with pytest.raises(StoreError, match="dropped replica"):
            reader.pull("acc", np.arange(n))
        with pytest.raises(StoreError, match="dropped replica"):
            reader.session.call(0, "push", {"name": "acc", "reducer": "add"},
                                tensors=(np.zeros(1, np.int64), np.ones((1, 1))))  # fmt: skip
        assert reader.stats(1)["dropped_replicas"] == []  # partition 1 unaffected


@pytest.mark.integration
def test_a_restarted_dropped_replica_may_not_rejoin_the_write_set(
    replicated, parts, keys, key_file, tmp_path
):
    """A dropped replica restarted (same index, any address) missed the writes since it
    was dropped: its primary refuses its registration, so it never starts serving and
    never joins the write set again. Before, it was added back, stale."""
    primaries, replicas = replicated
    with _client(primaries, keys) as c:
        n = c.meta(FEAT).num_rows
        c.init_tensor("acc", "node:_N", (1,), "float64")
        _drop_replica_0(c, replicas[0], n)
        replicas[0].kill()
        kw = {"key_file": key_file, "extra_args": ["--replica-of", primaries[0].address]}
        with pytest.raises(Exception, match="dropped"):
            replicas.append(start_store(parts, 0, log_dir=tmp_path, **kw))
        assert c.stats(0)["replicas"] == []


@pytest.mark.integration
def test_a_restarted_primary_with_a_log_still_refuses_the_replica_it_dropped(
    parts, keys, key_file, tmp_path
):
    """With ``--live-dir`` a primary keeps the indices of the replicas it dropped in its
    log directory, before it answers a write without them: killed (-9) and restarted on
    it, it still refuses the dropped replica, which stops at once with one line naming
    ``replica_index`` (exit 2: restarting it cannot help). Before, the restarted primary
    took it back: it had missed the writes acknowledged since its drop, and a failover
    to it would have lost them."""
    from graphrun.errors import StoreFailed

    live = tmp_path / "live"
    live.mkdir()
    kw = {"key_file": key_file, "log_dir": tmp_path}
    logged = ["--live-dir", str(live)]
    procs: list[StoreProcess] = []
    try:
        primaries = [start_store(parts, p, extra_args=logged, **kw) for p in (0, 1)]
        procs += primaries
        replica = start_store(parts, 0, extra_args=["--replica-of", primaries[0].address], **kw)
        procs.append(replica)
        _wait_replicas(primaries[0], key_file)
        with _client(primaries, keys) as c:
            n = c.meta(FEAT).num_rows
            c.init_tensor("acc", "node:_N", (1,), "float64")
            _drop_replica_0(c, replica, n)
            assert c.stats(0)["dropped_replicas"] == [replica.address]
        replica.kill()
        primaries[0].kill()
        restarted = start_store(parts, 0, extra_args=logged, **kw)
        procs.append(restarted)
        again = ["--replica-of", restarted.address]
        with pytest.raises(StoreFailed, match="exited with code 2") as refused:
            procs.append(start_store(parts, 0, extra_args=again, **kw))
        line = str(refused.value).splitlines()[-1]  # the one line it stopped with
        assert line.startswith("graphrun: error: replica_index: register_replica")
        assert "dropped replica: replica 1 was dropped" in line
        with _client([restarted, primaries[1]], keys) as c:
            assert c.stats(0)["replicas"] == []
    finally:
        for sp in procs:
            sp.stop()
        clean_stale(DEFAULT_SHM_DIR)


@pytest.mark.integration
def test_a_drop_the_primary_cannot_record_fails_the_write_and_keeps_the_replica(
    parts, keys, key_file, tmp_path
):
    """With ``--live-dir`` a drop is recorded before a write is answered without the
    replica: when the record cannot be written (a directory in its place), the write
    that timed out on the stopped replica fails (applied on the primary, never
    acknowledged), the primary is not fenced and the replica stays in the write set;
    resumed, it applies that write in order, and the next write reaches both copies
    (read back from the replica once the primary is killed)."""
    from graphrun.errors import StoreError
    from graphrun.store.replicas import dropped_path

    live = tmp_path / "live"
    live.mkdir()
    kw = {"key_file": key_file, "log_dir": tmp_path}
    procs: list[StoreProcess] = []
    try:
        primaries = [start_store(parts, p, extra_args=["--live-dir", str(live)], **kw)
                     for p in (0, 1)]  # fmt: skip
        procs += primaries
        replica = start_store(parts, 0, extra_args=["--replica-of", primaries[0].address], **kw)
        procs.append(replica)
        _wait_replicas(primaries[0], key_file)
        dropped_path(live, 0).mkdir()  # the record's rename fails (as root too)
        with _client(primaries, keys) as c:
            n = c.meta(FEAT).num_rows
            c.init_tensor("acc", "node:_N", (1,), "float64")
            with pytest.raises(StoreError, match="cannot record that replica 1 was dropped"):
                _drop_replica_0(c, replica, n)
            assert c.stats(0)["replicas"] == [replica.address]
            assert not c.stats(0)["dropped_replicas"]
            c.push("acc", np.arange(n), np.ones((n, 1)), reducer="add")
            assert (c.pull("acc", np.arange(n)) == 2).all()
            primaries[0].kill()  # the replica took both: the client fails over to it
            assert (c.pull("acc", np.arange(n)) == 2).all()
    finally:
        for sp in procs:
            sp.stop()
        clean_stale(DEFAULT_SHM_DIR)
