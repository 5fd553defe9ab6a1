"""A live graph with replicas (issue 42, item 5): a partition's pieces and the
sequencer's versions and decisions reach the replica before a write is acknowledged, so
the loss of a machine — its processes and its disk — loses no acknowledged write."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from graphrun.distributed.writer import GraphWriter
from graphrun.errors import StoreError
from graphrun.local.stores import StoreProcess, start_store
from graphrun.partition import compacted, load_id_mapping
from graphrun.rpc.auth import KeyPair, load_keys, new_keypair, public_key_file_text
from graphrun.rpc.transport import RpcClient
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.live_log import base_name, log_name
from graphrun.store.shm import DEFAULT_SHM_DIR, clean_stale
from graphrun.testing.store import make_partition_dir
from tests.store.test_compact_durable import records
from tests.store.test_live_durable import BASE_ORIG, check_all_visible, write_batches
from tests.store.test_live_store import FEAT, in_edges, node_rows
from tests.store.test_replicas import _wait_replicas

pytestmark = pytest.mark.integration


class Machines:
    """Two "machines", each a log directory: m0 holds partition 0's primary and
    partition 1's replica, m1 partition 1's primary and partition 0's replica."""

    def __init__(self, tmp: Path, key_file: Path) -> None:
        self.tmp, self.key_file = tmp, key_file
        self.parts = make_partition_dir(tmp / "parts", 2)[1]
        self.live = [tmp / "m0", tmp / "m1"]
        self.primaries: list[StoreProcess] = []
        self.replicas: list[StoreProcess] = []
        self.clients = tmp / "clients"
        self.clients.mkdir()

    def start(self) -> None:
        for p in (0, 1):
            self.primaries.append(self._serve(p, p))
        for p in (0, 1):
            primary = self.primaries[p].address
            self.replicas.append(self._serve(p, 1 - p, "--replica-of", primary))
        for p in (0, 1):
            _wait_replicas(self.primaries[p], self.key_file)

    def _serve(self, part: int, machine: int, *args: str) -> StoreProcess:
        live = self.live[machine]
        live.mkdir(exist_ok=True)
        extra = ["--live-dir", str(live), "--clients", str(self.clients), *args]
        return start_store(self.parts, part, key_file=self.key_file, log_dir=self.tmp,
                           extra_args=extra)  # fmt: skip

    def lose(self, machine: int) -> None:
        """SIGKILL every store process of ``machine`` and delete its disk (the logs)."""
        self.primaries[machine].kill()
        self.replicas[1 - machine].kill()
        shutil.rmtree(self.live[machine])

    def serving(self, machine_lost: int) -> list[StoreProcess]:
        return [self.primaries[1 - machine_lost], self.replicas[machine_lost]]

    def job_key(self, name: str) -> KeyPair:
        """A job's key (no grant): admitted, but it may not write the graph."""
        pair = new_keypair()
        keys = KeyPair(pair.public, pair.secret, server=load_keys(self.key_file).public)
        (self.clients / f"{name}.key").write_text(public_key_file_text(keys.public, ()))
        return keys

    def config(self, keys, **kw) -> ClientConfig:
        reps = [[r.address] for r in self.replicas]
        return ClientConfig([p.address for p in self.primaries], keys=keys, replicas=reps, **kw)

    def stop(self) -> None:
        for sp in self.primaries + self.replicas:
            if sp.alive():
                os.kill(sp.pid, signal.SIGCONT)
            sp.stop()


@pytest.fixture
def machines(tmp_path, key_file):
    m = Machines(tmp_path, key_file)
    try:
        m.start()
        yield m
    finally:
        m.stop()
        clean_stale(DEFAULT_SHM_DIR)


def stats(sp: StoreProcess, key_file: Path) -> dict:
    with RpcClient(sp.address, keys=load_keys(key_file), timeout=10) as c:
        return c.call("stats").body


