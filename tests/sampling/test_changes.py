"""The embedding refresh's store-side questions (graphrun/sampling/changes.py), on a
partition's CSC and a delta built by hand."""

from __future__ import annotations

import numpy as np

from graphrun.sampling.changes import changed_edges, changes, out_edges
from graphrun.sampling.csc import CSCGraph
from graphrun.store.live import Batch, LiveDelta

I64 = np.int64
N = 100  # base nodes: growth ids from here


def csc() -> CSCGraph:
    """Rows 10..13 (row_start 10): 0 -> 10, 11 -> 10, 10 -> 11, 0 -> 12; eids 0..3."""
    return CSCGraph(np.array([0, 2, 3, 4, 4]), np.array([0, 11, 10, 0]), np.arange(4),
                    row_start=10)  # fmt: skip


def batch(
    version: int,
    nodes: np.ndarray | None = None,
    orig: np.ndarray | None = None,
    edges: np.ndarray | None = None,
    deleted: np.ndarray | None = None,
    updates: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> Batch:
    e = np.empty(0, I64)
    nodes = e if nodes is None else nodes
    edges = np.empty((3, 0), I64) if edges is None else edges
    return Batch(version, nodes, np.zeros(len(nodes), np.int32), e if orig is None else orig,
                 edges, np.zeros(edges.shape[1], np.int32), e if deleted is None else deleted,
                 {}, updates or {})  # fmt: skip


def delta(*batches: Batch) -> LiveDelta:
    d = LiveDelta()
    for b in batches:
        d.hold(b, 0.0)
        d.commit(b.version)
    return d


def test_changes_name_new_nodes_updated_rows_and_the_destinations_of_edge_changes():
    feat = "node/_N/feat"
    d = delta(
        batch(1, nodes=np.array([N]), orig=np.array([7]), edges=np.array([[N], [13], [4000]])),
        batch(2, deleted=np.array([2, 4000]),
              updates={feat: (np.array([12]), np.ones((1, 8), np.float32)),
                       "node/_N/train_mask": (np.array([11]), np.ones(1, bool))}),
        batch(3, edges=np.array([[0], [10], [4001]])),
    )  # fmt: skip
    nodes, dst = changes(csc(), d, 0, 2, [feat])
    assert nodes.tolist() == [12, N]  # not 11: its train_mask is not the input feature
    assert dst.tolist() == [11, 13]  # the new edge into 13 (deleted again), base edge 2 into 11
    nodes, dst = changes(csc(), d, 0, 2, [])
    assert nodes.tolist() == [11, 12, N]  # every node feature
    nodes, dst = changes(csc(), d, 1, 3, [feat])
    assert nodes.tolist() == [12] and dst.tolist() == [10, 11, 13]
    assert [a.tolist() for a in changes(csc(), d, 3, 3, [])] == [[], []]


def test_changed_edges_are_those_at_one_version_and_not_the_other():
    """(src, dst, sign): an edge added and deleted in between is neither, a new edge
    older than ``since`` deleted since is -1, a deleted base edge is found in the CSC,
    each copy of a multi-edge is one."""
    d = delta(
        batch(1, nodes=np.array([N]), orig=np.array([7]), edges=np.array([[N], [13], [4000]])),
        batch(2, deleted=np.array([2, 4000])),
        batch(3, edges=np.array([[0], [10], [4001]])),
        batch(4, edges=np.array([[0, 0], [12, 12], [4002, 4003]])),
    )  # fmt: skip

    def got(since: int, v: int) -> list[tuple[int, int, int]]:
        return sorted(map(tuple, changed_edges(csc(), d, since, v).T.tolist()))

    assert got(0, 1) == [(N, 13, 1)]
    assert got(0, 2) == [(10, 11, -1)]  # base edge 2; edge 4000 came and went
    assert got(1, 3) == [(0, 10, 1), (10, 11, -1), (N, 13, -1)]
    assert got(3, 4) == [(0, 12, 1), (0, 12, 1)]
    assert got(4, 4) == []


def out_neighbors(g: CSCGraph, d: LiveDelta | None, v: int, ids: np.ndarray) -> np.ndarray:
    return np.unique(out_edges(g, d, v, ids)[1])


def test_out_neighbors_at_a_version_see_new_edges_and_not_deleted_ones():
    d = delta(
        batch(1, edges=np.array([[11], [13], [4000]])),
        batch(2, deleted=np.array([0])),
    )  # fmt: skip
    g = csc()
    assert out_neighbors(g, None, 0, np.array([0])).tolist() == [10, 12]
    assert out_neighbors(g, d, 1, np.array([0, 11])).tolist() == [10, 12, 13]
    assert out_neighbors(g, d, 2, np.array([0])).tolist() == [12]  # 0 -> 10 deleted at 2
    assert out_neighbors(g, d, 2, np.array([5, 99])).tolist() == []
    e = out_edges(g, d, 1, np.array([0, 11]))  # the edges themselves, each source's
    assert sorted(map(tuple, e.T.tolist())) == [(0, 10), (0, 12), (11, 10), (11, 13)]


def test_the_out_edge_index_finds_what_a_scan_of_the_csc_finds():
    """CSCGraph.out_edges (an index built once) against a scan of every edge, with
    multi-edges, hubs, ids that are no source, negative and past every id."""
    rng = np.random.default_rng(0)
    rows, start = 300, 50
    deg = rng.zipf(2.1, rows).clip(max=200)  # power-law in-degrees
    indptr = np.concatenate([[0], np.cumsum(deg)])
    src = (rng.zipf(2.1, int(indptr[-1])) * 7) % 1000  # hubs as sources, repeated
    g = CSCGraph(indptr, src, np.arange(len(src)) * 3, row_start=start)
    dst = np.repeat(np.arange(rows) + start, deg)
    for ids in (np.array([7, 14, 0]), rng.integers(-5, 1200, 60), np.empty(0, I64)):
        s, t, eid = g.out_edges(ids)
        pick = np.isin(src, ids)
        want = sorted(zip(src[pick], dst[pick], np.flatnonzero(pick) * 3, strict=True))
        assert sorted(zip(s, t, eid, strict=True)) == want
    assert g.out_edges(np.array([10**9]))[0].tolist() == []
    empty = CSCGraph(np.zeros(3, I64), np.empty(0, I64), np.empty(0, I64))
    assert [a.tolist() for a in empty.out_edges(np.array([0, 1]))] == [[], [], []]


def test_live_in_degrees_count_what_the_merged_csc_holds():
    """The refresh's degrees (sampling.live.in_degrees: no base in-edges read) against
    the rows of the merged CSC that sampling reads, at every version of a delta that adds
    nodes and edges and deletes base and new edges (one of them twice)."""
    from graphrun.sampling.live import in_degrees, merged_csc

    d = delta(
        batch(1, nodes=np.array([N, N + 1]), orig=np.array([7, 8]),
              edges=np.array([[N, 0, 11, 0], [13, N, 10, 10], [4000, 4001, 4002, 4003]])),
        batch(2, deleted=np.array([0, 4002])),
        batch(3, deleted=np.array([0, 3]), edges=np.array([[N + 1], [N + 1], [4004]])),
    )  # fmt: skip
    seeds = np.array([10, 11, 12, 13, N, N + 1, 10])
    for v in (1, 2, 3):
        want = np.diff(merged_csc(csc(), d, v, seeds).indptr)
        assert in_degrees(csc(), d, v, seeds).tolist() == want.tolist(), v
    assert in_degrees(csc(), d, 3, seeds).tolist() == [2, 1, 0, 1, 1, 1, 2]


def test_a_reply_of_edges_is_bounded(tmp_path, monkeypatch):
    """graph_out_neighbors with ``edges`` refuses a reply past MAX_OUT_EDGES (one line
    saying to ask for fewer ids); the unique destinations are still answered."""
    import pytest

    from graphrun.errors import GraphrunError
    from graphrun.sampling import changes as mod
    from graphrun.store.client import ClientConfig, KVClient
    from graphrun.store.server import ServerConfig
    from graphrun.testing.store import make_partition_dir, store_threads

    _, parts = make_partition_dir(tmp_path / "parts", 1, num_nodes=200, num_edges=2000)
    monkeypatch.setattr(mod, "MAX_OUT_EDGES", 5)
    cfg = ServerConfig(parts, 0, extensions=("graphrun.sampling.server:register",))
    ids = (np.arange(200, dtype=I64),)
    with store_threads(cfg, 1) as threads, KVClient(ClientConfig([threads[0].address])) as c:
        (dst,) = c.session.call(0, mod.OP_OUT_NEIGHBORS, {}, tensors=ids).tensors
        assert 0 < len(dst) <= 200
        with pytest.raises(GraphrunError, match="more than 5 a reply: ask for fewer ids"):
            c.session.call(0, mod.OP_OUT_NEIGHBORS, {"edges": True}, tensors=ids)
        monkeypatch.setattr(mod, "MAX_OUT_EDGES", 1 << 24)
        src, dst = c.session.call(0, mod.OP_OUT_NEIGHBORS, {"edges": True},
                                  tensors=(ids[0][:1],)).tensors  # fmt: skip
        assert len(src) > 5 and set(src) == {0} and len(dst) == len(src)
