"""Models on hand-made mini-batches: trimming, the csr path, hetero and link models."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from graphrun.errors import ArgumentError
from graphrun.train.models import (
    BF16_ROWS,
    SAGE,
    HeteroGNN,
    LinkPredictor,
    as_adj,
    csr_rows,
    dropout,
    mean_csr,
    mfg_edges,
    mfg_targets,
    resolve_precision,
)


def mfg() -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    # 2 seeds, 3 hop-1 nodes, 2 hop-2 nodes; edges of hop 1 (into seeds) first
    x = torch.randn(7, 4)
    hop1 = torch.tensor([[2, 3, 4, 2], [0, 0, 1, 1]])
    hop2 = torch.tensor([[5, 6, 5], [2, 3, 4]])
    return x, torch.cat([hop1, hop2], 1), [2, 3, 2], [4, 3]


def test_sage_trimmed_equals_untrimmed_on_the_seeds():
    torch.manual_seed(0)
    x, ei, nodes, edges = mfg()
    model = SAGE(4, 8, 3, num_layers=2, dropout=0.0).eval()
    full = model(x, ei)[:2]
    trimmed = model(x, ei, nodes, edges)[:2]
    assert torch.allclose(full, trimmed, atol=1e-6)


def test_csr_path_matches_scatter():
    torch.manual_seed(0)
    x, ei, nodes, edges = mfg()
    a = SAGE(4, 8, 3, 2, 0.0, "scatter").eval()
    b = SAGE(4, 8, 3, 2, 0.0, "csr").eval()
    b.load_state_dict(a.state_dict())
    assert torch.allclose(a(x, ei, nodes, edges)[:2], b(x, ei, nodes, edges)[:2], atol=1e-5)


@pytest.mark.parametrize("targets", [5, 1500])  # fewer rows than a bf16 bucket; more
def test_bf16_layers_match_fp32_and_train_the_same_parameters(targets):
    torch.manual_seed(0)
    if targets == 5:
        x, ei, nodes, edges = mfg()
    else:  # one layer: 1500 targets among 3000 nodes, 4 in-edges each
        x = torch.randn(3000, 16)
        dst = torch.arange(targets).repeat_interleave(4)
        ei = torch.stack([torch.randint(0, 3000, (dst.numel(),)), dst])
        nodes, edges = [targets, 3000 - targets], [dst.numel()]
    layers = len(edges)
    ref = SAGE(x.size(1), 8, 3, layers, 0.0, "scatter")
    half = SAGE(x.size(1), 8, 3, layers, 0.0, "csr", "bf16")
    half.load_state_dict(ref.state_dict())
    a, b = ref(x, ei, nodes, edges), half(x, ei, nodes, edges)
    assert b.dtype == torch.float32 and b.shape == a.shape == (nodes[0], 3)
    assert torch.allclose(a, b, rtol=0.05, atol=0.02)  # bf16 keeps 8 bits of mantissa
    a.square().sum().backward()
    b.square().sum().backward()
    for (name, p), q in zip(ref.named_parameters(), half.parameters(), strict=True):
        assert q.grad is not None and q.grad.dtype == torch.float32, name
        assert torch.allclose(p.grad, q.grad, rtol=0.1, atol=0.05), name


def test_precision_auto_picks_what_the_cpu_multiplies_and_bad_values_are_refused():
    assert resolve_precision("auto") in ("fp32", "bf16")
    assert resolve_precision("fp32") == "fp32" and resolve_precision("bf16") == "bf16"
    with pytest.raises(ArgumentError, match="precision"):
        resolve_precision("fp16")
    with pytest.raises(ArgumentError, match="precision"):
        SAGE(4, 8, 3, 2, precision="fp16")  # type: ignore[arg-type]


def test_each_layer_computes_only_its_message_flow_targets():
    _, _, nodes, _ = mfg()
    assert [mfg_targets(nodes, 2, i) for i in range(2)] == [5, 2]  # seeds + hop 1, then seeds
    x, ei, nodes, edges = mfg()
    model = SAGE(4, 8, 3, 2, 0.0).eval()
    assert model(x, ei, nodes, edges).shape == (2, 3)  # only the seeds come out


def test_csr_adjacency_sorts_unsorted_destinations_and_averages():
    ei = torch.tensor([[5, 2, 6, 3], [2, 0, 1, 0]])  # destinations out of order
    adj = as_adj(ei, 7, 3, "csr").to_dense()
    want = torch.zeros(3, 7)
    want[ei[1], ei[0]] = torch.tensor([1.0, 0.5, 1.0, 0.5])  # 1 / in-degree
    assert torch.equal(adj, want)
    x = torch.randn(7, 4)
    mean = torch.stack([x[[2, 3]].mean(0), x[6], x[5]])
    assert torch.allclose(torch.sparse.mm(as_adj(ei, 7, 3, "csr"), x), mean)


def test_dropout_keeps_1_minus_p_scaled_and_is_identity_in_eval():
    torch.manual_seed(0)
    x = torch.ones(200_000)
    for p in (0.3, 0.25):  # 16-bit draws, 8-bit draws (p a multiple of 1/256)
        out = dropout(x, p, True)
        kept = out != 0
        assert abs(float(kept.float().mean()) - (1 - p)) < 0.01
        assert torch.allclose(out[kept], torch.full((int(kept.sum()),), 1 / (1 - p)))
    assert dropout(x, 0.3, False) is x and dropout(x, 0.0, True) is x
    assert not dropout(x, 1.0, True).any()
    g = torch.ones(10, requires_grad=True)
    dropout(g, 0.5, True).sum().backward()
    assert set(g.grad.tolist()) <= {0.0, 2.0}  # gradient flows through kept units only


def test_dropout_of_a_size_not_a_multiple_of_its_words():
    """The mask's bits come in 64-bit words: a last word only partly used still gives
    every element its own draw (odd sizes, 8- and 16-bit draws)."""
    torch.manual_seed(1)
    for p, n in ((0.5, 100_003), (0.3, 100_001)):
        out = dropout(torch.ones(n), p, True)
        assert out.shape == (n,)
        for part in (out[: n // 2], out[n // 2 :]):  # the tail drawn as the head
            assert abs(float((part != 0).float().mean()) - (1 - p)) < 0.02
    assert dropout(torch.ones(3, 1), 0.5, True).shape == (3, 1)


def test_dropout_masks_follow_torchs_seed():
    x = torch.ones(64, 8)
    torch.manual_seed(5)
    a, b = dropout(x, 0.5, True), dropout(x, 0.5, True)
    torch.manual_seed(5)
    assert torch.equal(dropout(x, 0.5, True), a) and not torch.equal(a, b)
    state = torch.get_rng_state()  # what a checkpoint keeps
    c = dropout(x, 0.5, True)
    torch.set_rng_state(state)
    assert torch.equal(dropout(x, 0.5, True), c)


@pytest.mark.parametrize("conv", ["rgcn", "sage"])
def test_hetero_model_outputs_target_rows(conv):
    torch.manual_seed(0)
    et = ("author", "writes", "paper")
    model = HeteroGNN({"paper": 4, "author": 3}, [et], 8, 5, 1, "paper", 0.0, conv)
    x = {"paper": torch.randn(2, 4), "author": torch.randn(3, 3)}
    out = model(x, {et: torch.tensor([[0, 1, 2], [0, 0, 1]])})
    assert out.shape == (2, 5)


@pytest.mark.parametrize("conv", ["rgcn", "sage"])
def test_hetero_message_flow_graph_equals_the_full_computation_on_the_seeds(conv):
    torch.manual_seed(0)
    w, c = ("author", "writes", "paper"), ("paper", "cites", "paper")
    model = HeteroGNN({"paper": 4, "author": 3}, [w, c], 8, 5, 2, "paper", 0.0, conv).eval()
    # papers: 2 seeds, 2 hop-1, 1 hop-2; authors: 0 seeds, 2 hop-1, 1 hop-2
    x = {"paper": torch.randn(5, 4), "author": torch.randn(3, 3)}
    ei = {
        w: torch.tensor([[0, 1, 2], [0, 1, 3]]),  # hop 1: 0->0, 1->1; hop 2: 2->3
        c: torch.tensor([[2, 3, 4], [0, 1, 2]]),  # hop 1: 2->0, 3->1; hop 2: 4->2
    }
    nodes = {"paper": [2, 2, 1], "author": [0, 2, 1]}
    edges = {w: [2, 1], c: [2, 1]}
    full = model(x, ei)[:2]
    mfg_out = model(x, ei, nodes, edges)
    assert mfg_out.shape == (2, 5)
    assert torch.allclose(full, mfg_out, atol=1e-6)


def test_link_predictor_scores_pairs():
    x, ei, nodes, edges = mfg()
    scores = LinkPredictor(4, 8, 2)(x, ei, torch.tensor([[0, 1], [1, 0]]), nodes, edges)
    assert scores.shape == (2,)


def test_gat_trimmed_equals_untrimmed_on_the_seeds():
    from graphrun.train.models import GAT

    torch.manual_seed(0)
    x, ei, nodes, edges = mfg()
    model = GAT(4, 8, 3, num_layers=2, dropout=0.0).eval()
    assert torch.allclose(model(x, ei)[:2], model(x, ei, nodes, edges), atol=1e-5)


@pytest.mark.parametrize("name", ["sage", "gcn", "gat"])
def test_every_named_model_learns(name):
    from graphrun.train.models import GAT, GCN

    torch.manual_seed(0)
    x, ei, nodes, edges = mfg()
    y = torch.tensor([0, 2])
    cls = {"sage": SAGE, "gcn": GCN, "gat": GAT}[name]
    model = cls(4, 8, 3, 2, 0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x, ei, nodes, edges)[:2], y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.3 * losses[0], losses[::10]


def test_only_relations_that_reach_the_target_get_convolutions():
    from graphrun.train.models import reaching_relations

    w, rw = ("author", "writes", "paper"), ("paper", "rev_writes", "author")
    c, a = ("paper", "cites", "paper"), ("author", "in", "institution")
    layers = reaching_relations([w, rw, c, a], {"author", "paper", "institution"}, "paper", 2)
    # last layer: only into papers; first: into papers and authors (the sources above)
    assert layers == [[w, rw, c], [w, c]]


def test_every_hetero_parameter_gets_a_gradient_even_without_some_relation():
    # DDP needs every parameter in every step's loss: convs into non-target types of the
    # last layer (the bug: paper:rev_writes:author) must not exist, and a relation absent
    # from a batch still runs on no edges
    torch.manual_seed(0)
    w, rw = ("author", "writes", "paper"), ("paper", "rev_writes", "author")
    model = HeteroGNN({"paper": 4, "author": 3}, [w, rw], 8, 5, 2, "paper", 0.0)
    x = {"paper": torch.randn(5, 4), "author": torch.randn(3, 3)}
    nodes = {"paper": [2, 2, 1], "author": [0, 2, 1]}
    ei = {w: torch.tensor([[0, 1, 2], [0, 1, 3]])}  # no rev_writes edges in this batch
    model(x, ei, nodes, {w: [2, 1]}).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []


# --- R-GCN (issue 26: rgcn was hetero-sage under another name) --------------------------

W, RW = ("author", "writes", "paper"), ("paper", "rev_writes", "author")
C = ("paper", "cites", "paper")
DIMS = {"paper": 4, "author": 3}


def _params(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def _rgcn_count(relations: list[list], dims: list[int], outs: list[int], bases) -> int:
    """R-GCN's parameters: per layer of R relations, in-width D and out-width O,
    B*D*O + R*B (bases and coefficients; R*D*O without bases) + D*O + O (W_0, bias)."""
    total = 0
    for rels, d, o in zip(relations, dims, outs, strict=True):
        r = len(rels)
        b = min(bases, r) if bases else None
        total += (b * d * o + r * b if b else r * d * o) + d * o + o
    return total


def test_rgcn_and_hetero_sage_are_different_models():
    """Both were per-relation (mean of neighbours) + (root) linear pairs: the same
    parameter set, identical losses."""
    rgcn = HeteroGNN(DIMS, [W, RW, C], 8, 5, 2, "paper", 0.0, "rgcn")
    sage = HeteroGNN(DIMS, [W, RW, C], 8, 5, 2, "paper", 0.0, "sage")
    assert sorted(_params(rgcn).values()) != sorted(_params(sage).values())
    assert sum(p.numel() for p in rgcn.parameters()) != sum(p.numel() for p in sage.parameters())
    # R-GCN: one self-loop weight and bias per layer, not a root weight per relation
    assert [n for n in _params(rgcn) if "root" in n] == ["convs.0.root", "convs.1.root"]


@pytest.mark.parametrize("bases", [None, 1, 2, 30])
def test_rgcn_parameters_follow_the_basis_decomposition(bases):
    model = HeteroGNN(DIMS, [W, RW, C], 8, 5, 2, "paper", 0.0, "rgcn", bases)
    layers = model.relations  # [[W, RW, C], [W, C]]
    expected = _rgcn_count(layers, [4, 8], [8, 5], bases)
    assert sum(p.numel() for p in model.parameters()) == expected
    comp = [tuple(p.shape) for n, p in model.named_parameters() if n.endswith("comp")]
    assert comp == ([] if bases is None else [(3, min(bases, 3)), (2, min(bases, 2))])


@pytest.mark.parametrize("bases", [None, 2])
def test_rgcn_layer_is_pygs_rgcnconv_on_the_homogeneous_graph(bases):
    """The layer equals RGCNConv (same parameters) on the graph made homogeneous, node
    types' features zero-padded to the widest, relations as edge types."""
    from torch_geometric.nn import RGCNConv

    from graphrun.train.rgcn import RGCNLayer

    torch.manual_seed(0)
    layer = RGCNLayer([W, RW, C], 4, 6, bases)
    x = {"paper": torch.randn(5, 4), "author": torch.randn(3, 3)}
    ei = {
        W: torch.tensor([[0, 1, 2, 2], [0, 1, 3, 0]]),
        RW: torch.tensor([[0, 4], [1, 2]]),
        C: torch.tensor([[2, 3, 4, 1], [0, 1, 2, 0]]),
    }
    got = layer(x, ei, {"paper": 5, "author": 3})

    conv = RGCNConv(4, 6, num_relations=3, num_bases=bases)
    conv.load_state_dict(layer.state_dict())
    offset = {"paper": 0, "author": 5}
    homo = torch.cat([x["paper"], torch.nn.functional.pad(x["author"], (0, 1))])
    shift = {et: torch.tensor([[offset[et[0]]], [offset[et[2]]]]) for et in (W, RW, C)}
    edges = torch.cat([ei[et] + shift[et] for et in (W, RW, C)], 1)
    types = torch.cat([torch.full((ei[et].size(1),), k) for k, et in enumerate((W, RW, C))])
    want = conv(homo, edges, types)
    assert torch.allclose(got["paper"], want[:5], atol=1e-5)
    assert torch.allclose(got["author"], want[5:], atol=1e-5)