def test_a_replica_holds_the_acknowledged_pieces_of_its_partition(machines, keys):
    servers = [p.address for p in machines.primaries]
    with KVClient(ClientConfig(servers, keys=keys, timeout=10)) as c:
        w = GraphWriter(c)
        w.add_nodes("_N", [10**9], node_rows(c, 1, 3.0))
        to_500 = load_id_mapping(machines.parts).orig_nids[[500]]  # the node goes to part 1
        w.add_edges("_E", to_500, [10**9], orig=True)
        v = w.commit()  # acknowledged: held by partition 1's primary and its replica
        new = int(w.lookup([10**9])[0])
    # the forwarded piece was taken unchecked against the replica's index (its edge ends
    # at the new node), and the commit left unindexed: nothing read it there
    assert stats(machines.replicas[1], machines.key_file)["live"]["index_work"] == 0
    machines.primaries[1].kill()
    with KVClient(machines.config(keys, timeout=5)) as r:
        assert r.follow() == v
        assert (r.pull(FEAT, [new]) == 3.0).all()
        assert r.session.failovers[0][2] == machines.replicas[1].address


def test_the_sequencer_s_replica_holds_partition_0s_piece_of_the_forwarded_begin(machines, keys):
    """Partition 0's piece rides in the live_begin: the forward of that one request
    gives partition 0's replica the version and the piece (no live_prepare there)."""
    servers = [p.address for p in machines.primaries]
    with KVClient(ClientConfig(servers, keys=keys, timeout=10)) as c:
        base = in_edges(c, np.asarray([3], np.int64))[0]
        w = GraphWriter(c)
        w.add_nodes("_N", [10**9], node_rows(c, 1, 4.0))
        w.add_edges("_E", [10**9, 10**9], load_id_mapping(machines.parts).orig_nids[[3, 3]],
                    orig=True)  # fmt: skip
        v = w.commit()
        new = int(w.lookup([10**9])[0])
    assert "live_prepare" not in stats(machines.primaries[0], machines.key_file)["served"]
    machines.primaries[0].kill()
    with KVClient(machines.config(keys, timeout=5)) as r:
        assert r.follow() == v
        assert (r.pull(FEAT, [new]) == 4.0).all()
        got = in_edges(r, np.asarray([3], np.int64))[0] - base
        assert len(got) == 2 and all(e >= r.book.num_edges for e in got)


@pytest.mark.parametrize("lost", [0, 1], ids=["sequencer-machine", "partition-machine"])
def test_losing_a_machine_mid_ingest_loses_no_acknowledged_write(machines, keys, lost):
    """Machine ``lost`` (a primary, the other partition's replica and its disk) goes
    while a writer commits; the writer goes on through the replicas (partition 0's holds
    the sequencer), and afterwards every acknowledged batch is wholly visible and no
    piece or version is left pending."""
    written: dict[int, int] = {}
    errors: list[BaseException] = []
    started = threading.Event()
    with KVClient(machines.config(keys, timeout=10)) as c:
        base_in = in_edges(c, np.asarray([3, 500], np.int64))

        def ingest() -> None:
            try:
                for k in range(12):
                    written.update(write_batches(c, machines.parts, 1, first=k))
                    if k == 3:
                        started.set()
            except BaseException as exc:
                errors.append(exc)
                started.set()

        writer = threading.Thread(target=ingest)
        writer.start()
        assert started.wait(120)
        machines.lose(lost)
        writer.join(180)
        assert not writer.is_alive()
        assert not errors, errors
        assert len(written) == 12
        assert c.session.failovers, "the writer never used a replica"
    with KVClient(machines.config(keys, timeout=10)) as r:
        check_all_visible(r, written, base_in)
    for sp in machines.serving(lost):
        s = stats(sp, machines.key_file)
        assert s["live_pending"] == 0, s
        assert s.get("live_undecided", 0) == 0, s


class DiesAfterDeciding(GraphWriter):
    """A writer that dies between its decision and telling the partitions."""

    def _decided(self, f) -> None:  # the sequencer's answer, and no live_commit sent
        self._sequencer_decided(f)
        f.stage = "done"


