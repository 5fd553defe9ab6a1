"""A link loader following a live graph takes new edges of its type as positives and
draws negatives from new nodes too (issue 42); on a heterograph it refuses a new edge
of another type by name."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from graphrun.distributed import DistGraph, DistLinkDataLoader, initialize
from graphrun.distributed.batches import BatchBuilder
from graphrun.errors import ArgumentError
from graphrun.sampling.edgesplit import EdgeSplit
from graphrun.store.server import ServerConfig
from graphrun.testing.store import make_partition_dir, store_threads
from tests.distributed import test_live_follow
from tests.distributed.test_live_hetero import CITES, SAMPLING, WRITES, following

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def hparts(tmp_path_factory):
    return make_partition_dir(tmp_path_factory.mktemp("hlink") / "parts", 2, hetero=True)[1]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return make_partition_dir(tmp_path_factory.mktemp("link") / "parts", 2)[1]


@contextlib.contextmanager
def serving(parts, follow: str) -> Iterator[tuple[list[str], Any, DistGraph]]:
    """Two store threads of ``parts`` with the sampling extension, a context and a
    ``DistGraph`` following the graph (``follow``): (addresses, context, graph)."""
    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
            yield addresses, ctx, DistGraph(ctx, follow=follow)


def new_edges(dg: DistGraph, ends: np.ndarray, etype: int | None = None) -> np.ndarray:
    """The ids of the new in-edges of ``ends`` (of type index ``etype``), as sampled."""
    hop = dg.sample_neighbors(ends, 50)
    eids = hop.eid if etype is None else hop.eid[hop.etype == etype]
    eids = np.unique(eids[eids >= dg.book.num_edges])
    assert len(eids)
    return eids


def pairs(b, ends_of, label: int) -> set[tuple[int, int]]:
    """The labelled pairs of a batch as (source, destination) ids of their types."""
    src_ids, dst_ids, index, labels = ends_of(b)
    pick = index[:, labels == label]
    return set(zip(src_ids[pick[0]].tolist(), dst_ids[pick[1]].tolist(), strict=True))


def homo_ends(b):
    """A homogeneous batch's node ids (both ends') and labelled pairs, for :func:`pairs`."""
    return b.n_id, b.n_id, b.edge_label_index, b.edge_label


def test_a_link_loader_following_a_heterograph_takes_new_edges_and_new_negatives(hparts):
    """New ``cites`` edges into new papers are positives of a ``cites`` loader (their
    per-type id: their id; the book refused them, out of its range), and the negatives'
    destinations are drawn from the new papers too (the base papers only before)."""
    with following(hparts) as (_ctx, dg, new):
        book, papers = dg.book, new["papers"]
        cites = new_edges(dg, papers, book.etype_id(CITES))
        positives = np.concatenate([np.arange(4), cites])
        loader = DistLinkDataLoader(dg, positives, [4, 4], etype=CITES, batch_size=64,
                                    neg_k=40)  # fmt: skip
        (b,) = list(loader)
        p = b["paper"].n_id

        def ends(b):
            return p, p, b[CITES].edge_label_index, b[CITES].edge_label

        src, dst = dg.find_edges(positives, CITES)  # per-type ids of the end types
        assert pairs(b, ends, 1) == set(zip(src.tolist(), dst.tolist(), strict=True))
        negatives = {d for _, d in pairs(b, ends, 0)}
        assert negatives <= set(range(book.num_nodes_of("paper"))) | set(papers.tolist())
        assert negatives & set(papers.tolist())
        # a sampler worker builds the same batch at the trainer's version
        with DistLinkDataLoader(dg, positives, [4, 4], etype=CITES, batch_size=64, neg_k=40,
                                num_workers=1) as pool:  # fmt: skip
            (again,) = list(pool)
        assert torch.equal(again["paper"].n_id, p)
        assert torch.equal(again[CITES].edge_label_index, b[CITES].edge_label_index)


def test_a_link_loader_refuses_a_new_edge_of_another_type(hparts):
    """A ``cites`` loader given a new ``writes`` edge refuses it by name, at its
    construction and at a batch (a worker's builder): it took it as a ``cites`` edge
    before, or refused it as out of range."""
    with following(hparts) as (ctx, dg, new):
        writes = new_edges(dg, new["papers"], dg.book.etype_id(WRITES))
        other = f"edge {writes[0]} is a new edge of type 'author:writes:paper', not of "
        with pytest.raises(ArgumentError, match=other + "'paper:cites:paper'"):
            DistLinkDataLoader(dg, writes, [2], etype=CITES, batch_size=4)
        loader = DistLinkDataLoader(dg, writes, [2], etype=WRITES, batch_size=4)
        (b,) = list(loader)
        assert int(b[WRITES].edge_label.sum()) == len(writes)
        spec = DistLinkDataLoader(dg, [0], [2], etype=CITES, batch_size=4).spec
        with pytest.raises(ArgumentError, match=other):
            BatchBuilder(ctx, spec).build(torch.as_tensor(writes), 0)


@pytest.mark.parametrize("mode", ["uniform", "degree"])
def test_a_link_loader_following_a_graph_takes_new_edges_and_new_negatives(parts, mode):
    """The homogeneous loader alike: the new edges written after the loader was made are
    positives at the next epoch, and negatives are drawn from the new nodes as well."""
    with serving(parts, "epoch") as (addresses, _ctx, dg):
        n = dg.num_nodes()
        _, _, ids = test_live_follow.write_new_nodes(addresses, parts)
        dg.refresh("epoch")
        fresh = new_edges(dg, ids)
        loader = DistLinkDataLoader(dg, np.concatenate([np.arange(8), fresh]), [4, 4],
                                    batch_size=64, neg_k=100, neg_mode=mode,
                                    edge_split=EdgeSplit(0.0, 0.0))  # fmt: skip
        (b,) = list(loader)

        src, dst = dg.find_edges(np.concatenate([np.arange(8), fresh]))
        assert pairs(b, homo_ends, 1) == set(zip(src.tolist(), dst.tolist(), strict=True))
        negatives = {d for _, d in pairs(b, homo_ends, 0)}
        assert negatives <= set(range(n)) | set(ids.tolist())
        assert negatives & set(ids.tolist())
        # no edge joining a positive pair carries messages, new nodes' pairs included
        s, d = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
        joined = set(zip(s.tolist(), d.tolist(), strict=True))
        want = set(zip(src.tolist(), dst.tolist(), strict=True))
        assert not joined & (want | {(v, u) for u, v in want})


def test_a_positive_pair_with_a_new_node_keeps_other_edges_in_message_passing(parts):
    """A positive pair's key (``min * bound + max``) takes new nodes' ids into account:
    keyed by the base's count ``n``, the pair ``(0, n + c)`` of a new node ``n + c`` had
    the key of the pair ``(1, c)`` and kept the edge ``1 -> c`` out of the batch."""
    from graphrun.distributed.minibatch import MiniBatchSampler
    from graphrun.distributed.writer import GraphWriter
    from graphrun.sampling.fanout import ALL
    from graphrun.store.client import ClientConfig, KVClient

    with serving(parts, "head") as (addresses, ctx, dg):
        n = dg.num_nodes()
        _, _, ids = test_live_follow.write_new_nodes(addresses, parts)
        c = int((ids - n)[ids - n < n].max())  # a new node n + c, past its block's first
        assert c >= 2
        with KVClient(ClientConfig(addresses, job="writer", timeout=20)) as client:
            w = GraphWriter(client)
            w.add_edges("_E", [1], [c])
            w.commit()
        dg.refresh("batch")
        sampler = MiniBatchSampler(ctx, [ALL])
        got = sampler.links(torch.as_tensor([0, c + 1]), torch.as_tensor([n + c, c]), 0,
                            ("_N", "_E", "_N"), neg_k=0,
                            edge_split=EdgeSplit(0.0, 0.0))  # fmt: skip
        sub = got.sub
        edges = set(zip(sub.node[sub.row].tolist(), sub.node[sub.col].tolist(), strict=True))
        assert (1, c) in edges


@pytest.mark.parametrize("held_out", [0.0, 0.5])
def test_new_edges_of_its_type_join_a_link_loaders_positives_at_the_next_epoch(hparts, held_out):
    """With ``live_edges`` the new ``cites`` edges join the positives at the next epoch
    (not the new ``writes`` edges; with ``edge_split`` those of the training split
    only), and at the one after only those written since (the loader took no
    ``live_edges`` before)."""
    from graphrun.distributed.writer import GraphWriter
    from graphrun.sampling.edgesplit import TRAIN
    from graphrun.store.client import ClientConfig, KVClient
    from tests.distributed.test_live_hetero import write_new_nodes

    split = EdgeSplit(held_out, 0.0, seed=1)
    with serving(hparts, "epoch") as (addresses, _ctx, dg):
        cites = dg.book.etype_id(CITES)
        loader = DistLinkDataLoader(dg, np.arange(10), [2], etype=CITES, batch_size=64,
                                    live_edges=True, edge_split=split)  # fmt: skip
        assert sum(int(b[CITES].edge_label.sum()) for b in loader) == 10
        new = write_new_nodes(addresses, parts=hparts)
        (b,) = list(loader)
        fresh = new_edges(dg, new["papers"], cites)
        src, dst = dg.find_edges(fresh)
        want = fresh[(split.of(src, dst) == TRAIN).numpy()]
        assert sorted(loader.ids[10:].tolist()) == sorted(want.tolist())
        assert int(b[CITES].edge_label.sum()) == 10 + len(want)
        with KVClient(ClientConfig(addresses, job="writer", timeout=20)) as c:
            w = GraphWriter(c)
            w.add_edges(CITES, [int(new["papers"][0])] * 4, new["papers"].tolist(),
                        {"weight": np.ones(4, np.float32)})  # fmt: skip
            w.commit()
        list(loader)
        later = np.setdiff1d(new_edges(dg, new["papers"], cites), fresh)
        assert len(later) == 4
        src, dst = dg.find_edges(later)
        more = later[(split.of(src, dst) == TRAIN).numpy()]
        assert sorted(loader.ids[10 + len(want) :].tolist()) == sorted(more.tolist())
        if held_out:
            assert len(want) + len(more) < len(fresh) + len(later)


def test_a_link_loader_made_after_a_compaction_takes_the_folded_new_edges(tmp_path):
    """New edges folded into the base by a compaction (into new papers: the folded
    growth; into base papers: the base CSC) are still new edges a ``live_edges`` loader
    asks for from the start; one deleted since is not."""
    from graphrun.distributed.writer import GraphWriter
    from graphrun.store.client import ClientConfig, KVClient
    from tests.distributed.test_live_hetero import write_new_nodes
    from tests.store.test_compact import compact

    _, hparts = make_partition_dir(tmp_path / "parts", 2, hetero=True)
    cfg = ServerConfig(hparts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        new = write_new_nodes(addresses, parts=hparts)
        papers = [int(p) for p in new["papers"]]
        with KVClient(ClientConfig(addresses, job="writer", timeout=20)) as c:
            w = GraphWriter(c)  # a new paper cites two base papers
            base = c.book.to_homo("paper", np.asarray([0, 1]))
            w.add_edges(CITES, [papers[0]] * 2, base, {"weight": np.ones(2, np.float32)})
            w.commit()
            with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
                dg = DistGraph(ctx, follow="epoch")
                cites = dg.book.etype_id(CITES)
                into_new = new_edges(dg, np.asarray(papers), cites)
                into_base = new_edges(dg, base, cites)
                assert len(into_new) == 8 and len(into_base) == 2
                for p in (0, 1):
                    ctx.client.session.call(p, "heartbeat")
                stats = [compact(c, p) for p in (0, 1)]  # partition 0 holds every piece
                assert max(st["version"] for st in stats) == 2
                w.delete_edges(CITES, into_new[:1])
                w.commit()
                loader = DistLinkDataLoader(dg, np.arange(3), [2], etype=CITES, batch_size=64,
                                            live_edges=True)  # fmt: skip
                list(loader)
                want = np.concatenate([into_new[1:], into_base])
                assert sorted(loader.ids[3:].tolist()) == sorted(want.tolist())


def test_a_trainers_link_data_following_a_graph_takes_the_new_training_edges(parts):
    """The trainer's DistGraphData (what a live link-prediction GraphJob drives): at the
    epoch after new edges were written its training positives, and so its steps, hold
    those of the training split (they were the base's only)."""
    from graphrun.sampling.edgesplit import TRAIN
    from graphrun.train.distdata import DistGraphData

    split = EdgeSplit(0.2, 0.2, seed=3)
    with serving(parts, "epoch") as (addresses, _ctx, dg):
        data = DistGraphData(dg, 0, 1)
        before = data.edges("train", split).numel()
        first = list(data.link_loader("train", [2], 512, 1, True, 0, "feat", split))
        assert sum(b.seeds for b in first) == before
        _, _, ids = test_live_follow.write_new_nodes(addresses, parts)
        batches = data.link_loader("train", [2], 512, 1, True, 1, "feat", split)
        dg.refresh("epoch")
        fresh = new_edges(dg, ids)
        src, dst = dg.find_edges(fresh)
        want = fresh[(split.of(src, dst) == TRAIN).numpy()]
        assert 0 < len(want) < len(fresh)
        mine = data.edges("train", split)
        assert sorted(mine[before:].tolist()) == sorted(want.tolist())
        assert sum(b.seeds for b in batches) == before + len(want)


def delete_edges(addresses: list[str], eids: object) -> None:
    """Delete edges ``eids`` of ``_E`` through a writer, committed."""
    from graphrun.distributed.writer import GraphWriter
    from graphrun.store.client import ClientConfig, KVClient

    with KVClient(ClientConfig(addresses, job="writer", timeout=20)) as c:
        w = GraphWriter(c)
        w.delete_edges("_E", eids)
        w.commit()


def test_a_positive_deleted_since_is_left_out_of_its_batch(parts):
    """Positives deleted by a batch's version (a base edge and a new one) are left out of
    it, the others kept (the owner refused the batch's look-up of their ends before)."""

    with serving(parts, "epoch") as (addresses, ctx, dg):
        _, _, ids = test_live_follow.write_new_nodes(addresses, parts)
        dg.refresh("epoch")
        fresh = new_edges(dg, ids)
        positives = np.concatenate([np.arange(8), fresh])
        src, dst = dg.find_edges(positives)
        loader = DistLinkDataLoader(dg, positives, [2], batch_size=64, neg_k=1)
        gone = DistLinkDataLoader(dg, [2, int(fresh[0])], [2], batch_size=64, neg_k=1)
        assert int(next(iter(loader)).edge_label.sum()) == len(positives)
        delete_edges(addresses, [2, int(fresh[0])])
        dg.refresh("epoch")  # a batch at the head (a loader's epoch leaves them out first)
        b = BatchBuilder(ctx, loader.spec).link_batch(torch.from_numpy(positives), 0)

        kept = ~np.isin(positives, [2, fresh[0]])
        want = set(zip(src[kept].tolist(), dst[kept].tolist(), strict=True))
        assert pairs(b, homo_ends, 1) == want
        assert len(b.edge_label) == 2 * kept.sum()
        empty = BatchBuilder(ctx, gone.spec).link_batch(gone.ids, 0)  # every one deleted:
        assert len(empty.edge_label) == 0  # a batch of none


def test_positives_deleted_at_an_epochs_version_leave_its_steps(parts):
    """Positives deleted through a GraphWriter (base edges and a new one) leave a link
    loader's positives at the next epoch's start: ``len(loader)`` counts the batches the
    epoch serves, and none of them holds a deleted one (each batch left them out, but
    the epoch's steps counted them: a trainer's agreed steps ran past its batches)."""

    with serving(parts, "epoch") as (addresses, _ctx, dg):
        _, _, ids = test_live_follow.write_new_nodes(addresses, parts)
        dg.refresh("epoch")
        fresh = new_edges(dg, ids)
        positives = np.concatenate([np.arange(40), fresh])
        src, dst = dg.find_edges(positives)
        loader = DistLinkDataLoader(dg, positives, [2], batch_size=8, neg_k=1, shuffle=True)
        assert len(list(loader)) == len(loader) == -(-len(positives) // 8)
        gone = np.concatenate([np.arange(20), fresh[:1]])
        delete_edges(addresses, gone)
        loader.set_epoch(1)
        loader.begin_epoch()  # as a trainer does, to agree the epoch's steps
        kept = ~np.isin(positives, gone)
        assert sorted(loader.ids.tolist()) == sorted(positives[kept].tolist())
        batches = list(loader)
        assert len(batches) == len(loader) == -(-int(kept.sum()) // 8)
        served = set().union(*(pairs(b, homo_ends, 1) for b in batches))
        assert served == set(zip(src[kept].tolist(), dst[kept].tolist(), strict=True))
        assert sum(int(b.edge_label.sum()) for b in batches) == kept.sum()


def test_a_head_following_link_loader_serves_its_steps_when_positives_go_mid_epoch(parts):
    """``follow="head"``: positives deleted after the epoch began leave the batch that
    reads them at the head, and the epoch still serves the steps counted at its start
    (a trainer agreed them with the others: each step is a collective). A batch whose
    every positive was deleted is a batch of none, and link prediction's loss on it is
    0 with zero gradients (it was NaN: the mean of no pairs)."""
    from types import SimpleNamespace

    from graphrun.train.models import LinkPredictor
    from graphrun.train.tasks import LinkPrediction

    with serving(parts, "head") as (addresses, _ctx, dg):
        loader = DistLinkDataLoader(dg, np.arange(16), [2], batch_size=8, neg_k=1)
        loader.begin_epoch()
        assert len(loader) == 2
        batches = iter(loader)
        assert int(next(batches).edge_label.sum()) == 8
        delete_edges(addresses, np.arange(8, 16))  # the second batch's every positive
        last = next(batches)
        assert next(batches, None) is None and len(last.edge_label) == 0
        model = LinkPredictor(3, 4, 1)
        scores = lambda m, b: m(torch.ones(len(b.data.n_id), 3), b.data.edge_index,  # noqa: E731
                                b.data.edge_label_index)  # fmt: skip
        loss, _, counted = LinkPrediction.loss(SimpleNamespace(_scores=scores), model,
                                               SimpleNamespace(data=last))  # fmt: skip
        loss.backward()
        assert loss.item() == 0.0 and counted == 0
        assert all(p.grad is None or not p.grad.any() for p in model.parameters())
