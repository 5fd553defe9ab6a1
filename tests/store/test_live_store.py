"""The live graph on real store servers: the write_graph grant, the two-phase commit,
reads at a version, bad writes and the delta bound (issue 42)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from graphrun.distributed.writer import GraphWriter
from graphrun.distributed.writer_plan import Plan
from graphrun.errors import ArgumentError, AuthError, StoreError
from graphrun.partition import load_id_mapping
from graphrun.rpc.auth import KeyPair, generate_keys, new_keypair, public_key_file_text
from graphrun.store import live
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.live_client import fetch_head
from graphrun.store.live_client import route as live_route
from graphrun.store.live_wire import piece_to_wire
from graphrun.store.server import ServerConfig
from graphrun.testing.store import make_partition_dir, store_threads

FEAT = "node/_N/feat"
SAMPLING = ("graphrun.sampling.server:register",)


@dataclass
class LiveStore:
    addresses: list[str]
    admin: KeyPair
    clients: Path
    parts: Path

    def key(self, name: str, grants: tuple[str, ...] = ()) -> KeyPair:
        pair = new_keypair()
        keys = KeyPair(pair.public, pair.secret, server=self.admin.public)
        (self.clients / f"{name}.key").write_text(public_key_file_text(keys.public, grants))
        return keys

    def client(self, keys: KeyPair, job: str) -> KVClient:
        return KVClient(ClientConfig(self.addresses, job=job, keys=keys, timeout=20))

    def writer_client(self) -> KVClient:
        return self.client(self.key("writer", ("write_graph",)), "writer")


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    return make_partition_dir(tmp_path_factory.mktemp("live") / "parts", 2)[1]


@pytest.fixture
def store(parts, tmp_path) -> Iterator[LiveStore]:
    admin = generate_keys(tmp_path / "store.key")
    clients = tmp_path / "clients"
    clients.mkdir()
    cfg = ServerConfig(parts, 0, keys=admin, clients_dir=clients, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        yield LiveStore([t.address for t in threads], admin, clients, parts)


def node_rows(c: KVClient, n: int, value: float) -> dict[str, np.ndarray]:
    out = {}
    for t in c.list_tensors():
        if t.name.startswith("node/_N/"):
            out[t.name.rsplit("/", 1)[1]] = np.full((n, *t.row_shape), value, t.dtype)
    return out


@contextmanager
def hetero_store(tmp_path: Path) -> Iterator[tuple[KVClient, Path]]:
    """A heterograph's two partitions served (no keys), a client of it, and the
    partition directory."""
    _, hparts = make_partition_dir(tmp_path / "parts", 2, hetero=True)
    cfg = ServerConfig(hparts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        c = KVClient(ClientConfig([t.address for t in threads], job="w", timeout=20))
        with c:
            yield c, hparts


def in_edges(c: KVClient, seeds: np.ndarray, what: str = "eid") -> list[set[int]]:
    """Every in-edge of each seed at the client's version, asked of the owners: its eid
    (``what="src"``: its source, a graph id)."""
    column = {"src": 0, "eid": 2}[what]
    view = c.live or fetch_head(c.session)
    _, part, _ = live_route(view, c.book.node_offsets, view.num_nodes, view.node_owner,
                            seeds, "seeds")  # fmt: skip
    out: list[set[int]] = [set() for _ in seeds]
    for p in np.unique(part).tolist():
        pos = np.flatnonzero(part == p)
        body = {"fanout": [10_000] * len(c.book.edge_types), "seed": 0}
        msg = c.session.call(p, "sample_neighbors", body, tensors=(seeds[pos],))
        which, got = msg.tensors[1], msg.tensors[column]
        for w, e in zip(which.tolist(), got.tolist(), strict=True):
            out[pos[w]].add(e)
    return out


def test_a_job_key_cannot_write_the_graph_a_granted_key_and_the_admin_can(store):
    with store.client(store.key("job-a"), "job-a") as job:
        w = GraphWriter(job)
        w.add_nodes("_N", [10**9], node_rows(job, 1, 1.0))
        with pytest.raises(AuthError, match="live_begin: writing the graph needs a key granted"):
            w.commit()
        job.follow()
        assert job.version == 0  # nothing was begun
        with pytest.raises(AuthError, match="live_prepare"):
            job.session.call(0, "live_prepare", {"piece": {"version": 1}})
    with store.writer_client() as c:
        w = GraphWriter(c)
        w.add_nodes("_N", [10**9], node_rows(c, 1, 1.0))
        assert w.commit() == 1
    with store.client(store.admin, "ops") as admin:
        w = GraphWriter(admin)
        w.add_nodes("_N", [10**9 + 1], node_rows(admin, 1, 2.0))
        assert w.commit() == 2
        assert (w.lookup([10**9, 10**9 + 1]) >= admin.book.num_nodes).all()


def test_reads_see_exactly_the_versions_at_or_below_theirs(store):
    with store.writer_client() as c:
        n = c.book.num_nodes
        w = GraphWriter(c)
        base_in = in_edges(c, np.asarray([3], np.int64))[0]
        gone = min(base_in)
        w.add_nodes("_N", [10**9], node_rows(c, 1, 7.0))
        dst_orig = load_id_mapping(store.parts).orig_nids[[3, 500]]  # both partitions
        w.add_edges("_E", [10**9, 10**9], dst_orig, orig=True)
        w.delete_edges("_E", [gone])
        w.update_features("_N", "feat", [3], np.full((1, 8), 5.0, np.float32))
        v1 = w.commit()
        new = int(w.lookup([10**9])[0])
        assert new >= n
        w.update_features("_N", "feat", [3, new], np.full((2, 8), 9.0, np.float32))
        w.add_edges("_E", [3], [new])
        v2 = w.commit()
        base_row = c.pull(FEAT, [3]).copy()
        for v, row3, row_new in ((0, None, None), (v1, 5.0, 7.0), (v2, 9.0, 9.0)):
            c.follow(v)
            if row3 is None:
                assert (c.pull(FEAT, [3]) == base_row).all()
                with pytest.raises(ArgumentError, match="out of range"):
                    c.pull(FEAT, [new])
                with pytest.raises(ArgumentError, match="out of range"):
                    in_edges(c, np.asarray([new]))
                continue
            got = c.pull(FEAT, np.asarray([3, new]))
            assert (got[0] == row3).all() and (got[1] == row_new).all()
        c.follow(0)
        assert in_edges(c, np.asarray([3]))[0] == base_in
        c.follow(v1)
        seen = in_edges(c, np.asarray([3, 500, new]))
        assert gone not in seen[0] and len(seen[0]) == len(base_in)  # one gone, one new
        assert any(e >= c.book.num_edges for e in seen[0]) and len(seen[2]) == 0
        c.follow(v2)
        assert len(in_edges(c, np.asarray([new]))[0]) == 1
        deg = c.session.call(0, "graph_in_degrees", {}, tensors=(np.asarray([3]),))
        assert int(deg.tensors[0][0]) == len(base_in)


def test_a_refused_piece_aborts_the_whole_batch(store):
    with store.writer_client() as c:
        w = GraphWriter(c)
        w.add_nodes("_N", [10**9], node_rows(c, 1, 1.0))
        w.commit()
        new = int(w.lookup([10**9])[0])
        w.add_nodes("_N", [10**9 + 1], node_rows(c, 1, 2.0))
        w.add_edges("_E", [10**9 + 1], [3], orig=True)
        w.update_features("_N", "feat", [new + 1], np.zeros((1, 8), np.float32))  # no node
        with pytest.raises(ArgumentError, match=r"updates\['node/_N/feat'\] ids\[0\]"):
            w.commit()
        assert w.lookup([10**9 + 1]).tolist() == [-1]
        c.follow()
        assert c.version == 2  # version 2 was decided: aborted
        assert all(e < c.book.num_edges for e in in_edges(c, np.asarray([3]))[0])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda w, c: w.add_nodes("paper", [1], {}), "unknown node type 'paper'"),
        (lambda w, c: w.add_nodes("_N", [10**9], {"feat": np.zeros((1, 8), np.float32)}),
         "are missing"),
        (lambda w, c: w.add_nodes("_N", [10**9], {**node_rows(c, 1, 0.0),
                                                  "feat": np.zeros((1, 8), np.float64)}),
         r"features\['feat'\]: got float64 \(1, 8\), expected float32"),
        (lambda w, c: w.add_nodes("_N", np.arange(live.MAX_PIECE_ROWS + 1), {}),
         "more than .* rows; commit"),
        (lambda w, c: w.add_edges("_E", [0], [c.book.num_nodes + 5]), "dst: graph id"),
        (lambda w, c: w.add_edges("_E", [0.5], [1]), "integer"),
        (lambda w, c: w.update_features("_N", "feat", [1], np.zeros((1, 7), np.float32)),
         r"expected float32 \(1, 8\)"),
        (lambda w, c: w.delete_edges("_E", [c.book.num_edges + 1]), "is not an edge"),
    ],
)  # fmt: skip
def test_a_bad_write_is_one_error_and_nothing_is_applied(store, call, message):
    with store.writer_client() as c:
        w = GraphWriter(c)
        with pytest.raises(ArgumentError, match=message):
            call(w, c)
            w.commit()
        c.follow()
        assert c.version == 0


def test_a_write_is_wholly_visible_or_not_at_all_under_concurrent_sampling(parts):
    """A writer thread adds batches (a new node, its features, edges from it into both
    partitions and one into it) while this thread samples at the head again and again,
    co-located (shared memory while nothing is visible, requests otherwise): never an
    edge whose endpoint is missing, never a node without features or its in-edge."""
    import threading

    from graphrun.sampling.distributed import DistOneHopSampler

    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    orig = load_id_mapping(parts).orig_nids
    batches = 25
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        wc = KVClient(ClientConfig(addresses, job="w", timeout=20))
        rc = KVClient(ClientConfig(addresses, job="r", timeout=20))
        errors: list[BaseException] = []

        def write() -> None:
            try:
                w = GraphWriter(wc)
                for i in range(batches):
                    new = 10**9 + i
                    w.add_nodes("_N", [new], node_rows(wc, 1, float(i + 1)))
                    w.add_edges("_E", [new, new, orig[7]], [orig[3], orig[500], new], orig=True)
                    w.commit()
            except BaseException as exc:
                errors.append(exc)

        with wc, rc:
            n = rc.book.num_nodes
            sampler = DistOneHopSampler(rc, rc.book)
            assert sampler.local.keys() == {0, 1}  # co-located: both partitions
            writer = threading.Thread(target=write)
            writer.start()
            seen_versions = set()
            while writer.is_alive() or len(seen_versions) < 2:
                v = rc.follow()
                seen_versions.add(v)
                out = sampler.sample_one_hop(np.asarray([3, 500]), [10_000], seed=v)
                src, which = np.asarray(out.src), np.asarray(out.seed_index)
                new_into = [set(src[(which == k) & (src >= n)].tolist()) for k in (0, 1)]
                assert new_into[0] == new_into[1], f"half a write visible at version {v}"
                assert len(new_into[0]) == v  # one new node per version
                if new_into[0]:
                    ids = np.asarray(sorted(new_into[0]), np.int64)
                    rows = rc.pull(FEAT, ids)
                    assert (rows > 0).all() and (rows == rows[:, :1]).all()
                    into = sampler.sample_one_hop(ids, [10_000], seed=v)
                    assert np.bincount(np.asarray(into.seed_index), minlength=len(ids)).tolist() \
                        == [1] * len(ids)  # fmt: skip
                if not writer.is_alive() and v == batches:
                    break
            writer.join()
            assert not errors, errors
            assert rc.follow() == batches and len(seen_versions) > 2


def test_the_sequencer_bounds_undecided_versions(store):
    from graphrun.store.live import MAX_UNDECIDED

    with store.writer_client() as c:
        empty = np.empty(0, np.int64)
        body = {"nodes": [0, 0], "edges": [0, 0]}
        for _ in range(MAX_UNDECIDED):
            c.session.call(0, "live_begin", body, tensors=(empty,))
        with pytest.raises(StoreError, match=f"{MAX_UNDECIDED} versions are begun and undecided"):
            c.session.call(0, "live_begin", body, tensors=(empty,))
        c.session.call(0, "live_decide", {"version": 1, "commit": False})
        c.session.call(0, "live_begin", body, tensors=(empty,))  # room again
        with pytest.raises(ArgumentError, match="field 'nodes' must give 2 counts"):
            c.session.call(0, "live_begin", {"nodes": [1], "edges": [0, 0]}, tensors=(empty,))


def test_a_read_settles_a_piece_whose_commit_has_not_arrived(store):
    """The writer decided (acknowledged) but its live_commit never reached partition 1:
    a read at the head there asks the sequencer the piece's fate and sees it."""
    with store.writer_client() as c, store.client(store.key("job-a"), "job-a") as r:
        w = GraphWriter(c)
        w.add_nodes("_N", [10**9], node_rows(c, 1, 4.0))
        to_500 = load_id_mapping(store.parts).orig_nids[[500]]  # placed on partition 1
        w.add_edges("_E", to_500, [10**9], orig=True)
        plan = Plan(w, w._batch, fetch_head(c.session))
        counts = {"nodes": plan.node_counts(), "edges": plan.edge_counts()}
        begun = c.session.call(0, "live_begin", counts, tensors=(plan.orig_by_part(),))
        v = begun.body["version"]
        plan.give_ids(begun.body["nodes"], begun.body["edges"])
        assert plan.parts() == [1]
        body, tensors = piece_to_wire(plan.piece(1, v))
        seq = c.session.part(0).main.address
        c.session.call(1, "live_prepare", {"piece": body, "seq": seq}, tensors=tensors)
        c.session.call(0, "live_decide", {"version": v, "commit": True})  # no live_commit
        assert r.follow() == v
        new = int(w.lookup([10**9])[0])
        assert (r.pull(FEAT, [new]) == 4.0).all()
        assert len(in_edges(r, np.asarray([new]))[0]) == 1