def test_a_partition_asks_the_fate_of_a_piece_of_the_sequencer_s_replica(machines, keys):
    """Partition 1 holds a piece whose ``live_commit`` never came, and the sequencer's
    machine is gone: the read at the head settles it by asking partition 0's replica."""
    with KVClient(machines.config(keys, timeout=10)) as c:
        w = DiesAfterDeciding(c)
        w.add_nodes("_N", [BASE_ORIG], node_rows(c, 1, 7.0))
        to_500 = load_id_mapping(machines.parts).orig_nids[[500]]  # the node goes to part 1
        w.add_edges("_E", to_500, [BASE_ORIG], orig=True)
        v = w.commit()
    assert stats(machines.primaries[1], machines.key_file)["live_pending"] == 1
    machines.lose(0)
    with KVClient(machines.config(keys, timeout=10)) as r:
        assert r.follow() == v
        new = GraphWriter(r).lookup([BASE_ORIG])
        assert (r.pull(FEAT, new) == 7.0).all()
    deadline = time.monotonic() + 5
    while stats(machines.primaries[1], machines.key_file)["live_pending"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)


class StopsTheReplicaThenDies(DiesAfterDeciding):
    """Stops (SIGSTOP) partition 0's replica once every prepare is sent, before its
    decision: the sequencer drops the replica when the ``live_decide`` it forwards times
    out, and acknowledges the commit; then the writer dies before telling the partitions."""

    stop_pid = 0

    def _decide(self, f, commit: bool) -> None:
        os.kill(self.stop_pid, signal.SIGSTOP)
        super()._decide(f, commit)


