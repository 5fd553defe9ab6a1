"""KV client + servers with real sockets and shared memory (servers in threads)."""

from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from graphrun.errors import ArgumentError, AuthError, StoreError
from graphrun.rpc.auth import new_keypair, secure_client
from graphrun.rpc.codec import PROTOCOL_VERSION, MsgKind, decode
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.server import ServerConfig
from graphrun.testing.store import store_threads
from tests.store.conftest import connect, reference_rows

FEAT = "node/_N/feat"


def test_pull_matches_single_process_reference(homo, stores, keys, rng):
    graph, parts = homo
    ids = rng.integers(0, graph.num_nodes, 1000)
    with connect(stores, keys) as c:
        assert c.local_parts == [0, 1]
        got = c.pull(FEAT, ids)
        np.testing.assert_array_equal(got, reference_rows(graph, parts, "node", "_N", "feat", ids))
        labels = c.pull("node/_N/label", ids[:10])
        ref = reference_rows(graph, parts, "node", "_N", "label", ids[:10])
        np.testing.assert_array_equal(labels, ref)


def test_shm_and_network_paths_give_identical_bytes(stores, keys, rng):
    ids = rng.integers(0, 600, 777)
    with connect(stores, keys) as local, connect(stores, keys, use_shm=False) as remote:
        assert remote.local_parts == []
        a, b = local.pull(FEAT, ids), remote.pull(FEAT, ids)
        assert a.tobytes() == b.tobytes() and a.dtype == b.dtype and a.shape == b.shape
        # one owner only: the fast paths (no reordering) agree too
        one = np.arange(5)
        assert local.pull(FEAT, one).tobytes() == remote.pull(FEAT, one).tobytes()
        assert local.pull(FEAT, []).shape == (0, 8) == remote.pull(FEAT, []).shape


@pytest.mark.parametrize("use_shm", [True, False])
def test_a_pull_into_given_rows_writes_just_them(stores, keys, rng, use_shm):
    with connect(stores, keys, use_shm=use_shm) as c:
        ids = rng.integers(0, 600, 50)
        want = c.pull(FEAT, ids)
        out = np.full((80, *want.shape[1:]), -1, want.dtype)
        at = rng.permutation(80)[:50]
        assert c.pull(FEAT, ids, out=out, at=at) is out
        np.testing.assert_array_equal(out[at], want)
        others = np.setdiff1d(np.arange(80), at)
        assert (out[others] == -1).all()
        one = np.empty_like(want[:3])
        got = c.pull(FEAT, [5, 1, 5], out=one)  # one owner or not: into ``one`` all the same
        assert got is one
        np.testing.assert_array_equal(one, c.pull(FEAT, [5, 1, 5]))


def test_chunked_remote_pulls_give_identical_bytes(stores, keys, rng):
    ids = rng.integers(0, 600, 500)
    with (
        connect(stores, keys, use_shm=False) as whole,
        connect(stores, keys, use_shm=False, pull_chunk_bytes=1000, max_chunks=7) as chunked,
    ):
        assert whole.pull(FEAT, ids).tobytes() == chunked.pull(FEAT, ids).tobytes()
        one = np.arange(100)  # one owner, several chunks
        assert whole.pull(FEAT, one).tobytes() == chunked.pull(FEAT, one).tobytes()


def test_push_reducers_match_reference(stores, keys, rng):
    with connect(stores, keys, use_shm=False) as c:
        c.init_tensor("t", "node:_N", (3,), "float32")
        ref = np.zeros((600, 3), np.float32)
        ids = rng.integers(0, 600, 400)
        vals = rng.random((400, 3), dtype=np.float32)
        c.push("t", ids, vals, "add")
        np.add.at(ref, ids, vals)
        uniq = np.unique(ids)[:50]
        c.push("t", uniq, np.full((50, 3), 7, np.float32), "assign")
        ref[uniq] = 7
        np.testing.assert_allclose(c.pull("t", np.arange(600)), ref, rtol=1e-6)