def test_the_sequencer_applies_its_own_partitions_piece_as_it_decides(store):
    """The writer sends partition 0 no live_commit: the sequencer's decision commits (or
    aborts) the piece partition 0 holds, before any read asks."""
    with store.client(store.admin, "ops") as c:  # the admin sees the live counters
        w = GraphWriter(c)
        for v_commit in (True, False):
            w.add_edges("_E", [1], [2])  # base nodes of partition 0
            v, body, tensors = begun_piece(c, w, 0)
            c.session.call(0, "live_prepare", {"piece": body}, tensors=tensors)
            assert c.stats(0)["live_pending"] == 1
            c.session.call(0, "live_decide", {"version": v, "commit": v_commit})
            got = c.stats(0)
            assert (got["live_pending"], got["live_committed"]) == (0, 1), v_commit


def test_a_heterograph_takes_typed_nodes_and_edges_with_edge_features(tmp_path):
    with hetero_store(tmp_path) as (c, hparts):
        book = c.book
        w = GraphWriter(c)
        paper = book.to_homo("paper", np.asarray([0, 1, 2]))
        with pytest.raises(ArgumentError, match="features: edge type paper:cites:paper has"):
            w.add_edges("cites", paper[1:2], paper[2:3])
        w.add_nodes("author", [10**9], {"feat": np.ones((1, 4), np.float32)})
        orig_p0 = load_id_mapping(hparts).orig_nids[paper[0]]
        w.add_edges("writes", [10**9], [orig_p0], orig=True)
        w.add_edges("cites", paper[1:2], paper[2:3], {"weight": np.asarray([0.5], np.float32)})
        v = w.commit()
        bad = GraphWriter(c)
        bad.add_edges("writes", paper[1:2], paper[2:3])  # a paper cannot write
        with pytest.raises(ArgumentError, match="has node type 'paper', its edge type needs"):
            bad.commit()
        c.follow()
        assert c.version == v
        new_e = [e for e in in_edges(c, paper[2:3])[0] if e >= book.num_edges]
        assert len(new_e) == 1
        got = c.pull("edge/paper:cites:paper/weight", np.asarray(new_e))
        assert got.tolist() == [0.5]
        author = int(w.lookup([10**9])[0])
        assert c.pull("node/author/feat", [author]).tolist() == [[1.0] * 4]
        assert any(e >= book.num_edges for e in in_edges(c, paper[:1])[0])


