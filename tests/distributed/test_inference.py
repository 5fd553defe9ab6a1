"""Layer-wise inference on the running store: two trainers (threads, each its own
client) share the scratch tables and meet between layers; their outputs equal the
model on sampled neighbourhoods with every fanout -1."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from graphrun.distributed import DistGraph, initialize
from graphrun.train import inference
from graphrun.train.data import LocalData
from graphrun.train.distdata import DistGraphData
from graphrun.train.models import SAGE


def test_two_trainers_layerwise_equals_full_fanout_sampling(served) -> None:
    torch.manual_seed(0)
    model = SAGE(8, 16, 4, 2, 0.5).eval()
    meet = threading.Barrier(2, timeout=60)
    got: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    errors: list[BaseException] = []

    def trainer(rank: int) -> None:
        try:
            with initialize(served.servers, rank=rank, world_size=2, heartbeat_interval=0) as ctx:
                data = DistGraphData(DistGraph(ctx), rank, 2)
                ids = data.cover("train")
                out = inference.layerwise(model, data, "_N", "feat", ids, 64, meet.wait)
                want = []
                with torch.no_grad():
                    for batch in data.loader("train", None, [-1, -1], 64, False, 0):
                        d = batch.data
                        y = model(d.x, d.edge_index, d.num_sampled_nodes, d.num_sampled_edges)
                        want.append(y[: int(d.batch_size)])
                got[rank] = (ids, out, torch.cat(want))
                data.close()
        except BaseException as exc:
            errors.append(exc)
            meet.abort()

    threads = [threading.Thread(target=trainer, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    # every training node evaluated by exactly one trainer
    ids = torch.cat([got[r][0] for r in range(2)])
    n_train = int(served.graph.ndata["_N"]["train_mask"].sum())
    assert ids.numel() == n_train == ids.unique().numel()
    for r in range(2):
        _, out, want = got[r]
        # the training loader's seeds are the covered ones, padded to equal counts
        assert want.size(0) >= out.size(0) > 0
        torch.testing.assert_close(out, want[: out.size(0)], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("world", [2, 1])
def test_sage_reads_the_co_located_partition_in_place_and_equals_one_machine(
    served, monkeypatch, world
) -> None:
    # each trainer reads its home partition's rows from the server's shared memory by id
    # and pulls only the others: no batch's rows copied out (gather), and the logits those
    # of the layer-wise pass on one machine over the unpartitioned graph. One trainer
    # covers both partitions: its batches' in-edges come grouped by server, not in
    # order, and targets of the other partition are pulled too
    torch.manual_seed(0)
    model = SAGE(8, 16, 4, 2, 0.5, "csr").eval()
    copied: list[int] = []
    gather = inference.gather
    monkeypatch.setattr(inference, "gather", lambda *a: copied.append(1) or gather(*a))
    meet = threading.Barrier(world, timeout=60)
    got: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
    errors: list[BaseException] = []

    def trainer(rank: int) -> None:
        try:
            with initialize(
                served.servers, rank=rank, world_size=world, heartbeat_interval=0
            ) as ctx:
                data = DistGraphData(DistGraph(ctx), rank, world)
                ids = data.cover("train")
                feat = data.node_table("_N", "feat")
                block = inference.local_block(feat, ids)
                assert block is not None
                pol = ctx.client.policy(feat.name)  # the home partition: most of the ids
                home = int(np.bincount(pol.to_part(ids.numpy())).argmax())
                assert block[0] == int(pol.ranges[home])
                out = inference.layerwise(model, data, "_N", "feat", ids, 64, meet.wait)
                got[rank] = (ids, out, block[1].size(0))
                data.close()
        except BaseException as exc:
            errors.append(exc)
            meet.abort()

    threads = [threading.Thread(target=trainer, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert not copied
    assert got[0][2] < served.graph.num_nodes  # a partition's rows, the rest pulled
    ids = torch.cat([got[r][0] for r in range(world)])
    local = LocalData(served.graph)
    orig = torch.as_tensor(served.orig_nodes(ids))
    want = inference.layerwise(model, local, "_N", "feat", orig, 64, lambda: None)
    out = torch.cat([got[r][1] for r in range(world)])
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
