"""A job following a live graph looks up and trains DistEmbedding rows of new nodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.nn import GraphSAGE

from graphrun.distributed import DistGraph, DistNodeDataLoader, initialize
from graphrun.errors import ArgumentError
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.embedding import DistEmbedding, SparseAdam
from graphrun.store.live import GROWTH_BLOCK
from graphrun.store.server import ServerConfig
from graphrun.testing.store import make_partition_dir, store_threads
from tests.distributed.test_live_follow import write_new_nodes

pytestmark = pytest.mark.integration

INIT = {"low": -0.1, "high": 0.1, "seed": 3}


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return make_partition_dir(tmp_path_factory.mktemp("emb") / "parts", 2)[1]


def test_a_job_following_epochs_trains_embedding_rows_of_new_nodes(parts):
    cfg = ServerConfig(parts, 0, extensions=("graphrun.sampling.server:register",))
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        with initialize(addresses, rank=0, world_size=1, heartbeat_interval=0) as ctx:
            dg = DistGraph(ctx, follow="epoch")
            n = dg.num_nodes()
            emb = DistEmbedding(ctx.client, n, 4, "emb", init="uniform", init_args=INIT)
            opt = SparseAdam([emb], lr=0.05)
            model = GraphSAGE(8 + 4, 16, num_layers=2, out_channels=16)  # > the labels
            loader = DistNodeDataLoader(dg, dg.mask_ids("train_mask"), [4, 4], batch_size=64,
                                        shuffle=True, live_seeds="train_mask")  # fmt: skip

            def epoch() -> torch.Tensor:
                seeds = []
                for b in loader:
                    h = torch.cat([b.x, emb(b.n_id)], 1)
                    out = model(h, b.edge_index)[: b.batch_size]
                    torch.nn.functional.cross_entropy(out, b.y[: b.batch_size]).backward()
                    opt.step()
                    opt.zero_grad()
                    seeds.append(b.n_id[: b.batch_size])
                return torch.cat(seeds)

            assert int(epoch().max()) < n
            _, _, ids = write_new_nodes(addresses, parts)
            with pytest.raises(ArgumentError, match="is not an id of the graph"):
                emb(ids)  # version 0 until the next epoch: no such node yet
            dg.refresh("epoch")
            with torch.no_grad():
                first = emb(ids).numpy()
            # each new row is the initialiser's draw for its growth block, wherever made
            off = ids - n
            for i, o in enumerate(off.tolist()):
                rng = np.random.default_rng([INIT["seed"], 1 + o // GROWTH_BLOCK])
                block = rng.uniform(-0.1, 0.1, (GROWTH_BLOCK, 4)).astype(np.float32)
                assert first[i].tolist() == block[o % GROWTH_BLOCK].tolist()
            seeds = epoch()
            assert set(ids.tolist()) <= set(seeds.tolist())
            with torch.no_grad():
                after = emb(ids).numpy()
            # SparseAdam stepped every new row (a row whose gradient was all zero — a dead
            # ReLU — keeps its value) and their own rows moved, through both partitions
            assert (ctx.client.pull("emb.adam.step", ids) >= 1).all()
            assert (after != first).any(axis=1).sum() >= 3
            assert {int(ctx.client.live.node_owner[o // GROWTH_BLOCK]) for o in off} == {0, 1}
            # a client of the job that does not follow the graph knows no new row
            other = KVClient(ClientConfig(addresses, job="default", timeout=20))
            with other, pytest.raises(ArgumentError, match="out of range"):
                other.pull("emb", ids)


def test_a_checkpoint_of_a_following_job_holds_its_new_nodes_rows(parts):
    """A following job's embedding checkpoint holds the new nodes' rows and optimizer
    state (it held the base rows only: a resumed job drew new nodes' rows afresh)."""
    from graphrun.train.distdata import StoreEmbedding

    cfg = ServerConfig(parts, 0, extensions=("graphrun.sampling.server:register",))
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        _, _, ids = write_new_nodes(addresses, parts)
        with initialize(addresses, job="first", rank=0, world_size=1,
                        heartbeat_interval=0) as ctx:  # fmt: skip
            DistGraph(ctx, follow="head")
            n = ctx.client.book.num_nodes  # the base graph's: new nodes' rows grow past it
            se = StoreEmbedding(ctx.client, "emb", n, 4, lr=0.05)
            for _ in range(2):
                se(torch.from_numpy(np.concatenate([[0, 1, 500], ids]))).sum().backward()
                se.step()
                se.zero_grad()
            state = se.state()
            assert state["new_ids"].tolist() == sorted(ids.tolist())
            want = {k: ctx.client.pull(f"emb.adam.{k}", ids) for k in ("m", "v", "step")}
            assert (want["step"] == 2).all()
            rows = se.emb.weight[ids]
        with initialize(addresses, job="resumed", rank=0, world_size=1,
                        heartbeat_interval=0) as ctx:  # fmt: skip
            DistGraph(ctx, follow="head")
            again = StoreEmbedding(ctx.client, "emb", n, 4, lr=0.05)
            assert not torch.equal(again.emb.weight[ids], rows)  # drawn afresh
            again.load_state(state)
            assert torch.equal(again.emb.weight[ids], rows)
            for k, v in want.items():
                assert np.array_equal(ctx.client.pull(f"emb.adam.{k}", ids), v)