def test_a_partition_never_asks_a_dropped_replica_a_fate(machines, keys):
    """Partition 1 holds a piece whose prepare named partition 0's replica, dropped since
    (it missed the commit's decision). The sequencer lost, partition 1 asks that replica
    the piece's fate: it refuses (told it was dropped), and is not promoted; the piece
    stays pending. Before, the dropped replica promoted itself and answered (here
    "committed": the forwarded decision was still in its socket when it resumed; one cut
    off instead misses it, answers "pending" and, serving, aborts the version in time),
    and from then on served as the sequencer without the writes made after the drop."""
    replica = machines.replicas[0]
    with KVClient(machines.config(keys, timeout=30)) as c:
        w = StopsTheReplicaThenDies(c)
        w.stop_pid = replica.pid
        w.add_nodes("_N", [BASE_ORIG], node_rows(c, 1, 7.0))
        to_500 = load_id_mapping(machines.parts).orig_nids[[500]]  # the node goes to part 1
        w.add_edges("_E", to_500, [BASE_ORIG], orig=True)
        try:
            v = w.commit()  # acknowledged after the replica's forward timed out
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        assert stats(machines.primaries[0], machines.key_file)["dropped_replicas"] == [
            replica.address
        ]
        deadline = time.monotonic() + 10  # the primary tells the replica it was dropped
        while not stats(replica, machines.key_file).get("dropped"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        machines.primaries[0].kill()
        with pytest.raises(StoreError, match="dropped replica"):
            c.session.call(1, "live_nodes", {"v": v})  # settles: partition 1 asks the fate
    assert not stats(replica, machines.key_file)["promoted"]
    assert stats(machines.primaries[1], machines.key_file)["live_pending"] == 1


def test_a_job_key_asking_a_fate_does_not_promote_the_sequencer_s_replica(machines, keys):
    """``live_fate`` is open to every admitted key; only the store's own key (a
    partition that lost the primary) promotes partition 0's replica by asking it."""
    replica = machines.replicas[0].address
    with RpcClient(replica, keys=machines.job_key("job-a"), timeout=10) as c:
        assert c.call("live_fate", {"version": 1}).body["fate"] == "aborted"
    with KVClient(machines.config(keys, timeout=10)) as c:
        write_batches(c, machines.parts, 1)
        assert c.session.failovers == []  # the primary was not fenced by its replica
    assert stats(machines.primaries[0], machines.key_file)["replicas"] == [replica]


def test_a_pipelined_writers_carried_decisions_reach_the_replica(machines, keys):
    """A pipelined writer's decisions ride in its next pieces (no live_commit a batch)
    and in its next live_begin (no live_decide a batch): forwarded with them, partition
    1's replica commits every piece as its primary does, and partition 0's replica (the
    sequencer's copy) decides every version as its primary does."""
    servers = [p.address for p in machines.primaries]
    with KVClient(ClientConfig(servers, keys=keys, timeout=10)) as c:
        w = GraphWriter(c, window=4)
        for _ in range(12):
            w.add_edges("_E", [3], [500])  # 500 is partition 1's
            w.submit()
        assert len(w.flush()) == 12
        w.close()
    primary = stats(machines.primaries[1], machines.key_file)
    assert primary["served"].get("live_commit", 0) <= 4, primary
    for s in (primary, stats(machines.replicas[1], machines.key_file)):
        assert (s["live_pending"], s["live_committed"]) == (0, 12), s
    seq = stats(machines.primaries[0], machines.key_file)
    assert seq["served"].get("live_decide", 0) <= 4, seq
    for s in (seq, stats(machines.replicas[0], machines.key_file)):
        assert (s["live_head"], s["live_undecided"]) == (12, 0), s


def compacted_replica(sp: StoreProcess, key_file: Path) -> dict:
    """Ask a replica to compact (the store's key) and wait for it to finish."""
    with RpcClient(sp.address, keys=load_keys(key_file), timeout=10) as c:
        s = c.call("live_compact", {"start": True}).body
        deadline = time.monotonic() + 30
        while s["running"]:
            assert time.monotonic() < deadline, s
            time.sleep(0.05)
            s = c.call("live_compact", {}).body
    return s


@pytest.mark.parametrize("part", [0, 1], ids=["sequencer-replica", "partition-replica"])
def test_a_replica_compacts_beside_its_log_and_restarts_from_there(machines, keys, tmp_path, part):
    """A replica with a log compacts as its primary does: its compacted directory beside
    its log (the partition directory is its primary's), its log truncated below it (it
    was never truncated: it grew to its bound). Killed and started again, it loads that
    directory and replays the rest of its log (partition 0's, its copy of the sequencer
    from the snapshot it logged): every acknowledged batch is visible through it once
    the primary is gone."""
    with KVClient(machines.config(keys, timeout=10)) as c:
        base_in = in_edges(c, np.asarray([3, 500], np.int64))
        written = write_batches(c, machines.parts, 6)
        head = c.follow()
    live = machines.live[1 - part]  # partition P's replica is on the other machine
    log = live / log_name(part, 1)
    before = records(log, tmp_path)
    s = compacted_replica(machines.replicas[part], machines.key_file)
    assert s["version"] == head and s["truncated"] > 0 and not s["error"], s
    own = live / base_name(part, 1)
    assert compacted.read_pointer(own, part).live_version == head
    assert compacted.read_pointer(machines.parts, part) is None  # not the primary's
    assert records(log, tmp_path) < before
    with KVClient(machines.config(keys, timeout=10)) as c:
        written |= write_batches(c, machines.parts, 2, first=6)  # in the log only
    machines.replicas[part].kill()
    primary = machines.primaries[part].address
    machines.replicas[part] = machines._serve(part, 1 - part, "--replica-of", primary)
    machines.primaries[part].kill()
    with KVClient(machines.config(keys, timeout=5)) as r:
        assert r.follow() == head + 2
        check_all_visible(r, written, base_in)


def test_losing_the_sequencer_mid_group_loses_no_acknowledged_write(machines, keys):
    """A pipelined writer (``window=8``: several ``live_begin`` at the sequencer at once,
    forwarded, applied and synced as one turn's group, store/writes.py) loses the
    sequencer's machine (SIGKILL, its disk deleted) with begins in flight: it goes on
    through the replicas, and every batch it acknowledged is wholly visible once, on
    both partitions."""
    batches, lose_at = 48, 24
    with KVClient(machines.config(keys, timeout=10)) as c:
        base_in = in_edges(c, np.asarray([3, 500], np.int64))
        w = GraphWriter(c, window=8)
        for k in range(batches):
            w.add_edges("_E", [7 + k, 7 + k], [3, 500])  # 3: partition 0's, 500: 1's
            w.submit()
            if k == lose_at:
                seq = stats(machines.primaries[0], machines.key_file)
                machines.lose(0)
        acknowledged = w.flush()
        w.close()
        assert c.session.failovers, "the writer never used a replica"
    assert len(set(acknowledged)) == batches
    # the turns grouped begins: fewer syncs than begins before the loss
    assert seq["live"]["log_syncs"] < seq["served"]["live_begin"], seq
    with KVClient(machines.config(keys, timeout=10)) as r:
        r.follow()
        seen = in_edges(r, np.asarray([3, 500], np.int64))
    assert [len(s - b) for s, b in zip(seen, base_in, strict=True)] == [batches, batches]
    for sp in machines.serving(0):
        s = stats(sp, machines.key_file)
        assert (s["live_pending"], s.get("live_undecided", 0)) == (0, 0), s


def test_a_primary_answers_reads_while_a_write_waits_for_its_replica(machines, keys):
    """Partition 1's replica is stopped (SIGSTOP) while a write to partition 1 waits for
    it: the primary's loop goes on answering (before, its turn's end blocked the loop
    until the replica answered or left the write set, 5 s: every read waited). The write
    is acknowledged once the replica, resumed, answers, and the replica stays."""
    servers = [p.address for p in machines.primaries]
    replica = machines.replicas[1]
    done, errors = threading.Event(), []
    with KVClient(ClientConfig(servers, keys=keys, timeout=30)) as c:
        w = GraphWriter(c)
        to_500 = load_id_mapping(machines.parts).orig_nids[[500]]  # partition 1's node
        w.add_nodes("_N", [10**9], node_rows(c, 1, 3.0))
        w.add_edges("_E", to_500, [10**9], orig=True)
        before = stats(machines.primaries[1], machines.key_file)["served"]
        os.kill(replica.pid, signal.SIGSTOP)
        try:

            def commit() -> None:
                try:
                    w.commit()
                except BaseException as exc:
                    errors.append(exc)
                finally:
                    done.set()

            writer = threading.Thread(target=commit)
            writer.start()
            with RpcClient(machines.primaries[1].address, keys=load_keys(machines.key_file),
                           timeout=10) as admin:  # fmt: skip
                deadline, prepared = time.monotonic() + 30, before.get("live_prepare", 0)
                while True:  # the loop answers while the write waits for its replica
                    body = admin.call("stats", timeout=2).body
                    if body["served"].get("live_prepare", 0) > prepared:  # the piece came
                        break
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                for _ in range(5):  # (before: no answer until the replica left, 5 s)
                    assert admin.call("stats", timeout=2).body["replicas"] == [replica.address]
                assert not done.is_set()  # not acknowledged without its replica
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        writer.join(30)
        assert done.is_set() and not errors, errors
    assert stats(machines.primaries[1], machines.key_file)["dropped_replicas"] == []


def test_a_partition_answers_reads_while_a_commit_waits_for_its_replica(machines, keys):
    """A partition's ``live_commit`` is answered once its replica answered, as before,
    but without holding the loop meanwhile (``replicas.ANSWERED_LATER``): partition 1's
    replica stopped as the commit goes, its primary still answers; resumed, the replica
    commits the piece and stays in the write set."""
    replica = machines.replicas[1]

    class StopsTheReplica(GraphWriter):
        def _tell(self, p: int) -> None:
            if p == 1:
                os.kill(replica.pid, signal.SIGSTOP)
            super()._tell(p)

    servers = [p.address for p in machines.primaries]
    try:
        with KVClient(ClientConfig(servers, keys=keys, timeout=30)) as c:
            w = StopsTheReplica(c)
            w.add_edges("_E", [3], [500])  # 500 is partition 1's
            w.commit()  # its live_commit to partition 1 is sent, not waited for
            with RpcClient(machines.primaries[1].address, keys=load_keys(machines.key_file),
                           timeout=2) as admin:  # fmt: skip
                deadline = time.monotonic() + 20
                while not admin.call("stats").body["served"].get("live_commit"):
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                for _ in range(5):  # (before: no answer until the replica left, 5 s)
                    assert admin.call("stats").body["replicas"] == [replica.address]
            os.kill(replica.pid, signal.SIGCONT)
            w.close()
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    assert stats(machines.primaries[1], machines.key_file)["dropped_replicas"] == []
    s = stats(replica, machines.key_file)
    assert (s["live_pending"], s["live_committed"]) == (0, 1), s
