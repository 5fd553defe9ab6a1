"""Partition 0's piece rides in the ``live_begin`` (issue 42, ingest rate): the sequencer
numbers it with the ids it hands out and holds it as ``live_prepare`` would, so its
server takes one request a batch; ``retry_after`` and a refusal keep their meaning."""

from __future__ import annotations

import numpy as np
import pytest

from graphrun.distributed.writer import GraphWriter
from graphrun.errors import ArgumentError
from graphrun.partition import load_id_mapping
from graphrun.store import live
from graphrun.store.client import KVClient
from graphrun.store.live_client import fetch_head
from graphrun.store.live_client import route as live_route
from tests.store import test_live_store
from tests.store.test_live_store import FEAT, in_edges, node_rows

parts, store = test_live_store.parts, test_live_store.store  # its fixtures

P0_NODE, P1_NODE = 3, 500  # base nodes of partition 0 and 1


def in_sources(c: KVClient, seed: int) -> dict[int, int]:
    """eid -> src of each in-edge of ``seed`` at the client's version."""
    view = c.live or fetch_head(c.session)
    seeds = np.asarray([seed], np.int64)
    _, part, _ = live_route(view, c.book.node_offsets, view.num_nodes, view.node_owner,
                            seeds, "seeds")  # fmt: skip
    body = {"fanout": [10_000] * len(c.book.edge_types), "seed": 0}
    msg = c.session.call(int(part[0]), "sample_neighbors", body, tensors=(seeds,))
    src, _, eid = msg.tensors[:3]
    return dict(zip(eid.tolist(), src.tolist(), strict=True))


