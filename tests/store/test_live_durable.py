"""An acknowledged live write survives ``kill -9`` of its servers (issue 42, item 5): the
write-ahead log of ``--live-dir`` is replayed at start."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from graphrun.distributed.writer import GraphWriter
from graphrun.errors import StoreError
from graphrun.local.stores import StoreProcess, start_store
from graphrun.partition import load_id_mapping
from graphrun.rpc.auth import generate_keys
from graphrun.rpc.transport import RpcClient
from graphrun.store import live_log
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.live import Piece, Rows
from graphrun.store.live_log import log_name
from graphrun.store.live_wire import piece_to_wire
from graphrun.store.server import ServerConfig
from graphrun.store.shm import DEFAULT_SHM_DIR, clean_stale
from graphrun.store.wal import START, WriteAheadLog
from graphrun.testing.procs import fresh_python
from graphrun.testing.store import make_partition_dir, store_threads
from tests.store.test_live_store import FEAT, SAMPLING, in_edges, node_rows

pytestmark = pytest.mark.integration
BASE_ORIG = 10**9


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """Two partition servers on fixed addresses, logging to ``live``; restartable."""

    def __init__(self, tmp: Path, key_file: Path) -> None:
        self.tmp, self.key_file = tmp, key_file
        self.parts = make_partition_dir(tmp / "parts", 2)[1]
        self.live = tmp / "live"
        self.live.mkdir()
        self.addresses = [f"tcp://127.0.0.1:{_port()}" for _ in range(2)]
        self.procs: list[StoreProcess | None] = [None, None]

    def start(self, p: int) -> None:
        self.procs[p] = start_store(self.parts, p, key_file=self.key_file, log_dir=self.tmp,
                                    address=self.addresses[p],
                                    extra_args=["--live-dir", str(self.live)])  # fmt: skip

    def kill(self, p: int) -> None:
        proc = self.procs[p]
        assert proc is not None
        proc.kill()  # SIGKILL: no clean shutdown, no flush

    def client(self, keys) -> KVClient:
        return KVClient(ClientConfig(self.addresses, keys=keys, timeout=20))

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None:
                proc.stop()


@contextlib.contextmanager
def running(tmp: Path, key_file: Path | None = None) -> Iterator[Cluster]:
    """Both partitions started (with a key of their own in ``tmp`` unless given),
    stopped and their segments cleaned afterwards."""
    if key_file is None:
        key_file = tmp / "store.key"
        generate_keys(key_file)
    c = Cluster(tmp, key_file)
    try:
        c.start(0)
        c.start(1)
        yield c
    finally:
        c.stop()
        clean_stale(DEFAULT_SHM_DIR)


@pytest.fixture
def cluster(tmp_path, key_file):
    with running(tmp_path, key_file) as c:
        yield c


def write_batches(c: KVClient, parts: Path, n: int, first: int = 0) -> dict[int, int]:
    """``n`` acknowledged batches, each a new node (its rows all ``k``) with in-edges on
    both partitions; ``{orig id: k}``."""
    dst = load_id_mapping(parts).orig_nids[[3, 500]]  # one node of each partition
    w = GraphWriter(c)
    out = {}
    for k in range(first, first + n):
        w.add_nodes("_N", [BASE_ORIG + k], node_rows(c, 1, float(k)))
        w.add_edges("_E", [BASE_ORIG + k] * 2, dst, orig=True)
        w.add_edges("_E", dst[:1], [BASE_ORIG + k], orig=True)
        w.commit()
        out[BASE_ORIG + k] = k
    return out


def check_all_visible(c: KVClient, written: dict[int, int], base_in: list[set[int]]) -> None:
    """Every acknowledged batch wholly visible at the head: the node, its rows, its
    in-edge, and its two out-edges on both partitions."""
    c.follow()
    ids = GraphWriter(c).lookup(list(written))
    assert (ids >= c.book.num_nodes).all(), "an acknowledged node was lost"
    rows = c.pull(FEAT, ids)
    for (_, k), row in zip(written.items(), rows, strict=True):
        assert (row == k).all()
    assert all(len(e) == 1 for e in in_edges(c, ids))
    seen = in_edges(c, np.asarray([3, 500], np.int64))
    for s, base in zip(seen, base_in, strict=True):
        assert len(s - base) == len(written)


def test_acknowledged_writes_survive_kill_9_of_a_partition_then_the_sequencer(cluster, keys):
    with cluster.client(keys) as c:
        base_in = in_edges(c, np.asarray([3, 500], np.int64))
        written = write_batches(c, cluster.parts, 6)
        head = c.follow()
    for p in (1, 0):  # a partition, then the sequencer (partition 0)
        cluster.kill(p)
        cluster.start(p)
        with cluster.client(keys) as c:
            assert c.follow() == head
            check_all_visible(c, written, base_in)
    with cluster.client(keys) as c:  # the sequencer goes on where it was
        written |= write_batches(c, cluster.parts, 2, first=6)
        assert c.follow() == head + 2
        check_all_visible(c, written, base_in)


def logged(path: Path) -> int:
    """Where the records of a server's log end (read from a copy: an open takes a
    generation)."""
    copy = path.with_name("copy.wal")
    shutil.copy(path, copy)
    try:
        with WriteAheadLog(copy) as wal:
            return wal.size
    finally:
        copy.unlink()


def test_a_torn_tail_is_cut_and_an_undecided_batch_stays_invisible(cluster, keys):
    with cluster.client(keys) as c:
        base_in = in_edges(c, np.asarray([3, 500], np.int64))
        written = write_batches(c, cluster.parts, 2)
        head = c.follow()
        w = GraphWriter(c)

        def die(flight, commit):  # the writer dies after its prepares: nothing decided
            flight.stage = "done"

        w._decide = die
        w.add_nodes("_N", [BASE_ORIG + 99], node_rows(c, 1, 99.0))
        w.add_edges("_E", [BASE_ORIG + 99], load_id_mapping(cluster.parts).orig_nids[[500]],
                    orig=True)  # fmt: skip
        undecided = w.commit()
    ends = []
    for p in (0, 1):
        cluster.kill(p)
        path = cluster.live / log_name(p, 0)
        ends.append(logged(path))
        with open(path, "r+b") as f:  # a record cut by the crash, where the records end
            f.seek(ends[-1])
            f.write(b"\x40\x00\x00\x00\x01\x02\x03\x04torn")
    cluster.start(0)
    cluster.start(1)
    with cluster.client(keys) as c:
        assert c.follow() == head
        check_all_visible(c, written, base_in)
        assert GraphWriter(c).lookup([BASE_ORIG + 99])[0] == -1
        fate = c.session.call(0, "live_fate", {"version": undecided}).body["fate"]
        assert fate == "pending"  # survived the restart; aborted by the tick later
    assert [logged(cluster.live / log_name(p, 0)) for p in (0, 1)] == ends  # not the torn one


def test_a_log_is_one_servers_and_a_bad_live_dir_is_refused(cluster, tmp_path, key_file):
    cmd = [sys.executable, "-m", "graphrun", "serve", str(cluster.parts), "--part", "1",
           "--key-file", str(key_file), "--live-dir"]  # fmt: skip
    bad = subprocess.run([*cmd, str(tmp_path / "nope")], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert bad.returncode != 0
    assert "--live-dir:" in bad.stderr and "is not a directory" in bad.stderr
    assert "Traceback" not in bad.stderr
    taken = subprocess.run([*cmd, str(cluster.live)], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert taken.returncode != 0
    assert "another server is using this log" in taken.stderr
    assert "Traceback" not in taken.stderr


def test_a_restarted_replica_replays_its_own_log(cluster, keys, key_file):
    """The replica logs the pieces its primary forwards: killed and restarted, it still
    holds them, and serves them when the primary is lost."""

    def replica() -> StoreProcess:
        args = ["--replica-of", cluster.addresses[1], "--live-dir", str(cluster.live)]
        sp = start_store(cluster.parts, 1, key_file=key_file, log_dir=cluster.tmp,
                         extra_args=args)  # fmt: skip
        with RpcClient(cluster.addresses[1], keys=keys, timeout=10) as c:
            deadline = time.monotonic() + 30
            while sp.address not in c.call("stats").body["replicas"]:
                assert time.monotonic() < deadline, "the replica never registered"
                time.sleep(0.1)
        return sp

    rep = replica()
    try:
        with cluster.client(keys) as c:
            base_in = in_edges(c, np.asarray([3, 500], np.int64))
            written = write_batches(c, cluster.parts, 3)
            head = c.follow()
        assert (cluster.live / log_name(1, 1)).read_bytes()[START : START + 8].strip(b"\0")
        rep.kill()
        rep = replica()
        cluster.kill(1)
        cfg = ClientConfig(cluster.addresses, keys=keys, timeout=5, replicas=[[], [rep.address]])
        with KVClient(cfg) as r:
            assert r.follow() == head
            check_all_visible(r, written, base_in)
    finally:
        rep.stop()


def test_a_full_log_refuses_a_batch_whole_and_what_it_acknowledged_replays(tmp_path, monkeypatch):
    """Past the log's bound a batch is refused before anything of it is acknowledged or
    visible; the servers restarted on the logs hold exactly the acknowledged batches."""
    parts = make_partition_dir(tmp_path / "parts", 2)[1]
    live_dir = tmp_path / "live"
    live_dir.mkdir()
    monkeypatch.setattr(live_log, "WAL_MAX_BYTES", START + (8 << 10))
    cfg = ServerConfig(parts, 0, live_dir=live_dir, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        with KVClient(ClientConfig(addresses, job="w", timeout=20)) as c:
            written: dict[int, int] = {}
            with pytest.raises(StoreError, match=r"\.wal: the log is full"):
                for k in range(100):
                    written |= write_batches(c, parts, 1, first=k)
            head = c.follow()
            assert 0 < len(written) < 100
            assert head - len(written) in (0, 1)  # the refused version: aborted, if begun
            assert GraphWriter(c).lookup([BASE_ORIG + len(written)])[0] == -1
    monkeypatch.setattr(live_log, "WAL_MAX_BYTES", 1 << 20)
    with (
        store_threads(cfg, 2) as threads,
        KVClient(ClientConfig([t.address for t in threads], job="r", timeout=20)) as c,
    ):
        assert c.follow() >= head  # the refused version may be decided later (aborted)
        ids = GraphWriter(c).lookup([BASE_ORIG + k for k in range(len(written) + 1)])
        assert (ids[:-1] >= c.book.num_nodes).all() and ids[-1] == -1
        assert (c.pull(FEAT, ids[:-1])[:, 0] == np.arange(len(written))).all()


def test_prepares_of_one_turn_share_one_sync_and_survive_kill_9(cluster, keys):
    """Group commit: ``live_prepare``s that wait while the server is busy are synced
    together at the end of its loop's turn (fewer ``fdatasync``s than prepares), and
    each is answered only after its sync: every acknowledged one is in the log after a
    ``kill -9``."""
    rng = np.random.default_rng(0)
    with cluster.client(keys) as c:
        before = c.stats(1)["live"]["log_syncs"]
        n, eid = c.book.num_nodes, c.book.num_edges
        lo, hi = (int(x) for x in c.book.node_offsets[1:3])  # partition 1's base nodes
        seq = c.session.part(0).main.address
        sizes = [200_000] + [100] * 8  # the first keeps the server busy while the rest wait
        sent = []
        for k, m in enumerate(sizes):
            edges = np.vstack([rng.integers(0, n, m), rng.integers(lo, hi, m),
                               eid + np.arange(m)])  # fmt: skip
            eid += m
            piece = Piece(version=1000 + k, new_edges=Rows.of(edges),
                          edge_types=Rows.of(np.zeros(m, np.int32)))  # fmt: skip
            body, tensors = piece_to_wire(piece)
            sent.append(c.session.request(1, "live_prepare", {"piece": body, "seq": seq},
                                          tensors, main_only=True))  # fmt: skip
        assert all(c.session.wait(p).body["held"] for p in sent)
        assert c.stats(1)["live"]["log_syncs"] - before <= 3  # 9 before group commit
    cluster.kill(1)
    with WriteAheadLog(cluster.live / log_name(1, 0)) as wal:
        logged = {r.version for r in wal.records()}
    assert set(range(1000, 1000 + len(sizes))) <= logged


def test_a_failed_group_sync_answers_each_write_with_its_error_and_holds_nothing(tmp_path):
    """The sync at a turn's end fails (the log's file is gone from under it): each
    prepare parked in the turn is answered with the log's error and its piece dropped,
    and the log takes no more writes (fail-stop)."""
    from graphrun.rpc.codec import Message, MsgKind
    from graphrun.store import live_ops
    from graphrun.store.registry import Request
    from graphrun.store.server import load_main_state
    from graphrun.store.writes import Parked, Turn

    parts = make_partition_dir(tmp_path / "parts", 2)[1]
    (tmp_path / "live").mkdir()
    state = load_main_state(ServerConfig(parts, 1))
    try:
        live = live_ops.attach(state, lambda: np.empty(0, np.int64), None, 5.0,
                               tmp_path / "live")  # fmt: skip
        turn, answers = Turn(state), []
        lo, hi = (int(x) for x in state.book.node_offsets[1:3])
        for k in range(3):
            eid = state.book.num_edges + 10 * k + np.arange(2)
            piece = Piece(version=k + 1, new_edges=Rows.of(np.vstack([[0, 1], [lo, hi - 1], eid])),
                          edge_types=Rows.of(np.zeros(2, np.int32)))  # fmt: skip
            body, tensors = piece_to_wire(piece)
            req = Request("live_prepare", {"piece": body}, tuple(tensors))
            resp = live_ops.live_prepare(state, req)
            assert resp.after_sync is not None and len(live.delta.pending) == k + 1
            msg = Message(MsgKind.REQUEST, "live_prepare", k, body, tuple(tensors))
            turn.parked.append(Parked(b"peer", msg, resp.after_sync, {}))
        read_only = os.open(os.devnull, os.O_RDONLY)
        os.dup2(read_only, live.log.wal._fd)  # the disk fails under the log
        os.close(read_only)
        turn.end(lambda peer, m: answers.append(m))
        assert [m.kind for m in answers] == [MsgKind.ERROR] * 3
        assert all("could not be written" in str(m.body) for m in answers)
        assert not live.delta.pending and turn.syncs == 0
        with pytest.raises(StoreError, match="live writes stop"):
            live_ops.live_prepare(state, req)
    finally:
        live_ops.close(state)
        state.close()


def test_begins_in_flight_sent_again_get_their_first_answers(tmp_path):
    """A pipelined writer that fails over sends every ``live_begin`` still in flight
    again (same session, same write ids): each gets the version and ids it got first,
    not the last one's nor a new version; answered only after the turn's sync."""
    from graphrun.store import live_ops
    from graphrun.store.registry import Request
    from graphrun.store.server import load_main_state

    parts = make_partition_dir(tmp_path / "parts", 2)[1]
    (tmp_path / "live").mkdir()
    state = load_main_state(ServerConfig(parts, 0))
    try:
        n = state.book.num_nodes
        live = live_ops.attach(state, lambda: np.arange(n, dtype=np.int64), None, 5.0,
                               tmp_path / "live")  # fmt: skip

        def begin(w: int) -> dict:
            body = {"nodes": [1, 0], "edges": [0, 2], "w": w}
            orig = np.array([n + w], np.int64)  # a new original id
            resp = live_ops.live_begin(state, Request("live_begin", body, (orig,), session="s"))
            assert resp.after_sync is not None and not resp.body  # not before the sync
            live_ops.sync(state)
            return dict(resp.after_sync.done().body)

        first = [begin(w) for w in (1, 2, 3)]
        assert [a["version"] for a in first] == [1, 2, 3]
        again = [begin(w) for w in (1, 2, 3)]
        assert again == first and live.seq is not None and live.seq.next_version == 4
    finally:
        live_ops.close(state)
        state.close()


def test_decisions_a_begin_carries_are_synced_with_it_and_replayed(tmp_path):
    """The decisions a ``live_begin`` carries are written to the sequencer's log with
    its version, taken once synced (as ``live_decide``'s), and replayed at start; the
    begin sent again (a failover) gets the same answer."""
    from graphrun.store import live_ops
    from graphrun.store.registry import Request
    from graphrun.store.server import load_main_state

    parts = make_partition_dir(tmp_path / "parts", 2)[1]
    (tmp_path / "live").mkdir()

    def attached() -> tuple:
        state = load_main_state(ServerConfig(parts, 0))
        n = state.book.num_nodes
        live = live_ops.attach(state, lambda: np.arange(n, dtype=np.int64), None, 5.0,
                               tmp_path / "live")  # fmt: skip
        return state, live

    def begin(state, decided: list, w: int) -> dict:
        body = {"nodes": [0, 0], "edges": [0, 1], "decided": decided, "w": w}
        req = Request("live_begin", body, (np.empty(0, np.int64),), session="s")
        resp = live_ops.live_begin(state, req)
        assert resp.after_sync is not None and not resp.body  # not before the sync
        live_ops.sync(state)
        return dict(resp.after_sync.done().body)

    state, live = attached()
    try:
        assert [begin(state, [], w)["version"] for w in (1, 2, 3)] == [1, 2, 3]
        got = begin(state, [[1, True], [2, False]], 4)
        assert got["version"] == 4 and got["decided"] == [[1, True], [2, False]]
        assert live.seq is not None and live.seq.head == 2
        assert begin(state, [[1, True], [2, False]], 4) == got
    finally:
        live_ops.close(state)
        state.close()
    state, live = attached()  # a restart: the log replayed
    try:
        assert live.seq is not None and live.seq.head == 2
        assert [live.seq.fate(v) for v in (1, 2, 3, 4)] == [
            "committed", "aborted", "pending", "pending"
        ]  # fmt: skip
    finally:
        live_ops.close(state)
        state.close()


def test_a_server_with_a_log_has_its_compiled_merge_loaded_before_it_serves(tmp_path):
    """``attach`` with a log returns once the merging thread has loaded its merge
    (numba, about 0.5 CPU-s): it used to load it meanwhile, so a writer starting at once
    (``graphrun bench live``) paid for it in its first batches. In a fresh process (numba
    not imported yet); the thread is the one that loaded it, and it still merges."""
    code = (
        "import sys, numpy as np\n"
        "from graphrun.store import live_ops\n"
        "from graphrun.store.server import ServerConfig, load_main_state\n"
        "from graphrun.testing.store import make_partition_dir\n"
        f"root = __import__('pathlib').Path({str(tmp_path)!r})\n"
        "parts = make_partition_dir(root / 'parts', 2)[1]\n"
        "(root / 'live').mkdir()\n"
        "state = load_main_state(ServerConfig(parts, 1))\n"
        "live = live_ops.attach(state, lambda: np.empty(0, np.int64), None, 5.0, root / 'live')\n"
        "print(live.delta.warmed, 'graphrun.store.live_kernels' in sys.modules)\n"
        "live_ops.close(state)\nstate.close()\n"
        "print(live.delta._merger.is_alive())\n"
    )
    assert fresh_python(code, timeout=120).split() == ["True", "True", "False"]


def test_a_server_whose_compiled_merge_does_not_load_serves_after_a_bounded_wait(
    tmp_path, monkeypatch, caplog
):
    """A merging thread whose compiled merge does not load (numba stuck: here its load
    blocked) holds ``attach`` for ``WARM_TIMEOUT_S`` only: the server logs one warning
    naming what did not load, and serves; it waited for ever before (a server hung at
    start, and the launcher's wait for its stores failed the attempt)."""
    import logging
    import threading

    from graphrun.store import live, live_kernels, live_ops
    from graphrun.store.server import load_main_state

    release = threading.Event()
    monkeypatch.setattr(live_kernels, "warm_up", lambda: release.wait(60))
    monkeypatch.setattr(live, "WARM_TIMEOUT_S", 0.2, raising=False)
    parts = make_partition_dir(tmp_path / "parts", 2)[1]
    (tmp_path / "live").mkdir()
    state = load_main_state(ServerConfig(parts, 1))
    got: list[live_ops.LivePart] = []
    orig = lambda: np.empty(0, np.int64)  # noqa: E731
    attach = threading.Thread(
        target=lambda: got.append(live_ops.attach(state, orig, None, 5.0, tmp_path / "live"))
    )
    try:
        with caplog.at_level(logging.WARNING, "graphrun.store"):
            attach.start()
            attach.join(20)
        assert got, "attach waited for the compiled merge without a bound"
        assert not got[0].delta.warmed
        assert "graphrun.store.live_kernels" in caplog.text
    finally:
        release.set()
        attach.join(30)
        live_ops.close(state)
        state.close()