@pytest.mark.parametrize(("conv", "bases"), [("rgcn", None), ("rgcn", 2), ("sage", None)])
def test_hetero_models_learn(conv, bases):
    torch.manual_seed(0)
    model = HeteroGNN(DIMS, [W, RW, C], 8, 3, 2, "paper", 0.0, conv, bases)
    x = {"paper": torch.randn(5, 4), "author": torch.randn(3, 3)}
    ei = {
        W: torch.tensor([[0, 1, 2], [0, 1, 3]]),
        RW: torch.tensor([[2, 3], [0, 1]]),  # hop 2: papers of hop 1 -> authors of hop 1
        C: torch.tensor([[2, 3, 4], [0, 1, 2]]),
    }
    nodes = {"paper": [2, 2, 1], "author": [0, 2, 1]}
    edges = {W: [2, 1], RW: [0, 2], C: [2, 1]}
    y = torch.tensor([0, 2])
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x, ei, nodes, edges), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.3 * losses[0], losses[::10]


def test_num_bases_is_for_rgcn_only():
    from graphrun.job.spec import parse_job

    base = {"apiVersion": "graphrun.io/v1alpha1", "kind": "GraphJob", "metadata": {"name": "j"}}
    spec = {"graph": {"dataset": "d"}, "partition": {"parts": 1, "output": "p"}}
    ok = {"task": "hetero-node-classification", "targetNodeType": "paper", "numBases": 4}
    assert parse_job({**base, "spec": {**spec, "training": ok}}).spec.training.num_bases == 4
    for training, why in [
        ({**ok, "model": "hetero-sage"}, "numBases: only the rgcn model"),
        ({**ok, "numBases": 0}, "numBases"),
    ]:
        with pytest.raises(Exception, match=why):
            parse_job({**base, "spec": {**spec, "training": training}})


