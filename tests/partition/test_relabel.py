"""Relabelling against a brute-force reference on random small (hetero)graphs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrun.graph import Graph
from graphrun.partition.relabel import edge_numbers, local_structure, relabel, write_edge_maps


@st.composite
def cases(draw: st.DrawFn) -> tuple[Graph, np.ndarray, int, int]:
    counts = draw(st.lists(st.integers(0, 6), min_size=1, max_size=3))
    if sum(counts) == 0:
        counts[0] = 1
    n = sum(counts)
    ntypes = tuple(f"t{i}" for i in range(len(counts)))
    nto = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    nonempty = [i for i, c in enumerate(counts) if c]
    pairs = draw(
        st.lists(st.tuples(st.sampled_from(nonempty), st.sampled_from(nonempty)), max_size=3)
    )
    etypes, srcs, dsts = [], [], []
    for r, (a, b) in enumerate(dict.fromkeys(pairs)):
        m = draw(st.integers(0, 8))
        srcs.append(
            nto[a]
            + np.array(
                draw(st.lists(st.integers(0, counts[a] - 1), min_size=m, max_size=m)),
                dtype=np.int64,
            )
        )
        dsts.append(
            nto[b]
            + np.array(
                draw(st.lists(st.integers(0, counts[b] - 1), min_size=m, max_size=m)),
                dtype=np.int64,
            )
        )
        etypes.append((ntypes[a], f"r{r}", ntypes[b]))
    if not etypes:
        etypes = [(ntypes[nonempty[0]], "r", ntypes[nonempty[0]])]
        srcs, dsts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    g = Graph(
        num_nodes=n,
        src=np.concatenate(srcs).astype(np.int64),
        dst=np.concatenate(dsts).astype(np.int64),
        node_types=ntypes,
        edge_types=tuple(etypes),
        node_type_offsets=nto,
        edge_type_offsets=np.concatenate([[0], np.cumsum([len(s) for s in srcs])]).astype(np.int64),
    )
    parts = draw(st.integers(1, 4))
    part = np.array(draw(st.lists(st.integers(0, parts - 1), min_size=n, max_size=n)), np.int64)
    return g, part, parts, draw(st.integers(0, 3))


@settings(max_examples=60, deadline=None)
@given(cases())
def test_relabel_matches_reference(case: tuple[Graph, np.ndarray, int, int]) -> None:
    g, part, parts, halo = case
    rl = relabel(g, part, parts)
    ntype_of = g.node_type_ids()
    # reference order: sort by (part, type, original id)
    ref_nodes = sorted(range(g.num_nodes), key=lambda v: (part[v], ntype_of[v], v))
    assert rl.orig_nids.tolist() == ref_nodes
    owner = part[g.dst]
    etype_of = g.edge_type_ids()
    ref_edges = sorted(range(g.num_edges), key=lambda e: (owner[e], etype_of[e], e))
    orig_eids, new_eids = np.empty(g.num_edges, np.int64), np.empty(g.num_edges, np.int64)
    write_edge_maps(g, rl, orig_eids, new_eids)
    assert orig_eids.tolist() == ref_edges
    assert (orig_eids[new_eids] == np.arange(g.num_edges)).all()
    for p in range(parts):
        a, b = rl.book.owned_nodes(p)
        assert (part[rl.orig_nids[a:b]] == p).all()
        loc = local_structure(g, rl, p, halo)
        inner = set(range(a, b))
        # reference halo: BFS over in-edges, hop by hop
        levels, seen, frontier = [], set(inner), set(inner)
        for _ in range(halo):
            nxt = {
                int(rl.new_nids[g.src[e]])
                for e in range(g.num_edges)
                if int(rl.new_nids[g.dst[e]]) in frontier
            } - seen
            if not nxt:
                break
            levels.append(sorted(nxt))
            seen |= nxt
            frontier = nxt
        expected = list(range(a, b)) + [v for lvl in levels for v in lvl]
        assert loc.nodes.tolist() == expected
        indices = np.concatenate([np.zeros(0, np.int64), *loc.column("src")])
        eids = np.concatenate([np.zeros(0, np.int64), *loc.column("eids")])
        assert indices.tolist() == rl.new_nids[g.src[loc.orig_eids]].tolist()
        assert eids.tolist() == new_eids[loc.orig_eids].tolist()
        with_edges = set(range(a, b)).union(*[set(lvl) for lvl in levels[: max(halo - 1, 0)]])
        for i, v in enumerate(loc.nodes.tolist()):
            got = sorted(loc.orig_eids[loc.indptr[i] : loc.indptr[i + 1]].tolist())
            want = sorted(e for e in range(g.num_edges) if int(rl.new_nids[g.dst[e]]) == v)
            assert got == (want if v in with_edges else [])


@pytest.mark.parametrize("few", [16, 0])  # parts numbered one by one; by a sort
def test_many_slices_number_and_gather_as_one(few: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    n, e, parts = 40, 300, 5
    g = Graph(num_nodes=n, src=rng.integers(0, n, e), dst=rng.integers(0, n, e))
    part = rng.integers(0, parts, n)
    whole = relabel(g, part, parts)
    want = [local_structure(g, whole, p, 2) for p in range(parts)]
    monkeypatch.setattr("graphrun.partition.relabel.FEW_PARTS", few)
    monkeypatch.setattr("graphrun.partition.arrays.SLICE", 7)  # 43 slices, a short last
    rl = relabel(g, part, parts)
    assert (rl.in_degree == whole.in_degree).all()
    new = np.concatenate([new for _, new in edge_numbers(g, rl)])
    owner = part[g.dst]
    order = sorted(range(e), key=lambda i: (owner[i], i))
    assert (new[order] == np.arange(e)).all()
    for p in range(parts):
        got = local_structure(g, rl, p, 2)
        assert got.nodes.tolist() == want[p].nodes.tolist()
        assert got.indptr.tolist() == want[p].indptr.tolist()
        for name in ("src", "eids", "orig"):
            a = np.concatenate([np.zeros(0, np.int64), *got.column(name)])
            b = np.concatenate([np.zeros(0, np.int64), *want[p].column(name)])
            assert a.tolist() == b.tolist()