def test_a_client_that_does_not_follow_reads_the_base_graph(store):
    """A job unaware of the live graph (no version in its requests) never gets a new id:
    its samples and rows are the base graph's, from the main server as from shared memory."""
    with store.writer_client() as c, store.client(store.key("job-a"), "job-a") as r:
        base = in_edges(r, np.asarray([3]))[0]
        w = GraphWriter(c)
        w.add_nodes("_N", [10**9], node_rows(c, 1, 1.0))
        w.add_edges("_E", [10**9], load_id_mapping(store.parts).orig_nids[[3]], orig=True)
        w.update_features("_N", "feat", [3], np.full((1, 8), 6.0, np.float32))
        before = r.pull(FEAT, [3]).copy()
        w.commit()
        assert r.version is None
        assert in_edges(r, np.asarray([3]))[0] == base
        assert (r.pull(FEAT, [3]) == before).all()
        r.follow()
        assert len(in_edges(r, np.asarray([3]))[0]) == len(base) + 1
        assert (r.pull(FEAT, [3]) == 6.0).all()


def test_a_chain_of_new_nodes_follows_its_placed_end(store):
    """LDG with the batch's own edges: new nodes linked only to each other go where the
    first of them has its placed neighbour (the old rule put them on the smallest)."""
    chain = [10**9 + k for k in range(4)]
    with store.writer_client() as c:
        for base, part in ((3, 0), (500, 1)):
            w = GraphWriter(c)
            w.add_nodes("_N", chain, node_rows(c, 4, 1.0))
            end = load_id_mapping(store.parts).orig_nids[[base]]
            w.add_edges("_E", end, chain[:1], orig=True)
            w.add_edges("_E", chain[:-1], chain[1:], orig=True)
            plan = Plan(w, w._batch, fetch_head(c.session))
            assert plan.node_part.tolist() == [part] * 4


