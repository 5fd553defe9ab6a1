"""A heterograph's DistEmbedding per node type, on a live graph: rows of each type's new
nodes, looked up by their id, trained with SparseAdam and saved (issue 42)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphrun.distributed import DistGraph, DistNodeDataLoader, initialize
from graphrun.errors import ArgumentError
from graphrun.names import PolicyName
from graphrun.store.embedding import DistEmbedding, SparseAdam
from graphrun.store.live import GROWTH_BLOCK
from graphrun.store.server import ServerConfig
from graphrun.testing.store import make_partition_dir, store_threads
from graphrun.train.models import HeteroGNN
from tests.distributed.test_live_hetero import SAMPLING, write_new_nodes

pytestmark = pytest.mark.integration

INIT = {"low": -0.1, "high": 0.1, "seed": 5}
DIM = 4


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return make_partition_dir(tmp_path_factory.mktemp("hemb") / "parts", 2, hetero=True)[1]


def per_type(client, book) -> dict[str, DistEmbedding]:
    """A DistEmbedding per node type, its rows the type's ids (``node:<type>``)."""
    args = INIT
    out = {}
    for t in book.node_types:
        num = book.num_nodes_of(t)
        out[t] = DistEmbedding(client, num, DIM, f"emb_{t}", policy=PolicyName.node(t),
                               init_args=args)  # fmt: skip
    return out