def test_the_sequencer_takes_its_partitions_piece_in_the_begin(store):
    """Batches with pieces on both partitions and new nodes on each: partition 0 serves
    no live_prepare (one request a batch); every edge into it has the new node's id the
    sequencer gave (a node placed on partition 1 too), its rows read at the version."""
    with store.client(store.admin, "ops") as c:
        orig = load_id_mapping(store.parts).orig_nids
        base = set(in_sources(c, P0_NODE))
        w = GraphWriter(c, window=4)
        for i in range(6):
            here, there = 10**9 + 2 * i, 10**9 + 2 * i + 1
            w.add_nodes("_N", [here, there], node_rows(c, 2, float(i)))
            w.add_edges("_E", [here] * 3, orig[[P0_NODE] * 3], orig=True)  # placed on 0
            w.add_edges("_E", [there] * 3, orig[[P1_NODE] * 3], orig=True)  # placed on 1
            w.add_edges("_E", [there, here], orig[[P0_NODE, P1_NODE]], orig=True)
            w.submit()
        assert w.flush() == list(range(1, 7))
        served = c.stats(0)["served"]
        assert served.get("live_begin") == 6 and "live_prepare" not in served
        assert c.stats(1)["served"].get("live_prepare") == 6
        w.close()
        c.follow()
        ids = w.lookup(10**9 + np.arange(12))
        owners = fetch_head(c.session).node_owner[(ids - c.book.num_nodes) // live.GROWTH_BLOCK]
        assert set(owners[0::2].tolist()) == {0} and set(owners[1::2].tolist()) == {1}
        new = {e: s for e, s in in_sources(c, P0_NODE).items() if e not in base}
        assert sorted(new.values()) == sorted([*np.repeat(ids[0::2], 3), *ids[1::2]])
        rows = c.pull(FEAT, ids[0::2])
        assert (rows == np.arange(6, dtype=np.float32)[:, None]).all()


def test_a_begin_answers_what_became_of_its_piece(store):
    """The begin's ``piece``: held (numbered: its node and edge ids are the begin's),
    or refused with its error (the version stands, undecided, for the writer to abort):
    ids of its own, an end naming no new node of the batch, a bad feature."""
    with store.writer_client() as c:
        n = c.book.num_nodes
        feats = {f"node/_N/{k}": v for k, v in node_rows(c, 1, 1.0).items()}
        tensors = [np.asarray([10**9], np.int64), np.asarray([0], np.int32),
                   np.asarray([10**9], np.int64), np.asarray([[-1, 0], [P0_NODE, P0_NODE]]),
                   np.zeros(2, np.int32), *feats.values()]  # fmt: skip
        piece = {
            "version": 0,
            "node_types": 1,
            "node_orig": 2,
            "new_edges": 3,
            "edge_types": 4,
            "node_features": {k: 5 + i for i, k in enumerate(feats)},
        }
        body = {"nodes": [1, 0], "edges": [2, 0], "piece": piece}
        got = c.session.call(0, "live_begin", body, tensors=tensors).body
        assert got["piece"] == {"held": True}
        v = got["version"]
        [[(node, _)]], [[(eid, _)], _] = got["nodes"][:1], got["edges"]
        c.session.call(0, "live_decide", {"version": v, "commit": True})
        c.follow()
        assert (
            int(c.session.call(0, "live_lookup", {}, tensors=(tensors[0],)).tensors[0][0]) == node
        )
        assert in_sources(c, P0_NODE).get(eid) == node and in_sources(c, P0_NODE)[eid + 1] == 0
        assert node >= n
        for change, why in (
            ({"piece": {**piece, "new_nodes": 2}}, "new_nodes is the sequencer's to fill"),
            ({"edges": [1, 1]}, "has 2 edges, the begin counts 1 for partition 0"),
        ):
            tensors[0] = np.asarray([10**9 + v], np.int64)
            refused = c.session.call(0, "live_begin", {**body, **change}, tensors=tensors).body
            assert refused["piece"]["error"] == "ArgumentError"
            assert why in refused["piece"]["refused"]
            fate = c.session.call(0, "live_fate", {"version": refused["version"]}).body
            assert fate["fate"] == "pending"  # its writer aborts it
            c.session.call(0, "live_decide", {"version": refused["version"], "commit": False})
        tensors[3] = np.asarray([[-2, 0], [P0_NODE, P0_NODE]])  # the batch has one new node
        tensors[0] = np.asarray([10**9 + 99], np.int64)
        refused = c.session.call(0, "live_begin", body, tensors=tensors).body
        assert "names new node 1 of 1" in refused["piece"]["refused"]


def test_a_refused_piece_of_partition_0_aborts_the_batch_through_the_writer(store):
    with store.client(store.admin, "ops") as c:  # its stats say what was served
        w = GraphWriter(c)
        w.add_nodes("_N", [10**9], node_rows(c, 1, 1.0))
        w.add_edges("_E", [10**9], load_id_mapping(store.parts).orig_nids[[P0_NODE]], orig=True)
        w.commit()
        new = int(w.lookup([10**9])[0])
        w.add_edges("_E", [P0_NODE, P0_NODE], [P1_NODE, P1_NODE])  # partition 1's piece
        w.update_features("_N", "feat", [new + 1], np.zeros((1, 8), np.float32))  # no node
        with pytest.raises(ArgumentError, match=r"updates\['node/_N/feat'\] ids\[0\]"):
            w.commit()
        assert "live_prepare" not in c.stats(0)["served"]  # refused in the begin
        c.follow()
        assert c.version == 2  # version 2 was decided: aborted
        assert all(e < c.book.num_edges for e in in_edges(c, np.asarray([P1_NODE]))[0])


def test_partition_0_slowed_at_the_begin_gets_its_piece_as_a_prepare(store, monkeypatch):
    """``retry_after`` for the piece in the begin: the writer sends it as a live_prepare
    (answered ``retry_after`` again while slowed, then held): slowed, never dropped."""
    calls = []

    def slowed(self: live.LiveDelta) -> bool:
        calls.append(1)
        return len(calls) <= 2  # the begin's and the first prepare's look

    monkeypatch.setattr(live.LiveDelta, "slowed", slowed)
    with store.client(store.admin, "ops") as c:  # its stats say what was served
        base = in_edges(c, np.asarray([P0_NODE]))[0]
        w = GraphWriter(c)
        w.add_edges("_E", [P1_NODE], [P0_NODE])
        assert w.commit() == 1
        assert c.stats(0)["served"].get("live_prepare") == 2 and w.waited_s > 0
        c.follow()
        assert len(in_edges(c, np.asarray([P0_NODE]))[0] - base) == 1
