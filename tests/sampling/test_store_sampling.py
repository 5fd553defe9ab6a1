"""Distributed sampling against real store servers (processes on loopback)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from graphrun.errors import ArgumentError
from graphrun.local.stores import start_stores
from graphrun.partition import load_id_mapping, partition_graph
from graphrun.sampling import NeighborSampler
from graphrun.sampling.csc import csc_from_structure
from graphrun.sampling.distributed import OP, DistOneHopSampler
from graphrun.sampling.partitioned import BookTypeMap
from graphrun.store.client import ClientConfig, KVClient
from graphrun.testing.graphs import random_graph, random_hetero_graph

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def sample_all(client: KVClient, seeds: torch.Tensor, fanouts, seed: int):
    book = client.book
    sampler = NeighborSampler(
        DistOneHopSampler(client, book), BookTypeMap(book), book.num_nodes, fanouts, generator=seed
    )
    return sampler.sample(seeds)


@pytest.mark.parametrize("hetero", [False, True])
def test_remote_and_shared_memory_sampling_agree(tmp_path: Path, hetero: bool) -> None:
    g = random_hetero_graph() if hetero else random_graph()
    if not hetero:
        g.edata["_N:_E:_N"]["w"][::3] = 0.0  # never sampled by weighted sampling
    out = tmp_path / "parts"
    partition_graph(g, out, 2, method="random", seed=0)
    ids = load_id_mapping(out)
    fanouts = [{"writes": 3, "cites": 2, "follows": 1}] * 2 if hetero else [5, 3]
    with start_stores(out, 2) as stores:
        addrs = [s.address for s in stores]
        cfg = {"heartbeat_interval": 0}
        with (
            KVClient(ClientConfig(addrs, use_shm=False, **cfg)) as remote,
            KVClient(ClientConfig(addrs, use_shm=True, **cfg)) as local,
        ):
            assert remote.local_parts == [] and local.local_parts == [0, 1]
            book = remote.book
            seeds = torch.arange(0, book.num_nodes, 9)
            a = sample_all(remote, seeds, fanouts, seed=4)
            b = sample_all(local, seeds, fanouts, seed=4)
            for field in ("node", "row", "col", "edge"):
                assert torch.equal(getattr(a, field), getattr(b, field)), field
            # one partition here, one remote: the same edges in the same order
            here = {1: csc_from_structure(local.local_structure(1), book, 1)}
            fan = torch.tensor([2] * len(book.edge_types))
            one, mixed = (
                DistOneHopSampler(remote, book, local=lc).sample_one_hop(seeds, fan, seed=2)
                for lc in ({}, here)
            )
            for field in ("src", "seed_index", "eid"):
                assert np.array_equal(getattr(one, field), getattr(mixed, field)), field
            # without edge ids the servers send none: the same edges, every id NO_EDGE_ID
            got = []
            for edge_ids in (True, False):
                sampler = DistOneHopSampler(remote, book)
                sampler = sampler if edge_ids else sampler.without_edge_ids()
                before = remote.traffic[0, OP] + remote.traffic[1, OP]
                out = sampler.sample_one_hop(seeds, fan, seed=2)
                got.append((out, remote.traffic[0, OP] + remote.traffic[1, OP] - before))
            (with_ids, full), (no_ids, bare) = got
            assert np.array_equal(with_ids.eid, one.eid) and (no_ids.eid == -1).all()
            assert np.array_equal(no_ids.src, one.src) and bare <= full - 8 * len(one)
            # through the original ids, every sampled edge is in the original graph
            orig_n = torch.from_numpy(np.asarray(ids.orig_nids))
            orig_e = torch.from_numpy(np.asarray(ids.orig_eids))
            e = orig_e[a.edge]
            assert torch.equal(torch.from_numpy(g.src)[e], orig_n[a.node[a.row]])
            assert torch.equal(torch.from_numpy(g.dst)[e], orig_n[a.node[a.col]])
            if not hetero:  # weighted by an edge feature, remote and co-located agree
                outs = []
                for client in (remote, local):
                    one_hop = DistOneHopSampler(client, book, weight="w")
                    outs.append(
                        one_hop.sample_one_hop(seeds, torch.tensor([4]), weighted=True, seed=1)
                    )
                assert np.array_equal(outs[0].eid, outs[1].eid) and len(outs[0]) > 0
                w = g.edata["_N:_E:_N"]["w"][orig_e.numpy()[outs[0].eid]]
                assert (w > 0).all()
                with pytest.raises(ArgumentError, match="weighted"):
                    DistOneHopSampler(remote, book).sample_one_hop(
                        seeds, torch.tensor([4]), weighted=True, seed=1
                    )
            # a server refuses seeds it does not own, naming them
            p0 = book.owned_nodes(0)
            with pytest.raises(ArgumentError, match="seeds"):
                remote.session.call(
                    1,
                    OP,
                    {"fanout": [1] * len(book.edge_types), "seed": 0},
                    tensors=(np.array([p0[0]], dtype=np.int64),),
                )


def test_sampling_with_replacement_is_capped(tmp_path: Path) -> None:
    """10 seeds x fanout 1e6 with replacement made a 240 MB reply (server 620 MB larger)."""
    from graphrun.errors import ArgumentError
    from graphrun.sampling.distributed import OP

    out = tmp_path / "parts"
    partition_graph(random_graph(), out, 1, method="random", seed=0)
    with (
        start_stores(out, 1) as stores,
        KVClient(ClientConfig([stores[0].address], use_shm=False)) as c,
    ):
        seeds = np.arange(10, dtype=np.int64)
        body = {"fanout": [10**6], "replace": True, "weighted": False, "seed": 0}
        with pytest.raises(ArgumentError, match="at most 8388608 per request"):
            c.session.wait(c.session.request(0, OP, body, (seeds,)))
        body["fanout"] = [3]
        assert 0 < c.session.wait(c.session.request(0, OP, body, (seeds,))).body["count"] <= 30
        stores[0].check()