def test_a_co_located_pull_reads_shared_memory_until_a_base_row_is_overwritten(store):
    """New edges and nodes leave a partition's base rows as they were: a co-located reader
    at their version pulls base rows from shared memory (and a new node's from the
    server); from the version that overwrites a base row on, it asks the server."""
    with store.writer_client() as c:
        keys = store.key("job-a")
        cfg = ClientConfig(store.addresses, job="job-a", keys=keys, use_shm=None, timeout=20)
        with KVClient(cfg) as r:
            assert r.local_parts == [0, 1]
            w = GraphWriter(c)
            w.add_nodes("_N", [10**9], node_rows(c, 1, 7.0))
            w.add_edges("_E", [3, 500], [500, 3])
            v1 = w.commit()
            w.update_features("_N", "feat", [3], np.full((1, 8), 5.0, np.float32))
            v2 = w.commit()
            new = int(w.lookup([10**9])[0])
            base = r.pull(FEAT, [3, 500]).copy()
            r.follow(v1)
            before = dict(r.traffic)
            got = r.pull(FEAT, [3, 500, new])
            assert (got[:2] == base).all() and (got[2] == 7.0).all()
            shm = sum(r.traffic[p, "pull:shm"] - before.get((p, "pull:shm"), 0) for p in (0, 1))
            assert shm == 2 * 8 * 4  # rows 3 and 500 from shared memory, the new one asked
            r.follow(v2)
            before = dict(r.traffic)
            got = r.pull(FEAT, [3, 500])
            assert (got[0] == 5.0).all() and (got[1] == base[1]).all()
            owner = int(np.searchsorted(r.book.node_offsets, 3, side="right") - 1)
            assert r.traffic[owner, "pull:shm"] == before.get((owner, "pull:shm"), 0)


