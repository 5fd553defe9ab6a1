"""After a compaction a co-located client reads from shared memory every base row that
no folded write overwrote, and asks the server for the others (issue 42,
graphrun/store/live_stale.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from graphrun.distributed.writer import GraphWriter
from graphrun.store import live_stale
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.live_client import shm_rows
from graphrun.store.server import ServerConfig
from graphrun.store.shm import OwnerWatch, _start_ms
from graphrun.testing.store import store_threads
from tests.store.test_compact import compact, parts, served, write_batches  # noqa: F401
from tests.store.test_live_durable import cluster  # noqa: F401
from tests.store.test_live_store import FEAT, SAMPLING

UPDATED = [40, 41]  # write_batches(c, parts, 0, 2) updates these base rows to -0, -1
UNTOUCHED = np.asarray([30, 31, 35, 39, 42, 47], np.int64)


def pulls(c: KVClient, part: int) -> int:
    return int(c.stats(part)["served"].get("pull", 0))


def owner(c: KVClient, ids: np.ndarray) -> int:
    offsets = c.book.node_offsets
    parts_of = np.searchsorted(offsets, ids, side="right") - 1
    assert len(set(parts_of.tolist())) == 1
    return int(parts_of[0])


def updated_and_compacted(c: KVClient, parts) -> tuple[np.ndarray, int]:  # noqa: F811
    """The base rows before any write, after two updating batches folded everywhere."""
    assert c.session.local_ok(0) and c.session.local_ok(1)
    base = c.pull(FEAT, UNTOUCHED).copy()
    write_batches(c, parts, 0, 2)
    head = c.follow()
    assert [compact(c, p)["version"] for p in (0, 1)] == [head, head]
    return base, owner(c, np.r_[UNTOUCHED, UPDATED])


def test_untouched_base_rows_come_from_shared_memory_after_a_compaction(parts):  # noqa: F811
    with served(parts, "default") as (_, (c,)):
        base, p = updated_and_compacted(c, parts)
        c.pull(FEAT, UNTOUCHED)  # the first pull after the compaction asks for its rows
        before = pulls(c, p)
        for _ in range(3):
            assert np.array_equal(c.pull(FEAT, UNTOUCHED), base)
        assert pulls(c, p) == before  # no request: shared memory
        assert c.traffic[p, "pull:shm"] >= 3 * base.nbytes


def test_an_updated_base_row_reads_its_new_value_never_the_stale_shared_one(parts):  # noqa: F811
    with served(parts, "default") as (_, (c,)):
        base, p = updated_and_compacted(c, parts)
        ids = np.r_[UNTOUCHED[:2], UPDATED, UNTOUCHED[2:]]
        before = pulls(c, p)
        got = c.pull(FEAT, ids)
        assert pulls(c, p) == before + 1  # the overwritten rows only, in one request
        assert np.array_equal(got[[0, 1, 4, 5, 6, 7]], base)
        assert np.array_equal(got[2:4], np.asarray([[-0.0] * 8, [-1.0] * 8], np.float32))


def test_a_second_compaction_moves_the_stamp_and_its_rows_are_asked_again(parts):  # noqa: F811
    with served(parts, "default") as (_, (c,)):
        base, p = updated_and_compacted(c, parts)
        assert np.array_equal(c.pull(FEAT, UNTOUCHED), base)
        w = GraphWriter(c)
        w.update_features("_N", "feat", [UNTOUCHED[0]], np.full((1, 8), 7.0, np.float32))
        w.commit()
        c.follow()
        # the update held unfolded at the client's version: every row by request
        assert shm_rows(c.session, p, FEAT, c.version) is None
        assert c.pull(FEAT, UNTOUCHED[:1])[0, 0] == 7.0
        compact(c, p)
        stale = shm_rows(c.session, p, FEAT, c.version)
        assert stale is not None and stale[UNTOUCHED[0] - c.book.node_offsets[p]]
        got = c.pull(FEAT, UNTOUCHED)
        assert got[0, 0] == 7.0 and np.array_equal(got[1:], base[1:])


def test_an_older_server_that_cannot_say_which_rows_is_read_by_request(parts, monkeypatch):  # noqa: F811
    monkeypatch.setattr(live_stale, "register", lambda registry: None)  # no live_stale op
    with served(parts, "default") as (_, (c,)):
        base, p = updated_and_compacted(c, parts)
        assert shm_rows(c.session, p, FEAT, c.version) is None
        before = pulls(c, p)
        assert np.array_equal(c.pull(FEAT, UNTOUCHED), base)
        assert pulls(c, p) == before + 1


def test_a_colocated_server_that_stopped_or_whose_process_is_gone_is_read_by_request(parts):  # noqa: F811
    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        c = KVClient(ClientConfig([t.address for t in threads], timeout=5))
        _, p = updated_and_compacted(c, parts)
        assert shm_rows(c.session, p, FEAT, c.version) is not None
        e, kept = c.session.part(p), c.session.part(p).owner
        # the process that filled the mapped memory exits (a server started again)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            start = _start_ms(child.pid)
            e.owner = OwnerWatch(f"graphrun-{child.pid}-{start}-0.0")
            assert e.owner.watching() and shm_rows(c.session, p, FEAT, c.version) is not None
        finally:
            child.kill()
            child.wait()
        assert shm_rows(c.session, p, FEAT, c.version) is None
        e.owner = None
        assert shm_rows(c.session, p, FEAT, c.version) is None  # no watch: never trusted
        e.owner = kept
        assert shm_rows(c.session, p, FEAT, c.version) is not None
    # the servers stopped (in this process: its pidfd stays quiet): the counter says so
    assert shm_rows(c.session, p, FEAT, c.version) is None
    c.close()


@pytest.mark.integration
def test_a_server_started_from_its_compacted_directory_has_no_overwritten_rows(
    cluster,  # noqa: F811
    keys,
):
    """Its files hold the updates: a co-located client reads every base row, updated or
    not, from the new server's shared memory, and sees the updated value there."""
    ids = np.asarray([40, 41, 42], np.int64)
    with cluster.client(keys) as c:
        base = c.pull(FEAT, ids).copy()
        w = GraphWriter(c)
        w.update_features("_N", "feat", ids[:1], np.full((1, 8), 5.0, np.float32))
        w.commit()
        head = c.follow()
        p = owner(c, ids)
        assert compact(c, p)["version"] == head
    cluster.kill(p)
    cluster.start(p)
    with cluster.client(keys) as c:
        assert c.session.local_ok(p)
        c.follow()
        stale = shm_rows(c.session, p, FEAT, c.version)
        assert stale is not None and not stale.any()
        before = pulls(c, p)
        got = c.pull(FEAT, ids)
        assert pulls(c, p) == before  # all from shared memory
        assert (got[0] == 5.0).all() and np.array_equal(got[1:], base[1:])