def test_init_list_meta_delete(stores, keys):
    with connect(stores, keys, job="j") as c:
        info = c.init_tensor("h", "node:_N", (2, 2), "int32", init="zeros", persistent=True)
        assert info.shape == (600, 2, 2) and info.dtype == "int32"
        names = [t.name for t in c.list_tensors()]
        assert "h" in names and FEAT in names
        assert c.meta("h").policy == "node:_N"
        with pytest.raises(StoreError, match="already exists"):
            c.init_tensor("h", "node:_N", (2, 2), "int32")
        c.init_tensor("h", "node:_N", (2, 2), "int32", exist_ok=True)
        u = c.init_tensor("u", "node:_N", (4,), init="uniform", init_args={"low": 0, "high": 1})
        x = c.pull("u", np.arange(600))
        assert u.num_rows == 600
        assert x.min() >= 0 and x.max() <= 1 and x.std() > 0.1
        c.delete_tensor("h")
        assert "h" not in [t.name for t in c.list_tensors()]
        with pytest.raises(StoreError, match="does not exist"):
            c.pull("h", [0])


def test_a_tensor_a_restarted_partition_lost_is_not_listed(homo, keys):
    """A job tensor is listed only where every partition has it: a server started again
    since it was made has lost it (the list asked partition 0 alone, and a refresh that
    attached a listed table failed to write the restarted partition)."""
    from dataclasses import replace

    from graphrun.testing.store import StoreThread

    _, parts = homo
    with store_threads(ServerConfig(parts, 0, keys=keys), 2) as s:
        with connect(s, keys, job="j") as c:
            c.init_tensor("h", "node:_N", (2,), persistent=True)
        s[1].stop()
        s[1] = StoreThread(replace(s[1].cfg, address=s[1].address)).start()
        with connect(s, keys, job="j") as c:
            assert "h" not in [t.name for t in c.list_tensors()]
            assert "h" in [t.name for t in c.list_tensors(anywhere=True)]
            assert FEAT in [t.name for t in c.list_tensors()]
            c.init_tensor("h", "node:_N", (2,), persistent=True, exist_ok=True)
            c.push("h", np.arange(600), np.ones((600, 2), np.float32))
            assert "h" in [t.name for t in c.list_tensors()]


def test_push_tables_writes_several_tensors_or_none(stores, keys, rng):
    """One request a partition for several tensors' rows: what separate pushes write; a
    request with one tensor it may not write (the graph's) writes none of the others."""
    with connect(stores, keys, job="pt") as c:
        c.init_tensor("a", "node:_N", (3,), persistent=True)
        c.init_tensor("b", "node:_N", (), "int64", persistent=True)
        ids_a, ids_b = rng.permutation(np.arange(100, 300)), np.array([599, 0, 300])
        va = rng.random((200, 3), dtype=np.float32)
        c.push_tables([("a", ids_a, va), ("b", ids_b, np.array([7, 8, 9]))])
        np.testing.assert_array_equal(c.pull("a", ids_a), va)
        np.testing.assert_array_equal(c.pull("b", ids_b), [7, 8, 9])
        assert c.pull("b", [1])[0] == 0
        before = c.stats(0)["served"].get("push_tables", 0)
        c.push_tables([("a", [0, 599], np.ones((2, 3), np.float32)), ("b", [5], np.array([1]))])
        assert c.stats(0)["served"]["push_tables"] == before + 1  # one request a partition
        with pytest.raises(StoreError, match="read-only"):
            c.push_tables([("a", [1, 598], np.ones((2, 3), np.float32)),
                           (FEAT, [1, 598], c.pull(FEAT, [1, 598]))])  # fmt: skip
        assert not c.pull("a", [1, 598]).any()
        with pytest.raises(ArgumentError, match="dtype"):
            c.push_tables([("a", [2], np.ones((1, 3), np.float32)), ("b", [2], np.ones(1))])
        assert not c.pull("a", [2]).any()


def test_send_tables_waits_for_every_turn_and_raises_after(stores, keys, rng, monkeypatch):
    """``send_tables``: the first request a partition sent, the rest (rows past one
    request's bytes: three turns here) sent by the waiter; an error (a table it may not
    write) raised by the waiter once every answer is in, never at the send."""
    from graphrun.store import client as client_mod

    monkeypatch.setattr(client_mod, "PUSH_WINDOW_BYTES", 1000)
    with connect(stores, keys, job="st") as c:
        c.init_tensor("a", "node:_N", (3,), persistent=True)
        c.init_tensor("b", "node:_N", (3,), persistent=True)
        ids = rng.permutation(np.arange(100, 300))
        va, vb = (rng.random((200, 3), dtype=np.float32) for _ in range(2))
        before = c.stats(0)["served"].get("push_tables", 0)
        wait = c.send_tables([("a", ids, va), ("b", ids, vb), ("a", [0], va[:1])])
        wait()
        assert c.stats(0)["served"]["push_tables"] >= before + 3
        np.testing.assert_array_equal(c.pull("a", ids), va)
        np.testing.assert_array_equal(c.pull("b", ids), vb)
        wait = c.send_tables([("a", [1, 598], np.ones((2, 3), np.float32)),
                              (FEAT, [1, 598], c.pull(FEAT, [1, 598]))])  # fmt: skip
        with pytest.raises(StoreError, match="read-only"):
            wait()
        assert not c.pull("a", [1, 598]).any()