def test_pipelined_batches_are_each_whole_and_a_refusal_is_raised_at_flush(store):
    """``window`` batches in flight: each is applied whole at its own version, in
    submission order; a batch a partition refuses is aborted alone and raised by
    ``flush`` once none is in flight."""
    with store.writer_client() as c:
        with pytest.raises(ArgumentError, match=r"window: expected batches in flight in \[1, 16\]"):
            GraphWriter(c, window=0)
        base = in_edges(c, np.asarray([500], np.int64))[0]
        w = GraphWriter(c, window=4)
        for _ in range(6):
            w.add_edges("_E", [3], [500])
            w.submit()
        w.delete_edges("_E", [c.book.num_edges + 4000])  # in a block handed out, no edge
        w.submit()
        for _ in range(2):
            w.add_edges("_E", [3], [500])
            w.submit()
        with pytest.raises(ArgumentError, match=r"deleted_edges.* is not an edge owned here"):
            w.flush()
        versions = list(w.acknowledged)
        assert len(versions) == 8 and versions == sorted(versions)
        assert w.flush() == versions  # taken now
        c.follow()
        assert len(in_edges(c, np.asarray([500], np.int64))[0] - base) == 8


def test_a_pipelined_batch_naming_new_nodes_of_a_batch_in_flight_waits_for_it(store):
    """Ends named by original id are looked up at the sequencer: a batch naming a node
    that a batch still in flight adds waits for it (not refused as unknown)."""
    with store.writer_client() as c:
        base = in_edges(c, np.asarray([500], np.int64))[0]
        w = GraphWriter(c, window=4)
        w.add_nodes("_N", [10**9 + 50], node_rows(c, 1, 3.0))
        w.submit()
        to_500 = load_id_mapping(store.parts).orig_nids[[500]]
        w.add_edges("_E", [10**9 + 50], to_500, orig=True)  # its node is still in flight
        w.submit()
        assert len(w.flush()) == 2
        c.follow()
        assert int(w.lookup([10**9 + 50])[0]) >= c.book.num_nodes
        assert len(in_edges(c, np.asarray([500], np.int64))[0] - base) == 1