def sampled_batch(seed: int = 0) -> Data:
    from graphrun.testing.graphs import random_graph
    from graphrun.train.data import LocalData

    data = LocalData(random_graph(2000, 40_000, 16, seed=seed))
    return next(data.loader("train", None, [10, 5], 64, True, 0)).data


class PygSage(torch.nn.Module):
    """The plain PyG reference: SAGEConv layers over the whole sampled subgraph."""

    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        from torch_geometric.nn import SAGEConv

        self.convs = torch.nn.ModuleList(SAGEConv(a, b) for a, b in itertools.pairwise(dims))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            x = x.relu() if i < len(self.convs) - 1 else x
        return x


@pytest.mark.parametrize(
    ("precision", "rtol", "atol", "grad_err"),
    # bf16 keeps 8 bits of mantissa: its inputs, weights, means and the gradients its
    # products pass back are rounded to it (the sparse-product kernel before this one:
    # outputs within 0.6 %, gradients' norms within 5 % on these batches)
    [("fp32", 1e-5, 1e-5, 1e-5), ("bf16", 0.05, 0.05, 0.1)],
)
def test_sage_matches_a_plain_pyg_model_on_a_sampled_batch(precision, rtol, atol, grad_err):
    torch.manual_seed(0)
    b = sampled_batch()
    ref = PygSage([16, 32, 5])
    model = SAGE(16, 32, 5, 2, 0.0, "csr", precision)
    model.load_state_dict(ref.state_dict())
    n = b.batch_size
    want = ref(b.x, b.edge_index)[:n]
    got = model(b.x, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
    assert got.dtype == torch.float32 and got.shape == want.shape == (n, 5)
    assert torch.allclose(got, want, rtol=rtol, atol=atol)
    target = torch.randn(n, 5)
    ((want - target) ** 2).sum().backward()
    ((got - target) ** 2).sum().backward()
    for (name, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
        assert q.grad is not None and q.grad.dtype == torch.float32, name
        assert float((q.grad - p.grad).norm() / p.grad.norm()) <= grad_err, name


def test_bf16_rows_fetched_in_bf16_give_the_cast_rows_and_the_same_step():
    """``x_bf16``: the batch's rows are ``x.to(torch.bfloat16)`` exactly (the same batch
    otherwise); a bf16 model handed them computes what it computes from the fp32 rows
    (its cast is then none), within the bf16 tolerance of the plain PyG model."""
    from graphrun.testing.graphs import random_graph
    from graphrun.train.data import LocalData

    data = LocalData(random_graph(2000, 40_000, 16, seed=0))
    a = next(data.loader("train", None, [10, 5], 64, True, 0)).data
    b = next(data.loader("train", None, [10, 5], 64, True, 0, x_bf16=True)).data
    assert a.x.dtype == torch.float32 and b.x.dtype == torch.bfloat16
    assert torch.equal(a.x.to(torch.bfloat16), b.x) and torch.equal(a.y, b.y)
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.n_id, b.n_id)
    torch.manual_seed(0)
    ref = PygSage([16, 32, 5])
    model = SAGE(16, 32, 5, 2, 0.0, "csr", "bf16")
    model.load_state_dict(ref.state_dict())
    assert model.reads_bf16 and not SAGE(16, 32, 5, 2, 0.0, "scatter", "bf16").reads_bf16
    n = a.batch_size
    from_fp32 = model(a.x, a.edge_index, a.num_sampled_nodes, a.num_sampled_edges)
    got = model(b.x, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
    assert got.dtype == torch.float32 and torch.equal(got, from_fp32)
    assert torch.allclose(got[:n], ref(a.x, a.edge_index)[:n], rtol=0.05, atol=0.05)


def fp32_round_trip(model: SAGE, b: Data) -> torch.Tensor:
    """A bf16 SAGE's training forward as it was before its hidden layers stayed bf16:
    each layer's output cast to fp32 and cut to its destinations, ReLU and dropout in
    fp32, the next layer's cast back to bf16."""
    x, layers = b.x, len(model.convs)
    for i, conv in enumerate(model.convs):
        n_dst = mfg_targets(b.num_sampled_nodes, layers, i)
        edges = mfg_edges(b.edge_index, b.num_sampled_edges, layers, i)
        rows = min(-(-n_dst // BF16_ROWS) * BF16_ROWS, x.size(0))
        offsets, columns = csr_rows(edges, rows)
        xb = x.to(torch.bfloat16)
        x = model._dense(conv, mean_csr(xb, offsets, columns), xb[:rows])[:n_dst]
        if i < layers - 1:
            x = dropout(F.relu(x), model.dropout, True)
    return x


@pytest.mark.parametrize("p", [0.5, 1 / 3, 0.3])  # scale 2 and 1.5 exact in bf16; 1/0.7 not
def test_bf16_hidden_layers_stay_bf16_in_training_and_train_as_the_fp32_round_trip(p):
    """Training, a bf16 hidden layer hands on bf16 rows (its padding rows too); the
    output and every parameter's gradient are the fp32 round trip's bit for bit.
    Evaluation keeps fp32 and the exact row count."""
    b = sampled_batch()
    torch.manual_seed(0)
    model = SAGE(16, 32, 5, 2, p, "csr", "bf16")
    n_dst = mfg_targets(b.num_sampled_nodes, 2, 0)
    edges = mfg_edges(b.edge_index, b.num_sampled_edges, 2, 0)
    rows = min(BF16_ROWS, b.num_nodes)
    assert n_dst < rows  # padding rows to keep
    hidden = model.layer(0, b.x, edges, n_dst)
    assert hidden.dtype == torch.bfloat16 and hidden.shape == (rows, 32)
    model.eval()
    assert model.layer(0, b.x, edges, n_dst).dtype == torch.float32
    assert model.layer(0, b.x, edges, n_dst).shape == (n_dst, 32)
    model.train()
    target = torch.randn(b.batch_size, 5)
    grads = []
    for forward in (model, lambda *a: fp32_round_trip(model, b)):
        model.zero_grad()
        torch.manual_seed(1)
        out = forward(b.x, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
        out = out[: b.batch_size]
        ((out - target) ** 2).sum().backward()
        grads.append([out.detach(), *(q.grad.clone() for q in model.parameters())])
    assert grads[0][0].dtype == torch.float32
    for got, want in zip(*grads, strict=True):
        assert torch.equal(got, want)


def test_bf16_dropout_is_the_fp32_product_cast():
    x = torch.randn(1000, 33).to(torch.bfloat16)
    for p in (0.5, 0.75, 1 / 3, 0.3):
        torch.manual_seed(2)
        got = dropout(x, p, True)
        torch.manual_seed(2)
        want = dropout(x.float(), p, True).to(torch.bfloat16)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want), p


def by_id(b: Data) -> Data:
    """``b`` with each hop's nodes past the seeds renumbered by global id (as the
    distributed sampler lays a batch out): the same graph, rows and edges permuted."""
    bounds = list(itertools.accumulate(b.num_sampled_nodes))
    hops = [lo + torch.argsort(b.n_id[lo:hi]) for lo, hi in itertools.pairwise(bounds)]
    perm = torch.cat([torch.arange(b.batch_size), *hops])
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    out = b.clone()
    out.x, out.n_id, out.edge_index = b.x[perm], b.n_id[perm], inv[b.edge_index]
    return out


def test_local_batches_lay_each_hop_out_as_layer_0_first_reads_it():
    """The mean of layer 0 reads its compressed rows in order; its first read of each
    node past the seeds is the next row of the batch's features (the local sampler's
    ``order="first"``), and the model's output is that of the same batch by id."""
    b = sampled_batch()
    n = b.batch_size
    n_dst = mfg_targets(b.num_sampled_nodes, 2, 0)
    _, columns = csr_rows(mfg_edges(b.edge_index, b.num_sampled_edges, 2, 0), n_dst)
    seen = torch.zeros(b.num_nodes, dtype=torch.bool)
    first = []
    for c in columns.tolist():
        if not seen[c]:
            seen[c] = True
            first.append(c)
    past_seeds = [c for c in first if c >= n]
    assert past_seeds == list(range(n, b.num_nodes))
    old = by_id(b)
    assert not torch.equal(old.n_id, b.n_id)  # the layouts differ
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = SAGE(16, 32, 5, 2, 0.0, "csr", precision)
        got = model(b.x, b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)[:n]
        want = model(old.x, old.edge_index, old.num_sampled_nodes, old.num_sampled_edges)[:n]
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), precision


@pytest.mark.parametrize("seed", range(4))
def test_fused_mean_equals_the_sparse_product_forward_and_backward(seed):
    """``mean_csr`` (embedding_bag) against the kernel it replaced (``as_adj``'s CSR
    with 1/degree values, ``torch.sparse.mm``) on random graphs: rows without edges,
    destinations out of order, gradients for the source rows."""
    gen = torch.Generator().manual_seed(seed)
    n_src, n_dst, nnz = 300, 120, 1000 + 300 * seed
    dst = torch.randint(0, n_dst - 10, (nnz,), generator=gen)  # the last 10 rows empty
    ei = torch.stack([torch.randint(0, n_src, (nnz,), generator=gen), dst])
    if seed % 2:
        ei = ei[:, torch.argsort(dst)]  # grouped by destination, as samplers emit
    x = torch.randn(n_src, 24, generator=gen)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    old = torch.sparse.mm(as_adj(ei, n_src, n_dst, "csr"), a)
    new = mean_csr(b, *csr_rows(ei, n_dst))
    assert torch.allclose(new, old, atol=1e-6) and not new[-10:].any()
    g = torch.randn(n_dst, 24, generator=gen)
    old.backward(g)
    new.backward(g)
    assert torch.allclose(b.grad, a.grad, atol=1e-6)


def test_fused_mean_of_bf16_rows_sums_in_fp32():
    x = torch.ones(256, 4, dtype=torch.bfloat16)
    x[0] = 256.0  # a bf16 running sum would stay 256: 256 + 1 rounds back to it
    ei = torch.stack([torch.arange(256), torch.zeros(256, dtype=torch.long)])
    mean = mean_csr(x, *csr_rows(ei, 1))
    assert mean.dtype == torch.bfloat16 and torch.equal(mean.float(), torch.full((1, 4), 2.0))
