"""A job that follows a live heterograph sees new nodes of each type and trains on the
target type's (issue 42)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from graphrun.distributed import DistGraph, DistNodeDataLoader, initialize
from graphrun.distributed.live import LiveNodeTypes, LiveTypeMap
from graphrun.distributed.writer import GraphWriter
from graphrun.errors import ArgumentError
from graphrun.partition import load_id_mapping
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.server import ServerConfig
from graphrun.testing.store import make_partition_dir, store_threads
from graphrun.train.models import HeteroGNN

pytestmark = pytest.mark.integration

PAPERS = 10**9 + np.arange(4)  # three with train_mask, the last without
AUTHOR = 10**9 + 10
SAMPLING = ("graphrun.sampling.server:register",)
WRITES, CITES = ("author", "writes", "paper"), ("paper", "cites", "paper")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return make_partition_dir(tmp_path_factory.mktemp("hfollow") / "parts", 2, hetero=True)[1]


def write_new_nodes(addresses, parts) -> dict[str, np.ndarray]:
    """Four new papers and a new author who wrote them; base papers cite the new ones and
    a base author follows the new one. Their rows and graph ids."""
    book_orig = load_id_mapping(parts).orig_nids
    with KVClient(ClientConfig(addresses, job="writer", timeout=20)) as c:
        book = c.book
        paper_feat = np.arange(4 * 8, dtype=np.float32).reshape(4, 8) + 1000
        author_feat = np.full((1, 4), -3.0, np.float32)
        label = np.asarray([0, 1, 2, 1])
        w = GraphWriter(c)
        mask = np.asarray([True, True, True, False])
        w.add_nodes("paper", PAPERS, {"feat": paper_feat, "train_mask": mask}, label=label)
        w.add_nodes("author", [AUTHOR], {"feat": author_feat})
        w.add_edges("writes", np.full(4, AUTHOR), PAPERS, orig=True)
        base_papers = book_orig[book.to_homo("paper", np.asarray([0, 7]))]
        src = np.repeat(base_papers, 4)
        w.add_edges("cites", src, np.tile(PAPERS, 2), {"weight": np.ones(8, np.float32)},
                    orig=True)  # fmt: skip
        w.add_edges("follows", book_orig[book.to_homo("author", np.asarray([2]))], [AUTHOR],
                    orig=True)  # fmt: skip
        w.commit()
        return {
            "papers": w.lookup(PAPERS), "author": w.lookup([AUTHOR]),
            "paper_feat": paper_feat, "author_feat": author_feat, "label": label,
        }  # fmt: skip


@pytest.mark.parametrize("follow", ["epoch", "pinned"])
def test_a_job_following_a_heterograph_trains_on_new_nodes_of_its_target_type(parts, follow):
    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
            dg = DistGraph(ctx, follow=follow)
            train = dg.mask_ids("train_mask", "paper")
            loader = DistNodeDataLoader(dg, train, [4, 4], ntype="paper", batch_size=8,
                                        shuffle=True, live_seeds="train_mask")  # fmt: skip
            first = torch.cat([b["paper"].n_id[: b["paper"].batch_size] for b in loader])
            assert sorted(first.tolist()) == sorted(train.tolist())
            new = write_new_nodes(addresses, parts)
            papers, author = new["papers"].tolist(), int(new["author"][0])
            model = HeteroGNN({"author": 4, "paper": 8}, dg.book.edge_types, 16, 3, 2, "paper")
            seen: list[int] = []
            met_author = False
            for b in loader:  # the next epoch
                p = b["paper"]
                seeds = p.n_id[: p.batch_size]
                fresh = seeds >= dg.num_nodes()
                seen += seeds[fresh].tolist()
                # every new node in the batch is of its type, its rows pulled by it
                for k, i in enumerate(p.n_id.tolist()):
                    if i in papers:
                        assert p.x[k].tolist() == new["paper_feat"][papers.index(i)].tolist()
                        assert int(p.y[k]) == int(new["label"][papers.index(i)])
                a_ids = b["author"].n_id.tolist()
                if author in a_ids:
                    met_author = True
                    at = a_ids.index(author)
                    assert b["author"].x[at].tolist() == new["author_feat"][0].tolist()
                    # the new author's edges to its papers were sampled as ``writes``
                    src, dst = b[WRITES].edge_index
                    wrote = {int(p.n_id[d]) for s, d in zip(src, dst, strict=True) if s == at}
                    assert wrote and wrote <= set(papers)
                if fresh.any():
                    # a base paper's citation of a new one: a ``cites`` edge into it
                    cited = {int(p.n_id[d]) for d in b[CITES].edge_index[1].tolist()}
                    assert set(seeds[fresh].tolist()) <= cited
                    x = {t: b[t].x for t in b.node_types}
                    out = model(x, b.edge_index_dict, b.num_sampled_nodes_dict,
                                b.num_sampled_edges_dict)[: p.batch_size]  # fmt: skip
                    loss = torch.nn.functional.cross_entropy(out, p.y[: p.batch_size])
                    loss.backward()
                    assert torch.isfinite(loss)
            if follow == "pinned":
                assert seen == [] and dg.version == 0 and not met_author
            else:
                assert sorted(seen) == sorted(papers[:3]) and dg.version == 1
                assert met_author


def asked(client: KVClient) -> int:
    """Bytes of ``live_nodes`` answers the client got so far."""
    return sum(n for (_, op), n in client.traffic.items() if op == "live_nodes")


def test_new_nodes_types_are_asked_when_a_look_up_misses_and_only_the_new_ones(parts):
    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
            client, book = ctx.client, ctx.book
            dg = DistGraph(ctx, follow="head")
            new = write_new_nodes(addresses, parts)
            table = LiveNodeTypes(client)
            types = LiveTypeMap(book, table)
            ids = torch.as_tensor(np.concatenate([new["papers"], new["author"], [3]]))
            types.nodes_per_type(ids[-1:])  # a base node: nothing asked
            assert table.version is None and asked(client) == 0
            dg.refresh("batch")
            t, per = types.nodes_per_type(ids)
            base_t, base_per = book.to_per_type(np.asarray([3]))
            assert t.tolist() == [1] * 4 + [0] + base_t.tolist()  # paper, author
            assert per[:5].tolist() == ids[:5].tolist()  # a new node's per-type id: its id
            assert per[5] == base_per[0]
            assert table.version == 1
            first = asked(client)
            assert first > 0
            with KVClient(ClientConfig(addresses, job="writer", timeout=20)) as c:
                w = GraphWriter(c)
                w.add_nodes("author", [AUTHOR + 1], {"feat": np.zeros((1, 4), np.float32)})
                w.commit()
                (later,) = w.lookup([AUTHOR + 1]).tolist()
            dg.refresh("batch")  # version 2: the nodes known still need no request
            types.nodes_per_type(ids)
            assert asked(client) == first and table.version == 1
            # one it does not hold: the nodes added since version 1 are asked, no more
            assert client.live_nodes(since=1)[0].tolist() == [later]
            before = asked(client)
            assert types.nodes_per_type(torch.as_tensor([later]))[0].tolist() == [0]
            assert asked(client) - before < first and table.version == 2
            with pytest.raises(ArgumentError, match="not a node of the live graph at version 2"):
                table.of(np.asarray([later + 1]))
            # a per-type id of the type's base space past its count is refused, as before
            with pytest.raises(ArgumentError, match="per_type_ids"):
                loader = DistNodeDataLoader(dg, [book.num_nodes_of("paper")], [2, 2],
                                            ntype="paper", batch_size=4)  # fmt: skip
                next(iter(loader))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_trainers_data_follows_a_heterograph_and_its_epochs_take_the_new_papers(
    parts, num_workers
):
    """The trainer's DistGraphData (what spec.live drives for hetero-node-classification,
    with a feature cache; batches built in the trainer or in a sampler worker, which asks
    the new nodes' types itself): the second epoch's batches hold the papers written after
    the first, their rows and labels, and the new author's row where it was sampled."""
    from graphrun.train.distdata import DistGraphData

    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
            dg = DistGraph(ctx, follow="epoch")
            data = DistGraphData(dg, 0, 1, num_workers=num_workers, cache_mb=64)
            n = data.num_nodes()
            first = [b.data["paper"] for b in data.loader("train", "paper", [4, 4], 8, True, 0)]
            assert int(torch.cat([p.n_id[: p.batch_size] for p in first]).max()) < n
            before = len(data.seeds("train", "paper"))
            new = write_new_nodes(addresses, parts)
            batches = data.loader("train", "paper", [4, 4], 8, True, 1)
            # the epoch began with its loader: the new seeds count before its first batch
            # (a trainer agrees the epoch's steps from them; they were left out)
            assert len(data.seeds("train", "paper")) == before + 3
            second = [b.data for b in batches]
            assert len(second) == -(-(before + 3) // 8)
            seeds = torch.cat([b["paper"].n_id[: b["paper"].batch_size] for b in second])
            assert sorted(seeds[seeds >= n].tolist()) == sorted(new["papers"][:3].tolist())
            y = torch.cat([b["paper"].y[: b["paper"].batch_size] for b in second])
            assert sorted(y[seeds >= n].tolist()) == sorted(new["label"][:3].tolist())
            author = int(new["author"][0])
            rows = [b["author"].x[b["author"].n_id == author] for b in second]
            assert any(len(r) for r in rows)
            assert all(r.tolist() == new["author_feat"].tolist() for r in rows if len(r))


@contextlib.contextmanager
def following(parts) -> Iterator[tuple[Any, DistGraph, dict[str, np.ndarray]]]:
    """Two store threads, a context, the new nodes written (:func:`write_new_nodes`) and a
    ``DistGraph`` that follows the graph at epoch boundaries."""
    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
            new = write_new_nodes(addresses, parts)
            yield ctx, DistGraph(ctx, follow="epoch"), new


def test_a_following_heterograph_answers_new_nodes_and_edges_by_per_type_id(parts):
    """DistGraph's typed structure calls take a new node's (edge's) per-type id, its id:
    degrees of new papers, the ends of a new ``cites`` edge as per-type ids, and one hop
    sampled per relation into them."""
    with following(parts) as (_ctx, dg, new):
        book, papers = dg.book, new["papers"]
        # each new paper: cited by two base papers, written by the new author
        assert dg.in_degrees(papers, "paper").tolist() == [3] * 4
        # the new author's out-edges: on one partition, none on the other (which holds
        # nothing visible: it answered "out of range" before)
        assert dg.out_degrees(new["author"], "author").tolist() == [4]
        hop = dg.sample_neighbors(papers, {WRITES: 5, CITES: 5, "follows": 5})
        assert sorted(hop.etype.tolist()) == [0] * 4 + [1] * 8  # writes, cites
        cites = np.unique(hop.eid[hop.etype == 1])
        assert (cites >= book.num_edges).all()
        src, dst = dg.find_edges(cites, CITES)  # per-type ids of the end types
        assert set(dst.tolist()) == set(papers.tolist())
        assert (src < book.num_nodes_of("paper")).all()
        with pytest.raises(ArgumentError):  # past the base cites and not a new edge
            dg.find_edges([book.num_edges - 1], CITES)


def edge_types_asked(client: KVClient) -> int:
    """Bytes of ``graph_edge_types`` answers the client got so far."""
    return sum(n for (_, op), n in client.traffic.items() if op == "graph_edge_types")


def test_a_new_edges_type_is_known_by_its_id_and_typed_calls_refuse_another_type(parts):
    """A new edge's type from its id alone is the one its batch gave it (the type map gave
    every new edge the first edge type), asked of its owner once and then held; a typed
    ``find_edges`` refuses a new edge of another type, and a loader of ``ntype`` (or a
    typed degree) a new node of another type, by name (both took any new id before)."""
    from graphrun.distributed.minibatch import MiniBatchSampler

    with following(parts) as (ctx, dg, new):
        book, author = dg.book, int(new["author"][0])
        ends = np.concatenate([new["papers"], new["author"]])
        hop = dg.sample_neighbors(ends, {WRITES: 5, CITES: 5, "follows": 5})
        eids, first = np.unique(hop.eid, return_index=True)
        want = hop.etype[first].tolist()  # the sampler's answer: writes, cites, follows
        assert sorted(set(want)) == [0, 1, 2] and (eids >= book.num_edges).all()
        t, per = dg.types.edges_per_type(torch.as_tensor(eids))
        assert t.tolist() == want and per.tolist() == eids.tolist()
        asked = edge_types_asked(ctx.client)
        assert asked > 0
        dg.types.edges_per_type(torch.as_tensor(eids[::-1].copy()))  # held: none asked
        assert edge_types_asked(ctx.client) == asked
        # the sampler's types, passed along, are taken as they are: none asked either
        known = torch.as_tensor(want)
        t, _ = dg.types.edges_per_type(torch.as_tensor(eids), known)
        assert t.tolist() == want and edge_types_asked(ctx.client) == asked
        writes = eids[np.asarray(want) == book.etype_id(WRITES)]
        src, dst = dg.find_edges(writes, WRITES)  # per-type ids of the end types
        assert set(src.tolist()) == {author} and set(dst.tolist()) <= set(ends.tolist())
        with pytest.raises(ArgumentError, match=f"edge {writes[0]} is a new edge of type "
                           "'author:writes:paper', not of 'paper:cites:paper'"):  # fmt: skip
            dg.find_edges(writes, CITES)
        other = f"node {author} is a new node of type 'author', not of 'paper'"
        with pytest.raises(ArgumentError, match=other):
            DistNodeDataLoader(dg, [0, author], [2], ntype="paper", batch_size=4)
        with pytest.raises(ArgumentError, match=other):
            dg.in_degrees([author], "paper")
        with pytest.raises(ArgumentError, match=other):  # a batch's seeds (a worker's)
            MiniBatchSampler(ctx, [2]).to_homo("paper", torch.as_tensor([author]))
        papers = DistNodeDataLoader(dg, new["papers"], [2], ntype="paper", batch_size=4)
        (b,) = list(papers)
        assert b["paper"].n_id[:4].tolist() == new["papers"].tolist()
