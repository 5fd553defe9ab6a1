"""Sampling over a partitioned graph, checked against the unpartitioned graph."""

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from graphrun.errors import ArgumentError
from graphrun.partition import load_id_mapping, load_partition, partition_graph
from graphrun.sampling import CSCGraph, NeighborSampler, OffsetTypeMap
from graphrun.sampling.csc import NO_EDGE_ID, csc_from_structure
from graphrun.sampling.distributed import DistOneHopSampler
from graphrun.sampling.partitioned import BookTypeMap
from graphrun.testing.graphs import random_graph, random_hetero_graph


def partitioned(tmp_path: Path, graph, parts: int = 2):
    out = tmp_path / "parts"
    partition_graph(graph, out, parts, method="random", seed=1)
    loaded = [load_partition(out, p) for p in range(parts)]
    book = loaded[0].book
    local = {
        p.part: csc_from_structure(
            {"indptr": p.indptr, "indices": p.indices, "eids": p.eids}
            | ({"etypes": p.etypes} if p.etypes is not None else {}),
            book,
            p.part,
        )
        for p in loaded
    }
    return book, local, load_id_mapping(out)


def test_every_edge_exists_in_the_original_graph(tmp_path: Path) -> None:
    g = random_graph()
    book, local, ids = partitioned(tmp_path, g)
    sampler = NeighborSampler(
        DistOneHopSampler(None, book, local), BookTypeMap(book), book.num_nodes, [6, 4], generator=3
    )
    seeds = torch.arange(0, book.num_nodes, 7)
    sub = sampler.sample(seeds)
    orig_n = torch.from_numpy(np.asarray(ids.orig_nids))
    orig_e = torch.from_numpy(np.asarray(ids.orig_eids))
    e = orig_e[sub.edge]
    assert torch.equal(torch.from_numpy(g.src)[e], orig_n[sub.node[sub.row]])
    assert torch.equal(torch.from_numpy(g.dst)[e], orig_n[sub.node[sub.col]])
    assert torch.unique(sub.edge).numel() == sub.edge.numel()  # 2 hops, no replacement
    # fanouts respected: min(in-degree, fanout) edges per frontier node
    deg = torch.from_numpy(g.in_degrees())
    sl = sub.layer_edges(1)
    per = torch.bincount(sub.col[sl], minlength=seeds.numel())
    assert torch.equal(per, torch.minimum(deg[orig_n[seeds]], torch.tensor(6)))


def test_seeds_spread_over_both_owners_are_merged_in_place(tmp_path: Path) -> None:
    g = random_graph()
    book, local, _ = partitioned(tmp_path, g)
    dist = DistOneHopSampler(None, book, local)
    seeds = torch.tensor([book.num_nodes - 1, 0, 5, book.num_nodes - 2])
    assert len(set(book.nid2part(seeds.numpy()).tolist())) == 2
    out = dist.sample_one_hop(seeds, torch.tensor([100]), seed=0)
    for i, s in enumerate(seeds.tolist()):
        p = int(book.nid2part(np.array([s]))[0])
        lo = book.owned_nodes(p)[0]
        csc = local[p]
        a, b = int(csc.indptr[s - lo]), int(csc.indptr[s - lo + 1])
        got = sorted(out.eid[out.seed_index == i].tolist())
        assert got == sorted(csc.eids[a:b].tolist())


def test_edges_come_in_seed_order_where_owners_interleave(tmp_path: Path) -> None:
    """A batch of one partition's seeds with a few of another's among them: the edges
    are grouped by seed in the seeds' order (a layer's compressed rows then need no
    sort), each seed's edges those its owner picked."""
    g = random_graph()
    book, local, _ = partitioned(tmp_path, g)
    dist = DistOneHopSampler(None, book, local)
    owner = book.nid2part(np.arange(book.num_nodes))
    mine, theirs = np.flatnonzero(owner == 0)[:40], np.flatnonzero(owner == 1)[:3]
    seeds = np.insert(mine, [5, 17, 30], theirs)
    out = dist.sample_one_hop(torch.from_numpy(seeds), torch.tensor([4]), seed=3)
    assert len(out) > 0 and bool(np.all(np.diff(out.seed_index) >= 0))
    for i, s in enumerate(seeds.tolist()):
        csc, lo = local[int(owner[s])], book.owned_nodes(int(owner[s]))[0]
        a, b = int(csc.indptr[s - lo]), int(csc.indptr[s - lo + 1])
        got = out.eid[out.seed_index == i]
        assert set(got.tolist()) <= set(csc.eids[a:b].tolist())
        assert len(got) == min(4, b - a)
    sampler = NeighborSampler(dist, BookTypeMap(book), book.num_nodes, [4, 3], generator=1)
    sub = sampler.sample(torch.from_numpy(seeds))
    assert bool((sub.col[1:] >= sub.col[:-1]).all())  # every layer's edges by destination