def test_recreated_tensor_is_not_read_from_a_stale_mapping(stores, keys):
    with connect(stores, keys, job="re") as a, connect(stores, keys, job="re") as b:
        a.init_tensor("r", "node:_N", (1,), persistent=True)
        a.push("r", [0], np.array([[1.0]], np.float32))
        assert b.pull("r", [0])[0, 0] == 1  # b maps the segment
        a.delete_tensor("r")
        a.init_tensor("r", "node:_N", (1,), persistent=True)
        a.push("r", [0], np.array([[2.0]], np.float32))
        assert b.pull("r", [0])[0, 0] == 2
        a.delete_tensor("r")


def test_pulls_of_mapped_tensors_make_no_system_call_until_a_deletion(stores, keys, monkeypatch):
    """A co-located pull used to stat the segment's file every time; the servers'
    deletion counters (shared memory) now say when a look is needed."""
    looks = []
    real = Path.exists
    monkeypatch.setattr(Path, "exists", lambda self: looks.append(self) or real(self))
    with connect(stores, keys, job="stat") as a, connect(stores, keys, job="stat") as b:
        assert a.local_parts == [0, 1]
        a.init_tensor("s", "node:_N", (1,), persistent=True)
        a.pull("s", [0, 599])
        looks.clear()
        for _ in range(20):
            a.pull("s", [0, 599])
            a.pull(FEAT, [1, 2])
        assert looks == []
        b.init_tensor("other", "node:_N", (1,))
        b.delete_tensor("other")  # a deletion: the next pull looks once, then no more
        a.pull("s", [0, 599])
        assert 0 < len(looks) <= 4
        looks.clear()
        a.pull("s", [0, 599])
        assert looks == []
        a.delete_tensor("s")


def test_reductions_are_computed_by_the_servers(stores, keys):
    with connect(stores, keys, job="red") as c:
        n = c.meta(FEAT).num_rows
        whole = c.pull(FEAT, np.arange(n))
        before = dict(c.traffic)
        assert c.reduce(FEAT, "max") == pytest.approx(float(whole.max()))
        assert c.reduce(FEAT, "min") == pytest.approx(float(whole.min()))
        assert c.reduce(FEAT, "sum") == pytest.approx(float(whole.sum(dtype=np.float64)), rel=1e-4)
        assert c.reduce(FEAT, "count_nonzero") == int(np.count_nonzero(whole))
        assert sum(c.traffic.values()) == sum(before.values())  # no rows crossed over
        c.init_tensor("m", "node:_N", (), dtype="bool")
        picked = np.array([3, 250, 301, 599])  # in both partitions
        c.push("m", picked, np.ones(4, bool))
        np.testing.assert_array_equal(c.reduce("m", "nonzero"), picked)
        with pytest.raises(ArgumentError, match="how"):
            c.reduce(FEAT, "median")
        with pytest.raises(StoreError, match="does not exist"):
            c.reduce("nothing", "max")


def test_two_jobs_are_namespaced(stores, keys):
    with connect(stores, keys, job="a") as a, connect(stores, keys, job="b") as b:
        a.init_tensor("w", "node:_N", (1,))
        b.init_tensor("w", "node:_N", (1,))
        a.push("w", [1, 2], np.array([[1.0], [2.0]], np.float32))
        b.push("w", [1, 2], np.array([[5.0], [6.0]], np.float32))
        np.testing.assert_array_equal(a.pull("w", [1, 2]).ravel(), [1, 2])
        np.testing.assert_array_equal(b.pull("w", [1, 2]).ravel(), [5, 6])
        # graph data is shared by both
        assert a.pull(FEAT, [3]).tobytes() == b.pull(FEAT, [3]).tobytes()


