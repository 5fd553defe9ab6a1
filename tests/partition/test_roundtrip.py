"""Partition directory round trip: every edge once, features with their owner, ranges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graphrun.graph import Graph
from graphrun.names import etype_key
from graphrun.partition import (
    load_id_mapping,
    load_partition,
    load_partition_book,
    load_partition_config,
    partition_graph,
)
from graphrun.testing.graphs import community_graph, hetero_graph


def check_round_trip(graph: Graph, out: Path, parts: int, halo: int) -> None:
    cfg = load_partition_config(out)
    book = load_partition_book(out)
    assert cfg["num_parts"] == parts and book.num_parts == parts
    mp = load_id_mapping(out)
    n, e = graph.num_nodes, graph.num_edges
    assert sorted(mp.orig_nids.tolist()) == list(range(n))
    assert (mp.new_nids[mp.orig_nids] == np.arange(n)).all()
    assert (mp.new_eids[mp.orig_eids] == np.arange(e)).all()
    nto, eto = graph.node_type_offsets, graph.edge_type_offsets
    assert nto is not None and eto is not None
    # contiguous per-type ranges; inside a (part, type) block, original ids increase
    types, per_type = book.to_per_type(np.arange(n))
    assert (types == graph.node_type_ids()[mp.orig_nids]).all()
    for t, ntype in enumerate(graph.node_types):
        assert sorted(per_type[types == t].tolist()) == list(range(graph.num_nodes_of(ntype)))
    for p in range(parts):
        for t, ntype in enumerate(graph.node_types):
            a, b = book.node_type_block(p, ntype)
            orig = mp.orig_nids[a:b]
            assert (np.diff(orig) > 0).all()
            assert ((orig >= nto[t]) & (orig < nto[t + 1])).all()
            lo, hi = book.owned_nodes(p, ntype)
            assert hi - lo == b - a
    seen_eids = []
    for p in range(parts):
        part = load_partition(out, p)
        a, b = book.owned_nodes(p)
        inner = part.num_inner_nodes
        assert part.nodes[:inner].tolist() == list(range(a, b))
        assert (book.nid2part(part.nodes[inner:]) != p).all()
        assert part.inner_mask.sum() == inner and part.inner_mask[:inner].all()
        local_types, _ = part.local_node_types()
        assert (local_types == graph.node_type_ids()[mp.orig_nids[part.nodes]]).all()
        assert len(np.unique(part.nodes)) == len(part.nodes)
        # every in-edge maps back to an original edge with the same endpoints
        rows = np.repeat(np.arange(len(part.nodes)), np.diff(part.indptr))
        orig_e = mp.orig_eids[part.eids]
        assert (graph.src[orig_e] == mp.orig_nids[part.indices]).all()
        assert (graph.dst[orig_e] == mp.orig_nids[part.nodes[rows]]).all()
        if graph.is_hetero:
            assert part.etypes is not None
            assert (part.etypes == graph.edge_type_ids()[orig_e]).all()
        inner_edges = rows < inner
        seen_eids.append(part.eids[inner_edges])
        assert (book.eid2part(part.eids[inner_edges]) == p).all()
        # halo
        dst_of_inner = np.isin(np.arange(n), mp.orig_nids[a:b])
        in_nbrs = np.unique(mp.new_nids[graph.src[dst_of_inner[graph.dst]]])
        halo1 = in_nbrs[(in_nbrs < a) | (in_nbrs >= b)]
        if halo == 0:
            assert len(part.nodes) == inner
        else:
            assert set(halo1.tolist()) <= set(part.nodes[inner:].tolist())
        if halo == 1:
            assert part.nodes[inner:].tolist() == halo1.tolist()
            assert (np.diff(part.indptr)[inner:] == 0).all()
        if halo >= 2:  # 1-hop halo rows hold their complete in-edges
            in_deg = np.bincount(mp.new_nids[graph.dst], minlength=n)
            local = {int(v): i for i, v in enumerate(part.nodes)}
            for v in halo1[:20]:
                i = local[int(v)]
                assert part.indptr[i + 1] - part.indptr[i] == in_deg[v]
        # features land with their owner
        for t, ntype in enumerate(graph.node_types):
            lo, _ = book.owned_nodes(p, ntype)
            for name, full in graph.ndata.get(ntype, {}).items():
                rows_here = part.node_feats[ntype][name]
                new_per_type = lo + np.arange(len(rows_here))
                homo = book.to_homo(ntype, new_per_type)
                orig_per_type = mp.orig_nids[homo] - nto[t]
                assert np.array_equal(rows_here, full[orig_per_type])
        for r, et in enumerate(graph.edge_types):
            key = etype_key(et)
            lo, _ = book.owned_edges(p, et)
            for name, full in graph.edata.get(key, {}).items():
                rows_here = part.edge_feats[key][name]
                homo = book.etype_to_homo(et, lo + np.arange(len(rows_here)))
                assert np.array_equal(rows_here, full[mp.orig_eids[homo] - eto[r]])
    all_eids = np.sort(np.concatenate(seen_eids))
    assert all_eids.tolist() == list(range(e))  # every edge exactly once


@pytest.mark.parametrize("method", ["metis", "random"])
@pytest.mark.parametrize("halo", [0, 1, 2])
def test_homogeneous_round_trip(tmp_path: Path, method: str, halo: int) -> None:
    g = community_graph(400, 3000, num_communities=4, seed=3)
    out = tmp_path / "parts"
    res = partition_graph(g, out, 3, method, halo_hops=halo, seed=1)
    assert res.path == out and out.is_dir()
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".")]
    check_round_trip(g, out, 3, halo)


@pytest.mark.parametrize("method", ["metis", "random"])
@pytest.mark.parametrize("halo", [1, 2])
def test_heterogeneous_round_trip(tmp_path: Path, method: str, halo: int) -> None:
    g = hetero_graph()
    out = tmp_path / "parts"
    partition_graph(g, out, 2, method, balance_train=True, halo_hops=halo)
    check_round_trip(g, out, 2, halo)
    cfg = load_partition_config(out)
    assert cfg["node_types"] == ["author", "paper"]
    assert cfg["edge_ranges"].keys() == {
        "author:writes:paper",
        "paper:cites:paper",
        "author:follows:author",
    }
    assert cfg["node_features"]["paper"]["feat"] == {"dtype": "float32", "shape": [50, 8]}


def test_metis_beats_random_and_quality_is_stored(tmp_path: Path) -> None:
    g = community_graph(600, 6000, num_communities=4, p_in=0.95, seed=0)
    m = partition_graph(g, tmp_path / "m", 4, "metis")
    r = partition_graph(g, tmp_path / "r", 4, "random")
    assert m.quality.edge_cut < r.quality.edge_cut
    stored = load_partition_config(tmp_path / "m")["quality"]
    assert stored["edge_cut"] == pytest.approx(m.quality.edge_cut)
    assert stored["num_cut_edges"] == m.quality.num_cut_edges


def test_single_part_and_parts_equal_nodes(tmp_path: Path) -> None:
    g = community_graph(20, 60, num_communities=2, seed=0)
    one = partition_graph(g, tmp_path / "one", 1, "metis")
    assert one.quality.edge_cut == 0.0
    check_round_trip(g, tmp_path / "one", 1, 1)
    for method in ("random", "metis"):
        res = partition_graph(g, tmp_path / method, 20, method)
        assert (np.diff(res.book.node_offsets) == 1).all()  # no empty partition
        check_round_trip(g, tmp_path / method, 20, 1)