@pytest.mark.parametrize("compiled", [False, True])
def test_without_edge_ids_the_same_edges_and_no_ids(tmp_path: Path, monkeypatch, compiled) -> None:
    if compiled:
        monkeypatch.setenv("GRAPHRUN_COMPILED", "1")
    g = random_graph()
    book, local, _ = partitioned(tmp_path, g)
    dist = DistOneHopSampler(None, book, local)
    seeds = torch.arange(0, book.num_nodes, 3)
    full = dist.sample_one_hop(seeds, torch.tensor([4]), seed=5)
    bare = dist.without_edge_ids().sample_one_hop(seeds, torch.tensor([4]), seed=5)
    assert np.array_equal(full.src, bare.src) and np.array_equal(full.seed_index, bare.seed_index)
    assert len(full) > 0 and bool((full.eid >= 0).all()) and bool((bare.eid == NO_EDGE_ID).all())
    assert dist.edge_ids  # the sampler it came from still gathers them


def test_distributed_and_single_process_same_distribution(tmp_path: Path) -> None:
    g = random_graph(num_nodes=50, num_edges=1500)
    book, local, ids = partitioned(tmp_path, g)
    new = np.asarray(ids.new_nids)
    orig_e = np.asarray(ids.orig_eids)
    dist = DistOneHopSampler(None, book, local)
    single = CSCGraph.from_graph(g)
    node = int(np.argmax(g.in_degrees()))  # a node with many in-edges, original id
    trials, k = 3000, 3
    seeds_d = torch.full((trials,), int(new[node]))
    seeds_s = torch.full((trials,), node)
    out_d = dist.sample_one_hop(seeds_d, [k], seed=1)
    out_s = single.sample_one_hop(seeds_s, [k], seed=2)
    e_d = orig_e[out_d.eid]
    e_s = out_s.eid
    cats = np.union1d(e_d, e_s)
    table = np.stack([np.searchsorted(cats, e_d), np.searchsorted(cats, e_s)])
    counts = np.stack([np.bincount(t, minlength=len(cats)) for t in table])
    assert stats.chi2_contingency(counts).pvalue > 1e-3
    assert counts.sum(1).tolist() == [trials * k, trials * k]


def test_result_does_not_depend_on_which_partitions_are_local(tmp_path: Path) -> None:
    # per-partition kernel seeds come from the caller's seed in partition order
    g = random_graph()
    book, local, _ = partitioned(tmp_path, g)
    seeds = torch.arange(0, book.num_nodes, 3)
    a = DistOneHopSampler(None, book, local).sample_one_hop(seeds, torch.tensor([4]), seed=9)
    swapped = {1: local[1], 0: local[0]}
    b = DistOneHopSampler(None, book, swapped).sample_one_hop(seeds, torch.tensor([4]), seed=9)
    key_a = sorted(zip(a.seed_index.tolist(), a.eid.tolist(), strict=True))
    key_b = sorted(zip(b.seed_index.tolist(), b.eid.tolist(), strict=True))
    assert key_a == key_b


def test_hetero_partitioned_per_type_fanouts(tmp_path: Path) -> None:
    g = random_hetero_graph()
    book, local, ids = partitioned(tmp_path, g)
    types = BookTypeMap(book)
    fan = [{"writes": 2, "cites": 1, "follows": 0}]
    sampler = NeighborSampler(DistOneHopSampler(None, book, local), types, book.num_nodes, fan)
    papers = torch.from_numpy(book.to_homo("paper", np.arange(20)))
    sub = sampler.sample(papers)
    et = torch.from_numpy(g.edge_type_ids()).long()
    orig_e = torch.from_numpy(np.asarray(ids.orig_eids))
    assert torch.equal(sub.edge_type.long(), et[orig_e[sub.edge]])
    per = torch.bincount(sub.col * 3 + sub.edge_type.long(), minlength=60).view(20, 3)
    assert per[:, 0].max() <= 2 and per[:, 1].max() <= 1 and per[:, 2].sum() == 0
    # the type map agrees with the graph's types through the original ids
    nt, _ = types.nodes_per_type(sub.node)
    orig_n = torch.from_numpy(np.asarray(ids.orig_nids))
    assert torch.equal(nt, torch.from_numpy(g.node_type_ids()).long()[orig_n[sub.node]])
    assert OffsetTypeMap.from_graph(g).node_types == types.node_types


def test_out_of_range_seed(tmp_path: Path) -> None:
    book, local, _ = partitioned(tmp_path, random_graph())
    with pytest.raises(ArgumentError, match="seeds"):
        DistOneHopSampler(None, book, local).sample_one_hop(
            torch.tensor([book.num_nodes]), torch.tensor([1]), seed=0
        )


def test_structure_queries_match_the_original_graph(tmp_path: Path) -> None:
    g = random_graph()
    book, local, ids = partitioned(tmp_path, g)
    dist = DistOneHopSampler(None, book, local)
    new_n = torch.from_numpy(np.asarray(ids.new_nids))
    new_e = torch.from_numpy(np.asarray(ids.new_eids))
    orig = torch.arange(g.num_nodes)
    assert torch.equal(dist.in_degrees(new_n[orig]), torch.from_numpy(g.in_degrees()))
    assert torch.equal(dist.out_degrees(new_n[orig]), torch.from_numpy(g.out_degrees()))
    e = torch.tensor([0, 17, g.num_edges - 1])
    src, dst = dist.find_edges(new_e[e])
    assert torch.equal(src, new_n[torch.from_numpy(g.src)[e]])
    assert torch.equal(dst, new_n[torch.from_numpy(g.dst)[e]])
    with pytest.raises(ArgumentError, match="eids"):
        dist.find_edges(torch.tensor([g.num_edges]))
