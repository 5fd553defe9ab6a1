"""Compaction of the live graph (issue 42, item 5): the delta folded into the base without
stopping reads, pinned versions respected, backpressure instead of refusal."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from graphrun.distributed.writer import GraphWriter
from graphrun.errors import ArgumentError, StoreError
from graphrun.partition import load_id_mapping
from graphrun.store import live
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.live_client import route
from graphrun.store.server import ServerConfig
from graphrun.testing.store import make_partition_dir, store_threads
from tests.store.test_live_store import FEAT, SAMPLING, hetero_store, node_rows


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    return make_partition_dir(tmp_path_factory.mktemp("compact") / "parts", 2)[1]


@contextlib.contextmanager
def served(parts: Path, *jobs: str) -> Iterator[tuple[list[str], list[KVClient]]]:
    """Both partitions' servers (sampling on) and a client of each of ``jobs``: their
    addresses and the clients, closed before the servers."""
    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads, contextlib.ExitStack() as stack:
        addresses = [t.address for t in threads]
        config = [ClientConfig(addresses, job=job, timeout=20) for job in jobs]
        yield addresses, [stack.enter_context(KVClient(c)) for c in config]


def write_batches(c: KVClient, parts: Path, first: int, count: int) -> list[int]:
    """``count`` batches: a new node with edges from it into both partitions and from a
    base node into it, a deleted base edge, an updated base row. Returns the new ids."""
    orig = load_id_mapping(parts).orig_nids
    w = GraphWriter(c)
    new = []
    for i in range(first, first + count):
        o = 10**9 + i
        w.add_nodes("_N", [o], node_rows(c, 1, float(i + 1)))
        w.add_edges("_E", [o, o, orig[7 + i]], [orig[3], orig[500], o], orig=True)
        eid = int(c.session.call(0, "sample_neighbors", {"fanout": [1], "seed": i},
                                 tensors=(np.asarray([20 + i]),)).tensors[2][0])  # fmt: skip
        w.delete_edges("_E", [eid])
        w.update_features("_N", "feat", [40 + i], np.full((1, 8), -float(i), np.float32))
        w.commit()
        new.append(int(w.lookup([o])[0]))
    return new


def compact(c: KVClient, part: int, start: bool = True) -> dict[str, Any]:
    """Ask partition ``part`` to compact and wait for it to finish."""
    stats = c.session.call(part, "live_compact", {"start": start}, main_only=True).body
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = c.session.call(part, "live_compact", {}, main_only=True).body
        if not stats["running"]:
            return stats
        time.sleep(0.05)
    raise AssertionError(f"partition {part} still compacting: {stats}")


def snapshot(c: KVClient, seeds: np.ndarray) -> list[np.ndarray]:
    """What reads at the client's version give: sampled in-edges of ``seeds`` on both
    partitions (a fixed draw), in-degrees, out-degrees, and their feature rows."""
    out = []
    view = c.live
    assert view is not None
    _, part, _ = route(view, c.book.node_offsets, view.num_nodes, view.node_owner, seeds, "s")
    for p in (0, 1):
        s = seeds[part == p]
        for fanout in ([3], [10_000]):
            m = c.session.call(p, "sample_neighbors", {"fanout": fanout, "seed": 5}, tensors=(s,))
            out += [np.asarray(t) for t in m.tensors]
        m = c.session.call(p, "graph_in_degrees", {}, tensors=(s,))
        out.append(np.asarray(m.tensors[0]))
        m = c.session.call(p, "graph_out_degrees", {}, tensors=(seeds,))
        out.append(np.asarray(m.tensors[0]))
    out.append(c.pull(FEAT, seeds).copy())
    return out


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_reads_at_a_version_are_identical_across_compaction_under_concurrent_sampling(parts):
    with served(parts, "w", "r") as (addresses, (wc, rc)):
        new = write_batches(wc, parts, 0, 6)
        v = rc.follow()
        seeds = np.asarray([*range(60), *range(500, 520), *new], np.int64)
        before = snapshot(rc, seeds)
        stop, errors, reads = threading.Event(), [], [0]

        def sample() -> None:  # reads at v all along the compaction
            with KVClient(ClientConfig(addresses, job="s", timeout=20)) as sc:
                sc.follow(v)
                while not stop.is_set():
                    if not same(snapshot(sc, seeds), before):
                        errors.append(f"a read at {v} changed during compaction")
                        return
                    reads[0] += 1

        def read_more(than: int) -> None:  # not a fixed time: a busy box starts late
            deadline = time.monotonic() + 60
            while reads[0] <= than and not errors and time.monotonic() < deadline:
                time.sleep(0.01)

        t = threading.Thread(target=sample)
        t.start()
        try:
            read_more(0)  # it reads already, then once more after the compactions
            stats = [compact(wc, p) for p in (0, 1)]
            read_more(reads[0])
        finally:
            stop.set()
            t.join()
        assert not errors, errors
        assert reads[0] > 1
        assert [s["version"] for s in stats] == [v, v]
        assert all(s["compactions"] == 1 for s in stats)
        assert all(s["error"] == "" and s["pause_s"] >= 0 for s in stats)
        assert same(snapshot(rc, seeds), before)
        assert [s["delta_bytes"] for s in stats] == [0, 0]  # all in the base now
        with pytest.raises(StoreError, match=f"since 1 is below partition 0's compacted "
                                             f"version {v}; refresh every node"):  # fmt: skip
            rc.session.call(0, "graph_changes", {"since": 1})
        assert rc.session.call(0, "graph_changes", {"since": v}).tensors[0].size == 0
        # writes go on above it, and are seen at their version only
        more = write_batches(wc, parts, 6, 2)
        assert same(snapshot(rc, seeds), before)
        rc.follow()
        assert (rc.pull(FEAT, np.asarray(more)) == [[7.0], [8.0]]).all()


def test_compaction_never_folds_above_a_pinned_version_and_refuses_reads_below_it(parts):
    with served(parts, "w", "pin") as (_, (wc, pc)):
        write_batches(wc, parts, 0, 3)
        pinned = pc.follow()
        seeds = np.asarray([3, 500], np.int64)
        before = snapshot(pc, seeds)  # its reads tell the servers its version
        write_batches(wc, parts, 3, 3)
        assert [compact(wc, p)["version"] for p in (0, 1)] == [pinned, pinned]
        assert same(snapshot(pc, seeds), before)
        pc.follow()  # the pinned session moves on: the rest can be folded
        snapshot(pc, seeds)
        assert [compact(wc, p)["version"] for p in (0, 1)] == [pinned + 3] * 2
        pc.follow(pinned)
        with pytest.raises(StoreError, match="was compacted"):
            pc.pull(FEAT, seeds)


def test_a_first_follow_that_a_compaction_overtakes_follows_the_newer_head(parts, monkeypatch):
    # a compaction begun between the head's answer and the session's pin folds past the
    # head: follow() asks again instead of leaving the session to read a folded version
    from graphrun.store import live_client

    with served(parts, "w", "f") as (addresses, (wc, fc)):
        write_batches(wc, parts, 0, 2)
        real, overtaken = live_client.fetch_head, []

        def late(session: Any) -> Any:
            view = real(session)
            if not overtaken:  # the first head only: more writes, folded at once
                write_batches(wc, parts, 2, 2)
                overtaken.extend(compact(wc, p)["version"] for p in (0, 1))
            return view

        monkeypatch.setattr(live_client, "fetch_head", late)
        v = fc.follow()
        assert overtaken and v >= max(overtaken) > 0
        snapshot(fc, np.asarray([3, 500], np.int64))  # reads at it: not refused
        with KVClient(ClientConfig(addresses, job="g", timeout=20)) as gc, \
                pytest.raises(StoreError, match="was compacted into the base"):  # fmt: skip
            gc.follow(1)  # a version asked for that is folded: one line, not a read


def test_past_the_delta_bound_writes_are_slowed_until_compaction_makes_room(parts, monkeypatch):
    """A session pinned at the base holds compaction back: a writer filling the delta is
    told to retry, and once the pin moves on the servers compact and every batch lands
    (slowed, never refused)."""
    from graphrun.store import compact as compaction

    monkeypatch.setattr(live, "LIVE_DELTA_MAX_BYTES", 64 << 10)
    # a compaction the pin held back is tried again 0.2 s later, not 2 s: the test waits
    # on that retry each time the writer fills the delta
    monkeypatch.setattr(compaction, "COMPACT_RETRY_S", 0.2)
    with served(parts, "w", "pin") as (_, (c, pc)):
        assert pc.follow() == 0
        w = GraphWriter(c, retry_timeout=10)
        errors: list[BaseException] = []

        def write() -> None:
            try:
                for i in range(60):
                    w.add_nodes("_N", np.arange(10) + 10**9 + 10 * i, node_rows(c, 10, 1.0))
                    w.commit()
            except BaseException as exc:
                errors.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        deadline = time.monotonic() + 10
        while w.waited_s == 0 and writer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert w.waited_s > 0, "the writer was never slowed"
        pc.follow()
        pc.pull(FEAT, np.asarray([3, 500]))  # the pin moves on with its reads (both parts)
        writer.join()
        assert not errors, errors
        assert c.follow() == 60
        assert (w.lookup(np.arange(600) + 10**9) >= 0).all()
        stats = [c.session.call(p, "live_compact", {}, main_only=True).body for p in (0, 1)]
        assert sum(s["compactions"] for s in stats) >= 2


def test_an_old_delta_is_compacted_without_being_asked(parts, monkeypatch):
    from graphrun.store import compact as compaction

    monkeypatch.setattr(compaction, "COMPACT_AGE_S", 0.3)
    monkeypatch.setattr(compaction, "COMPACT_MIN_BYTES", 0)
    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        c = KVClient(ClientConfig([t.address for t in threads], job="w", timeout=20))
        with c:
            write_batches(c, parts, 0, 2)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                stats = [compact(c, p, start=False) for p in (0, 1)]
                if all(s["version"] == 2 for s in stats):
                    break
                time.sleep(0.1)
            assert [s["version"] for s in stats] == [2, 2]
            assert [s["delta_bytes"] for s in stats] == [0, 0]


def test_a_heterograph_reads_the_same_typed_edges_and_edge_rows_after_compaction(tmp_path):
    with hetero_store(tmp_path) as (c, hparts):
        book = c.book
        w = GraphWriter(c)
        paper = book.to_homo("paper", np.asarray([0, 1, 2]))
        w.add_nodes("author", [10**9], {"feat": np.ones((1, 4), np.float32)})
        orig_p0 = load_id_mapping(hparts).orig_nids[paper[0]]
        w.add_edges("writes", [10**9], [orig_p0], orig=True)
        w.add_edges("cites", paper[1:2], paper[2:3], {"weight": np.asarray([0.5], np.float32)})
        w.commit()
        c.follow()
        fan = [5] * len(book.edge_types)

        def reads() -> list[np.ndarray]:
            view = c.live
            assert view is not None
            _, part, _ = route(view, book.node_offsets, view.num_nodes, view.node_owner,
                               paper, "s")  # fmt: skip
            out = []
            for p in np.unique(part).tolist():
                m = c.session.call(p, "sample_neighbors", {"fanout": fan, "seed": 1},
                                   tensors=(paper[part == p],))  # fmt: skip
                out += [np.asarray(t) for t in m.tensors]
            new_e = out[2][out[2] >= book.num_edges]
            out.append(c.pull("edge/paper:cites:paper/weight", new_e[-1:]).copy())
            out.append(c.pull("node/author/feat", w.lookup([10**9])).copy())
            return out

        before = reads()
        stats = [compact(c, p) for p in (0, 1)]  # a partition without pieces: none
        assert sum(s["compactions"] for s in stats) >= 1 and not any(s["error"] for s in stats)
        assert same(reads(), before)


def test_the_sequencer_replays_from_a_snapshot_taken_before_records_it_follows(tmp_path):
    """The snapshot is taken at the swap and logged later by the compaction's thread: a
    version begun and one decided in between are in the log before it, not in it."""
    from graphrun.store.live_check import Schema
    from graphrun.store.live_log import BegunRecord, decide, frozen, open_log, replay, snapshot
    from graphrun.store.live_seq import Blocks, Sequencer

    def fresh() -> Sequencer:
        return Sequencer(Blocks(100, 2), Blocks(1000, 2))

    def begin(seq: Sequencer, log, orig: int) -> None:
        o = np.asarray([orig], np.int64)
        log.write(BegunRecord(seq.next_version, [1, 0], [0, 1], o.tobytes()))
        seq.begin([1, 0], [0, 1], o, 0.0)

    log = open_log(tmp_path, 0, 0)
    seq = fresh()
    for v in (1, 2):
        begin(seq, log, 10 + v)
    decide(log, seq, 1, True)
    taken = frozen(seq)  # the swap: 2 still undecided
    begin(seq, log, 13)
    decide(log, seq, 2, True)
    snapshot(log, taken)
    assert log.wal.truncate_before(2) == 2  # version 1's records
    log.close()
    log = open_log(tmp_path, 0, 0)
    schema = Schema(0, 100, 1000, ("_N",), (("_N", "_E", "_N"),), (0, 50), (0, 500), {},
                    lambda ids: np.zeros(len(ids), np.int32))  # fmt: skip
    again = fresh()
    replay(log, live.LiveDelta(), schema, again)
    log.close()
    assert (again.next_version, again.head, set(again.begun)) == (4, 2, {3})
    assert again.orig == {11: 100, 12: 101} and again.orig_pending[3] == {13: 102}
    assert again.nodes.owners == seq.nodes.owners and again.nodes.open == seq.nodes.open


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")
def test_the_merging_thread_and_a_compaction_run_as_background_work(parts, monkeypatch):
    """Both only have to keep up: on a machine a trainer shares, their bursts must not
    preempt its threads (benchmarks/README.md, "the epoch while ingesting")."""
    from graphrun.rpc.tuning import BACKGROUND_NICE
    from graphrun.store import compact as compaction

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    want = (os.SCHED_BATCH, min(19, base + BACKGROUND_NICE))
    delta = live.LiveDelta(background=True)
    try:
        assert delta._merger is not None
        tid, deadline = delta._merger.native_id, time.monotonic() + 10
        assert tid is not None
        while os.sched_getscheduler(tid) != os.SCHED_BATCH and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)) == want
    finally:
        delta.close()
    seen: list[tuple[int, int]] = []
    real = compaction.background

    def recorded() -> bool:
        ok = real()
        tid = threading.get_native_id()
        seen.append((os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)))
        return ok

    monkeypatch.setattr(compaction, "background", recorded)
    with store_threads(ServerConfig(parts, 0, extensions=SAMPLING), 2) as threads:
        c = KVClient(ClientConfig([t.address for t in threads], job="w", timeout=20))
        with c:
            write_batches(c, parts, 0, 1)
            assert [compact(c, p)["compactions"] for p in (0, 1)] == [1, 1]
    assert seen == [want, want]


def test_live_nodes_since_a_version_a_compaction_folded_are_all_of_them(parts):
    """``live_nodes`` since a version: the nodes added after it, or every one once a
    compaction folded a later version (folded nodes are at version 0 in the base)."""
    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        c = KVClient(ClientConfig([t.address for t in threads], job="w", timeout=20))
        with c:
            new = write_batches(c, parts, 0, 3)
            assert c.follow() == 3
            assert c.live_nodes(since=1)[0].tolist() == sorted(new[1:])
            for p in (0, 1):
                compact(c, p)
            assert c.live_nodes(since=1)[0].tolist() == sorted(new)
            assert c.live_nodes(since=3)[0].tolist() == []
            assert c.live_nodes()[0].tolist() == sorted(new)
            with pytest.raises(ArgumentError, match="field 'since' must be a version"):
                c.live_nodes(since=-2)