def begun_piece(c: KVClient, w: GraphWriter, part: int) -> tuple[int, dict, list]:
    """The batch in ``w`` begun at the sequencer: its version and ``part``'s piece."""
    plan = Plan(w, w._batch, fetch_head(c.session))
    w._batch = type(w._batch)()
    counts = {"nodes": plan.node_counts(), "edges": plan.edge_counts()}
    begun = c.session.call(0, "live_begin", counts, tensors=(plan.orig_by_part(),))
    v = begun.body["version"]
    plan.give_ids(begun.body["nodes"], begun.body["edges"])
    assert plan.parts() == [part]
    body, tensors = plan.wire(part, v)
    return v, body, tensors


def test_a_prepare_carries_earlier_decisions_and_is_bounded(store):
    """``decided`` in a live_prepare commits (or aborts) earlier pieces as their
    live_commit would, before the new piece is held; more than MAX_DECIDED is refused."""
    with store.client(store.admin, "ops") as c:
        w = GraphWriter(c)
        versions = []
        for _ in range(3):
            w.add_edges("_E", [3], [500])  # 500 is placed on partition 1
            v, body, tensors = begun_piece(c, w, 1)
            decided = [[x, x == versions[0]] for x in versions[-2:]]  # 1st commit, 2nd abort
            c.session.call(1, "live_prepare", {"piece": body, "decided": decided}, tensors=tensors)
            c.session.call(0, "live_decide", {"version": v, "commit": len(versions) != 1})
            versions.append(v)
        got = c.stats(1)
        assert (got["live_pending"], got["live_committed"]) == (1, 1)
        assert "live_commit" not in got["served"]
        w.add_edges("_E", [3], [500])
        v, body, tensors = begun_piece(c, w, 1)
        too_many = [[versions[-1], True]] * 65
        with pytest.raises(ArgumentError, match="field 'decided' carries more than 64"):
            c.session.call(1, "live_prepare", {"piece": body, "decided": too_many},
                           tensors=tensors)  # fmt: skip
        assert c.stats(1)["live_pending"] == 1  # nothing of it applied


def test_a_pipelined_writer_sends_its_decisions_with_its_next_pieces(store):
    """A pipelined writer sends a partition no live_commit a batch: each decision rides
    in the next piece sent there and ``flush`` sends the rest; every piece is committed."""
    with store.client(store.admin, "ops") as c:
        base = in_edges(c, np.asarray([500], np.int64))[0]
        w = GraphWriter(c, window=4)
        for _ in range(12):
            w.add_edges("_E", [3], [500])
            w.submit()
        assert len(w.flush()) == 12
        got = c.stats(1)
        assert (got["live_pending"], got["live_committed"]) == (0, 12)
        assert got["served"].get("live_commit", 0) <= 4  # 12 before
        w.close()
        c.follow()
        assert len(in_edges(c, np.asarray([500], np.int64))[0] - base) == 12
        assert c.stats(1)["live"]["index_work"] >= 12  # the read indexed every new edge