def test_job_tensors_freed_when_last_client_leaves(stores, keys):
    c1 = connect(stores, keys, job="tmp")
    c2 = connect(stores, keys, job="tmp")
    c1.init_tensor("scratch", "node:_N", (1,))
    c1.init_tensor("keep", "node:_N", (1,), persistent=True)
    c1.close()
    assert c2.pull("scratch", [0]).shape == (1, 1)  # c2 still holds the job alive
    c2.close()
    with connect(stores, keys, job="tmp") as c3:
        names = [t.name for t in c3.list_tensors()]
        assert "scratch" not in names and "keep" in names
        c3.delete_tensor("keep")


def test_hetero_policies(hetero, keys, rng):
    graph, parts = hetero
    with store_threads(ServerConfig(parts, 0, keys=keys), 2) as s, connect(s, keys) as c:
        assert set(map(str, c.policies)) >= {"node:author", "node:paper", "edge:paper:cites:paper"}
        ids = rng.integers(0, 50, 40)
        got = c.pull("node/paper/feat", ids)
        np.testing.assert_array_equal(
            got, reference_rows(graph, parts, "node", "paper", "feat", ids)
        )
        eids = rng.integers(0, 200, 30)
        got = c.pull("edge/paper:cites:paper/weight", eids)
        ref = reference_rows(graph, parts, "edge", "paper:cites:paper", "weight", eids)
        np.testing.assert_array_equal(got, ref)
        with pytest.raises(ArgumentError, match="out of range"):
            c.pull("node/author/feat", [30])


def test_local_structure_is_the_partition_csc(homo, stores, keys):
    from graphrun.partition import load_partition

    _, parts = homo
    with connect(stores, keys) as c:
        s = c.local_structure(0)
        p = load_partition(parts, 0)
        for k in ("nodes", "indptr", "indices", "eids"):
            np.testing.assert_array_equal(s[k], getattr(p, k))
    with connect(stores, keys, use_shm=False) as c:
        assert c.local_structure(0) is None


def test_local_structure_whose_memory_is_gone_is_read_over_the_network(stores, keys, tmp_path):
    """A trainer that maps its co-located partition after the server's segments were
    removed (a killed primary, cleaned up) samples it over the network; it failed the
    trainer with "shared memory ...: cannot open" before."""
    import msgspec

    with connect(stores, keys) as c:
        e = c.session.part(0)
        assert e.local
        e.info = msgspec.structs.replace(e.info, shm_dir=tmp_path)  # nothing there
        assert c.local_structure(0) is None
        assert not c.session.local_ok(0)
        assert c.pull(FEAT, [0, 1]).shape[0] == 2  # the server answers


# ---- bad input to a live server ---------------------------------------------------------


def test_bad_requests_get_typed_errors_and_server_goes_on(stores, keys):
    with connect(stores, keys, use_shm=False) as c:
        c.init_tensor("f", "node:_N", (2,))
        cases = [
            (lambda: c.pull("nope", [0]), StoreError, "does not exist"),
            (lambda: c.pull(FEAT, [600]), ArgumentError, "out of range"),
            (lambda: c.pull(FEAT, [-1]), ArgumentError, "out of range"),
            (lambda: c.push("f", [0], np.zeros((1, 2), np.float64)), ArgumentError, "dtype"),
            (lambda: c.push("f", [0], np.zeros((1, 3), np.float32)), ArgumentError, "shape"),
            (lambda: c.push("f", [0], np.zeros((1, 2), np.float32), "max"), ArgumentError, "max"),
            (lambda: c.push(FEAT, [0], np.zeros((1, 8), np.float32)), StoreError, "read-only"),
            (lambda: c.init_tensor("g", "node:nope"), ArgumentError, "policy"),
            (lambda: c.session.call(0, "pull", {"name": FEAT}), ArgumentError, "tensor 0"),
            (lambda: c.session.call(0, "no_such_op"), ArgumentError, "unknown operation"),
        ]
        for fn, exc, match in cases:
            with pytest.raises(exc, match=match):
                fn()
        # local rows out of range, sent directly past the client's own checks
        with pytest.raises(ArgumentError, match="out of range"):
            c.session.call(0, "pull", {"name": FEAT}, tensors=(np.array([10**6]),))
        with pytest.raises(ArgumentError, match="int64"):
            c.session.call(0, "pull", {"name": FEAT}, tensors=(np.array([0.5]),))
        assert c.pull(FEAT, [1, 2, 3]).shape == (3, 8)


def _raw(stores, keys):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    secure_client(s, keys)
    s.connect(stores[0].address)
    return ctx, s


