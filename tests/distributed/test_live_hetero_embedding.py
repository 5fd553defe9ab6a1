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