def test_a_begin_carries_earlier_decisions_and_a_refused_one_takes_none(store):
    """``decided`` in a live_begin decides earlier versions as their live_decide would
    (the answer says which committed, and the head); a begin refused (bad counts,
    unknown version, too many decisions) takes none of the decisions it carried."""
    with store.writer_client() as c:
        empty = np.empty(0, np.int64)
        body = {"nodes": [0, 0], "edges": [0, 0]}
        v1, v2, v3 = (c.session.call(0, "live_begin", body, tensors=(empty,)).body["version"]
                      for _ in range(3))  # fmt: skip
        got = c.session.call(0, "live_begin", {**body, "decided": [[v1, True], [v2, False]]},
                             tensors=(empty,)).body  # fmt: skip
        assert got["decided"] == [[v1, True], [v2, False]] and got["head"] == v2
        for bad, why in (
            ({"nodes": [1], "edges": [0, 0]}, "field 'nodes' must give 2 counts"),
            ({**body, "decided": [[99, True]]}, "version 99 was never begun"),
            ({**body, "decided": [[v3, True]] * 65}, "carries more than 64 decisions"),
        ):
            with pytest.raises(ArgumentError, match=why):
                c.session.call(0, "live_begin", {"decided": [[v3, True]], **bad},
                               tensors=(empty,))  # fmt: skip
            assert c.session.call(0, "live_fate", {"version": v3}).body["fate"] == "pending"
        again = c.session.call(0, "live_begin", {**body, "decided": [[v2, True], [v3, True]]},
                               tensors=(empty,)).body  # fmt: skip
        assert again["decided"] == [[v2, False], [v3, True]]  # the first decision stands


def test_a_pipelined_writer_sends_its_decisions_with_its_next_begins(store):
    """A pipelined writer sends the sequencer no live_decide a batch: each decision rides
    in its next live_begin and ``flush`` sends the rest; every batch is committed."""
    with store.client(store.admin, "ops") as c:
        base = [in_edges(c, np.asarray([i], np.int64))[0] for i in (3, 500)]
        w = GraphWriter(c, window=4)
        for _ in range(12):
            w.add_edges("_E", [500, 3], [3, 500])  # a piece on each partition
            w.submit()
        assert w.flush() == list(range(1, 13))
        got = c.stats(0)
        assert got["served"].get("live_decide", 0) <= 4  # 12 before
        assert (got["live_pending"], got["live_committed"], got["live_head"]) == (0, 12, 12)
        w.close()
        c.follow()
        for i, b in zip((3, 500), base, strict=True):
            assert len(in_edges(c, np.asarray([i], np.int64))[0] - b) == 12


def test_a_writer_with_slack_in_its_window_sends_batches_before_earlier_answers(store):
    """With ``window`` above 4 a batch waits for its answers only once it has used the
    window's slack: a writer whose answers have not arrived (``ready`` says so) sends its
    next batches without waiting, then catches up; every decision still rides in a
    begin (no live_decide but ``flush``'s: at most the window's) and every batch is committed."""
    with store.client(store.admin, "ops") as c:
        waited: list[str] = []
        wait, c.session.ready = c.session.wait, lambda pending: False  # nothing arrived yet
        c.session.wait = lambda pending, timeout=None: (
            waited.append(pending.op) or wait(pending, timeout)
        )
        w = GraphWriter(c, window=8)
        for i in range(20):
            w.add_edges("_E", [500, 3], [3, 500])
            w.submit()
            if i == 4:  # five batches sent: the first one's begin is due at the sixth
                assert [op for op in waited if op in ("live_begin", "live_prepare")] == []
        assert w.flush() == list(range(1, 21))
        got = c.stats(0)
        assert got["served"].get("live_decide", 0) <= 8  # flush's: at most the window
        assert (got["live_pending"], got["live_committed"], got["live_head"]) == (0, 20, 20)
        w.close()