@pytest.mark.parametrize(
    "frames",
    [
        [b"\xde\xad\xbe\xef" * 10],
        [msgpack.packb({"v": PROTOCOL_VERSION + 1, "k": 1, "op": "pull", "id": 1, "b": {}})],
        [
            msgpack.packb(
                {
                    "v": PROTOCOL_VERSION,
                    "k": 1,
                    "op": "pull",
                    "id": 1,
                    "b": {},
                    "t": [["int64", [9]]],
                }
            ),
            b"\x00" * 8,
        ],
        [
            msgpack.packb(
                {"v": 1, "k": 1, "op": "pull", "id": 1, "b": {}, "t": [["int64", [1 << 40]]]}
            ),
            b"",
        ],
    ],
    ids=["garbage", "wrong-version", "truncated", "oversized"],
)
def test_malformed_frames_to_live_store(stores, keys, frames):
    ctx, s = _raw(stores, keys)
    try:
        s.send_multipart(frames)
        assert s.poll(5000)
        msg = decode(s.recv_multipart())
        assert msg.kind == MsgKind.ERROR and msg.body["type"] == "ProtocolError"
    finally:
        s.close(0)
        ctx.term()
    with connect(stores, keys) as c:
        assert c.pull(FEAT, [0]).shape == (1, 8)


def test_wrong_key_refused_store_goes_on(stores, keys):
    with pytest.raises(AuthError):
        KVClient(ClientConfig([s.address for s in stores], keys=new_keypair(), timeout=5))
    with connect(stores, keys) as c:
        assert c.pull(FEAT, [0]).shape == (1, 8)


def test_empty_job_name_is_refused(stores, keys):
    with pytest.raises(ArgumentError, match="job"):
        connect(stores, keys, job="")
    with connect(stores, keys) as c, pytest.raises(ArgumentError, match="field 'job'"):
        c.session.parts[0].main.call("join", {"s": "x", "job": ""})


def test_request_without_session_is_refused(stores, keys):
    with connect(stores, keys) as c:
        conn = c.session.parts[0].main
        with pytest.raises(StoreError, match="session 'ghost' is unknown"):
            conn.call("pull", {"s": "ghost", "name": FEAT}, (np.array([0]),))


def test_a_big_push_keeps_a_window_of_pieces_in_flight(stores, keys, rng, monkeypatch):
    """A push was sent as all its pieces at once: what a server has received and not read
    yet counts against one connection's limit (graphrun.rpc.guard), so a big push keeps
    at most PUSH_WINDOW_BYTES in flight, in order."""
    import graphrun.store.client as client_mod

    monkeypatch.setattr(client_mod, "REQUEST_FRAME_BYTES", 4096)
    monkeypatch.setattr(client_mod, "PUSH_WINDOW_BYTES", 3 * 4096)
    with connect(stores, keys, use_shm=False) as c:
        c.init_tensor("w", "node:_N", (8,))
        seen = []
        send = c.session.request

        def request(part, op, *a, **kw):
            seen.append(sum(conn.in_flight for p in c.session.parts.values() for conn in p.conns))
            return send(part, op, *a, **kw)

        monkeypatch.setattr(c.session, "request", request)
        ids = np.concatenate([np.arange(600), np.arange(600)])  # repeats: last one wins
        values = rng.random((1200, 8), dtype=np.float32)
        c.push("w", ids, values)
        monkeypatch.setattr(c.session, "request", send)
        assert len(seen) > 5 and max(seen) <= 2  # 5 kB pieces, a 12 kB window
        np.testing.assert_array_equal(c.pull("w", np.arange(600)), values[600:])


def test_nonzero_of_a_type_a_partition_holds_no_row_of(tmp_path, keys):
    """A partition may own no node of a type (one paper, two partitions): its server
    answers ``nonzero`` with no rows instead of failing to reshape an empty array."""
    from graphrun.partition import partition_graph
    from graphrun.testing.graphs import hetero_graph
    from graphrun.testing.store import store_threads

    graph = hetero_graph(num_papers=1, seed=0)
    graph.ndata["paper"]["train_mask"][:] = True
    partition_graph(graph, tmp_path / "parts", 2, method="random", seed=0)
    cfg = ServerConfig(tmp_path / "parts", 0, keys=keys, heartbeat_timeout=30)
    with store_threads(cfg, 2) as s, connect(s, keys, job="one-paper") as c:
        assert c.meta("node/paper/train_mask").num_rows == 1
        np.testing.assert_array_equal(c.reduce("node/paper/train_mask", "nonzero"), [0])