def drawn(ids: np.ndarray, n: int) -> np.ndarray:
    """The initialiser's first value of new nodes' rows: their growth block's draw."""
    out = []
    for o in (ids - n).tolist():
        rng = np.random.default_rng([INIT["seed"], 1 + o // GROWTH_BLOCK])
        out.append(rng.uniform(-0.1, 0.1, (GROWTH_BLOCK, DIM)).astype(np.float32)[o % GROWTH_BLOCK])
    return np.asarray(out)


def test_a_heterographs_embedding_per_type_holds_trains_and_saves_new_nodes_rows(parts):
    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
            dg = DistGraph(ctx, follow="epoch")
            book, n = dg.book, dg.num_nodes()
            embs = per_type(ctx.client, book)
            opt = SparseAdam(list(embs.values()), lr=0.05)
            torch.manual_seed(0)
            model = HeteroGNN({"author": 4 + DIM, "paper": 8 + DIM}, book.edge_types, 16, 3, 2,
                              "paper")  # fmt: skip
            loader = DistNodeDataLoader(dg, dg.mask_ids("train_mask", "paper"), [4, 4],
                                        ntype="paper", batch_size=8, shuffle=True,
                                        live_seeds="train_mask")  # fmt: skip

            def epoch() -> list[int]:
                seeds: list[int] = []
                for b in loader:
                    x = {t: torch.cat([b[t].x, embs[t](b[t].n_id)], 1) for t in b.node_types}
                    out = model(x, b.edge_index_dict, b.num_sampled_nodes_dict,
                                b.num_sampled_edges_dict)[: b["paper"].batch_size]  # fmt: skip
                    torch.nn.functional.cross_entropy(out, b["paper"].y[: len(out)]).backward()
                    opt.step()
                    opt.zero_grad()
                    seeds += b["paper"].n_id[: len(out)].tolist()
                return seeds

            assert max(epoch()) < n
            new = write_new_nodes(addresses, parts)
            papers, author = new["papers"], new["author"]
            with pytest.raises(ArgumentError, match="is not an id of the graph"):
                embs["paper"](torch.from_numpy(papers))  # version 0 until the next epoch
            dg.refresh("epoch")
            with torch.no_grad():
                first = {"paper": embs["paper"](torch.from_numpy(papers)).numpy(),
                         "author": embs["author"](torch.from_numpy(author)).numpy()}  # fmt: skip
            # a new node's row in its type's table is its id's, drawn as its block's
            assert first["paper"].tolist() == drawn(papers, n).tolist()
            assert first["author"].tolist() == drawn(author, n).tolist()
            # a new node's id is refused in another type's table (it made a row there)
            with pytest.raises(ArgumentError, match="not a node of type 'author'"):
                embs["author"](torch.from_numpy(papers[:1]))
            seeds = epoch()
            assert set(papers[:3].tolist()) <= set(seeds)
            with torch.no_grad():
                after = embs["paper"](torch.from_numpy(papers)).numpy()
            # SparseAdam stepped the new papers' rows (the seeds', at least) in their table
            # (a row whose gradient was all zero — a dead ReLU — keeps its value)
            steps = ctx.client.pull("emb_paper.adam.step", papers)
            assert (steps[:3] >= 1).all()
            assert (after[:3] != first["paper"][:3]).any(axis=1).sum() >= 2
            # saved as a script saves a following job's rows: each type's new nodes' rows
            ids, types = ctx.client.live_nodes()
            mine = {t: ids[types == book.ntype_id(t)] for t in book.node_types}
            assert mine["paper"].tolist() == sorted(papers.tolist())
            saved = {t: (embs[t].weight[mine[t]], opt.rows(mine[t], embs[t])) for t in mine}
            # each table's own states only (``rows(ids)`` pulled every table's at ids)
            assert set(saved["author"][1]) == {f"emb_author.adam.{k}" for k in ("m", "v", "step")}
        with initialize(addresses, job="resumed", rank=0, world_size=1,
                        heartbeat_interval=0) as ctx:  # fmt: skip
            DistGraph(ctx, follow="head")
            again = per_type(ctx.client, book)
            opt2 = SparseAdam(list(again.values()), lr=0.05)
            for t, (rows, states) in saved.items():
                again[t].weight[mine[t]] = rows
                opt2.load_rows(mine[t], states)
                assert torch.equal(again[t].weight[mine[t]], rows)
                for k, v in states.items():
                    assert torch.equal(torch.as_tensor(ctx.client.pull(k, mine[t])), v)


def test_a_hetero_jobs_embedding_checkpoint_holds_each_types_new_rows(parts):
    """A GraphJob's embedding with a table per node type (``StoreEmbedding`` of
    ``{ntype: rows}``) saves each table's rows and its own type's new nodes' rows with
    their optimizer states, and a job resumed on the same store writes them back (it
    was one homogeneous table: a hetero job had none to save per type)."""
    from graphrun.train.distdata import StoreEmbedding

    cfg = ServerConfig(parts, 0, extensions=SAMPLING)
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        new = write_new_nodes(addresses, parts)
        mine = {"paper": new["papers"], "author": new["author"]}
        with initialize(addresses, job="first", rank=0, world_size=1,
                        heartbeat_interval=0) as ctx:  # fmt: skip
            book = DistGraph(ctx, follow="head").book
            nums = {t: book.num_nodes_of(t) for t in book.node_types}
            se = StoreEmbedding(ctx.client, "emb", nums, DIM, lr=0.05)
            for _ in range(2):
                for t, ids in mine.items():
                    se(torch.from_numpy(np.concatenate([[0, 1], ids])), t).sum().backward()
                se.step()
                se.zero_grad()
            state = se.state()
            assert set(state["types"]) == set(mine)
            for t, ids in mine.items():
                assert state["types"][t]["new_ids"].tolist() == sorted(ids.tolist())
                assert set(state["types"][t]["new_optimizer"]) == {
                    f"emb_{t}.adam.{k}" for k in ("m", "v", "step")
                }
            want = {t: {k: ctx.client.pull(f"emb_{t}.adam.{k}", ids) for k in ("m", "v", "step")}
                    for t, ids in mine.items()}  # fmt: skip
            assert all((w["step"] == 2).all() for w in want.values())
            rows = {t: se.table(t).weight[ids] for t, ids in mine.items()}
            base = {t: se.table(t).weight[np.arange(n)] for t, n in nums.items()}
        with initialize(addresses, job="resumed", rank=0, world_size=1,
                        heartbeat_interval=0) as ctx:  # fmt: skip
            DistGraph(ctx, follow="head")
            other = StoreEmbedding(ctx.client, "other", {"paper": nums["paper"]}, DIM, lr=0.05)
            with pytest.raises(ArgumentError, match=r"checkpoint's tables \['author', 'paper'\] "
                               r"are not this job's \['paper'\]"):  # fmt: skip
                other.load_state(state)
            again = StoreEmbedding(ctx.client, "emb", nums, DIM, lr=0.05)
            assert not torch.equal(again.table("paper").weight[mine["paper"]], rows["paper"])
            again.load_state(state)
            for t, ids in mine.items():
                assert torch.equal(again.table(t).weight[ids], rows[t])
                assert torch.equal(again.table(t).weight[np.arange(nums[t])], base[t])
                for k, v in want[t].items():
                    assert np.array_equal(ctx.client.pull(f"emb_{t}.adam.{k}", ids), v)
            with pytest.raises(ArgumentError, match="no embedding table of node type None"):
                again(torch.as_tensor([0]))
