"""Weighted sampling of a live graph (issue 42): each in-edge of a seed at the read's
version drawn with its weight at that version — a new edge's from its edge-feature row,
a base edge's from the base tensor — while a writer commits, after a compaction folded
the new edges into the base, and after ``kill -9`` and the log's replay."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from graphrun.distributed.writer import GraphWriter
from graphrun.errors import ArgumentError
from graphrun.partition import partition_graph
from graphrun.sampling.distributed import DistOneHopSampler
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.server import ServerConfig
from graphrun.store.shm import DEFAULT_SHM_DIR, clean_stale
from graphrun.testing.graphs import random_graph
from graphrun.testing.store import store_threads
from tests.store.test_compact import compact
from tests.store.test_live_durable import Cluster
from tests.store.test_live_store import SAMPLING, in_edges

W = "edge/_N:_E:_N/w"
BATCHES = 8


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    """A 200-node graph with edge feature ``w`` (a quarter of the edges 0), 2 partitions."""
    g = random_graph()
    g.edata["_N:_E:_N"]["w"][::4] = 0.0
    out = tmp_path_factory.mktemp("weighted") / "parts"
    partition_graph(g, out, 2, method="random", seed=0)
    return out


def seeds_of(c: KVClient) -> np.ndarray:
    """Two base nodes of each partition."""
    lo = [c.book.owned_nodes(p)[0] for p in (0, 1)]
    return np.asarray([lo[0], lo[0] + 1, lo[1], lo[1] + 1], np.int64)


def write(c: KVClient, k: int, seeds: np.ndarray, gone: int | None) -> int:
    """Batch ``k``: an edge into each seed from node ``4k + j`` with weight ``k + j/4``
    (every third 0), and the base edge ``gone`` deleted; its version."""
    w = GraphWriter(c)
    src = 4 * k + np.arange(len(seeds))
    weight = (k + np.arange(len(seeds)) / 4).astype(np.float32)
    weight[src % 3 == 0] = 0.0
    w.add_edges("_E", src, seeds, {"w": weight})
    if gone is not None:
        w.delete_edges("_E", [gone])
    return w.commit()


def weighted(c: KVClient, seeds: np.ndarray, fanout: int, replace: bool, seed: int):
    return DistOneHopSampler(c, c.book, weight="w").sample_one_hop(
        seeds, [fanout], replace=replace, weighted=True, seed=seed
    )


def check_version(c: KVClient, seeds: np.ndarray, seed: int) -> tuple[int, list[int]]:
    """At the client's version: the weighted draws of every edge take exactly the edges
    of weight > 0 (a new edge's weight the one its batch wrote: ``k + j/4`` from node
    ``4k + j``), with replacement only those; every batch whole. Returns the batches
    visible and the draws."""
    every = in_edges(c, seeds)  # the new edges' sources: from a full unweighted draw
    eids = np.asarray(sorted(set().union(*every)), np.int64)
    w = c.pull(W, eids)
    new = eids >= c.book.num_edges
    if new.any():
        got = DistOneHopSampler(c, c.book).sample_one_hop(seeds, [10_000], seed=0)
        by_eid = dict(zip(got.eid.tolist(), got.src.tolist(), strict=True))
        s = np.asarray([by_eid[e] for e in eids[new].tolist()])
        want = (s // 4 + (s % 4) / 4).astype(np.float32)
        want[s % 3 == 0] = 0.0
        assert w[new].tolist() == want.tolist(), "a new edge read without its weight"
    batches = int(new.sum()) // len(seeds)
    assert int(new.sum()) == batches * len(seeds), "a batch seen in part"
    positive = set(eids[w > 0].tolist())
    all_of = weighted(c, seeds, 10_000, False, seed)
    assert sorted(all_of.eid.tolist()) == sorted(positive)
    some = weighted(c, seeds, 20, True, seed)
    assert len(some) == 20 * len(seeds) and set(some.eid.tolist()) <= positive
    return batches, some.eid.tolist()


def test_weighted_draws_read_one_version_while_a_writer_commits_and_after_compaction(parts):
    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        cfg_c = ClientConfig([t.address for t in threads], job="w", timeout=20)
        with KVClient(cfg_c) as c, KVClient(cfg_c) as writer:
            seeds = seeds_of(c)
            base = sorted(set().union(*in_edges(c, seeds)))
            c.follow()
            pinned = c.follow(write(writer, 0, seeds, base[0]))
            _, at_pin = check_version(c, seeds, 7)
            done = threading.Event()

            def ingest() -> None:
                for k in range(1, BATCHES):
                    write(writer, k, seeds, base[k])
                done.set()

            t = threading.Thread(target=ingest)
            t.start()
            while not done.is_set():  # at the head as it moves: each version whole
                c.follow()
                check_version(c, seeds, 7)
                c.follow(pinned)  # and at the pinned version: the same draws as before
                assert check_version(c, seeds, 7) == (1, at_pin)
            t.join()
            c.follow()
            assert check_version(c, seeds, 7)[0] == BATCHES
            c.follow(pinned)  # the pinned version reads as it did
            assert check_version(c, seeds, 7) == (1, at_pin)
            c.follow()
            head = check_version(c, seeds, 3)
            stats = [compact(c, p) for p in (0, 1)]
            assert all(s["compactions"] == 1 and not s["error"] for s in stats)
            assert check_version(c, seeds, 3) == head  # folded: the same draws
            write(writer, BATCHES, seeds, None)  # and a delta over the folded base
            c.follow()
            assert check_version(c, seeds, 3)[0] == BATCHES + 1


def test_a_new_edge_must_carry_the_weight_feature(parts):
    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with (
        store_threads(cfg, 2) as threads,
        KVClient(ClientConfig([t.address for t in threads], job="w", timeout=20)) as c,
    ):
        w = GraphWriter(c)
        with pytest.raises(ArgumentError, match=r"edge type _N:_E:_N has features \['w'\]"):
            w.add_edges("_E", [1], [2])
        w.add_edges("_E", [1], [2], {"w": np.ones(1, np.float32)})
        assert w.commit() == 1


@pytest.mark.integration
def restart(cluster: Cluster) -> None:
    """``kill -9`` both partitions' servers (partition 1 first), then start them again."""
    for p in (1, 0):
        cluster.kill(p)
    for p in (0, 1):
        cluster.start(p)


def test_weighted_draws_are_the_same_after_kill_9_and_after_a_compacted_restart(
    tmp_path, key_file, keys, parts
):
    cluster = Cluster(tmp_path, key_file)
    cluster.parts = parts
    try:
        for p in (0, 1):
            cluster.start(p)
        with cluster.client(keys) as c:
            seeds = seeds_of(c)
            base = sorted(set().union(*in_edges(c, seeds)))
            for k in range(4):
                write(c, k, seeds, base[k])
            c.follow()
            before = check_version(c, seeds, 5)
        restart(cluster)  # the pieces and their weights replayed from the logs
        with cluster.client(keys) as c:
            c.follow()
            assert check_version(c, seeds, 5) == before
            assert [compact(c, p)["compactions"] for p in (0, 1)] == [1, 1]
            # the samplers check_version builds are co-located: built after the
            # compaction (shared memory holds the folded edges), they read by request
            assert c.local_parts == [0, 1]
            assert check_version(c, seeds, 5) == before
        restart(cluster)  # the compacted directories' growth rows loaded
        with cluster.client(keys) as c:
            c.follow()
            assert check_version(c, seeds, 5) == before
    finally:
        cluster.stop()
        clean_stale(DEFAULT_SHM_DIR)
