import numpy as np
import pytest
import torch

from graphrun.errors import ArgumentError
from graphrun.store import DistEmbedding, DistTensor, SparseAdagrad, SparseAdam
from tests.store.conftest import connect


def test_dist_tensor_get_set(stores, keys):
    with connect(stores, keys, job="dt") as c:
        t = DistTensor(c, "x", (600, 2), torch.float32)
        ids = torch.tensor([5, 599, 0, 5])
        t[ids] = torch.arange(8, dtype=torch.float32).reshape(4, 2)
        got = t[ids]
        assert isinstance(got, torch.Tensor) and got.shape == (4, 2)
        np.testing.assert_array_equal(got[1].numpy(), [2, 3])
        t[[1, 2]] = 1.5  # broadcast
        assert t[[1, 2]].sum().item() == 6
        again = DistTensor(c, "x", (600, 2), "float32")  # attaches
        assert again.shape == (600, 2) and len(again) == 600
        with pytest.raises(ArgumentError, match="exists with shape"):
            DistTensor(c, "x", (600, 3), "float32")
        with pytest.raises(ArgumentError, match="first dimension"):
            DistTensor(c, "y", (10, 3))
        feat = DistTensor(c, "node/_N/feat")
        assert feat.shape == (600, 8) and feat.policy == "node:_N"


@pytest.mark.parametrize("opt_name", ["adagrad", "adam"])
def test_dist_embedding_trains_like_torch(stores, keys, opt_name):
    n, d = 600, 4
    rng = np.random.default_rng(0)
    with connect(stores, keys, job=f"emb-{opt_name}") as c:
        emb = DistEmbedding(c, n, d, "e", init="normal", init_args={"std": 0.1})
        init = c.pull("e", np.arange(n)).copy()
        ref = torch.nn.Embedding(n, d, sparse=True)
        ref.weight.data[:] = torch.from_numpy(init)
        if opt_name == "adagrad":
            opt, ref_opt = (
                SparseAdagrad([emb], lr=0.1),
                torch.optim.Adagrad(ref.parameters(), lr=0.1),
            )
        else:
            opt = SparseAdam([emb], lr=0.05)
            ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.05)
        target = torch.from_numpy(rng.normal(size=(n, d)).astype(np.float32))
        for _ in range(3):
            ids = torch.from_numpy(np.concatenate([np.arange(n), rng.integers(0, n, 50)]))
            for module, o in ((emb, opt), (ref, ref_opt)):
                o.zero_grad()
                loss = ((module(ids) - target[ids]) ** 2).sum()
                loss.backward()
                o.step()
        np.testing.assert_allclose(
            c.pull("e", np.arange(n)), ref.weight.detach().numpy(), rtol=1e-4, atol=1e-5
        )
        names = {t.name for t in c.list_tensors()}
        assert {"e", f"e.{opt_name}.{'sum' if opt_name == 'adagrad' else 'm'}"} <= names


def test_sparse_adam_state_round_trips_for_a_checkpoint(stores, keys):
    n, d = 600, 3
    target = torch.linspace(-1, 1, n * d).reshape(n, d)
    ids = torch.arange(0, n, 2)
    with connect(stores, keys, job="adam-ckpt") as c:
        emb = DistEmbedding(c, n, d, "w", init="normal", init_args={"std": 0.1})
        opt = SparseAdam([emb], lr=0.05)

        def step() -> None:
            opt.zero_grad()
            ((emb(ids) - target[ids]) ** 2).sum().backward()
            opt.step()

        step()
        step()
        weights, state = c.pull("w", np.arange(n)).copy(), opt.state_dict()
        assert set(state) == {"w.adam.m", "w.adam.v", "w.adam.step"}
        assert state["w.adam.step"][ids].eq(2).all() and state["w.adam.step"][1] == 0
        step()
        after = c.pull("w", np.arange(n)).copy()
        for restore in (True, False):  # a resumed run continues exactly only with the state
            emb.weight[np.arange(n)] = torch.from_numpy(weights)
            if restore:
                opt.load_state_dict(state)
            else:
                opt.load_state_dict({k: torch.zeros_like(v) for k, v in state.items()})
            step()
            same = np.allclose(c.pull("w", np.arange(n)), after, atol=1e-7)
            assert same == restore
        with pytest.raises(ArgumentError, match=r"'w\.adam\.q': this optimizer has no such"):
            opt.load_state_dict({"w.adam.q": state["w.adam.m"]})
        with pytest.raises(ArgumentError, match=r"'w\.adam\.m': shape \(2,\)"):
            opt.load_state_dict({"w.adam.m": torch.zeros(2)})


def test_no_grad_lookup_is_not_recorded(stores, keys):
    with connect(stores, keys, job="ng") as c:
        emb = DistEmbedding(c, 600, 2, "e2")
        with torch.no_grad():
            emb([1, 2])
        assert emb.take_trace() == []


def test_a_lookup_of_no_ids_beside_others_steps(stores, keys):
    """A batch may look up no row of an embedding (a node type absent from it) beside
    lookups that have rows: the empty lookup's gradient has shape (0, d)."""
    with connect(stores, keys, job="emb-empty") as c:
        emb = DistEmbedding(c, 600, 4, "e", init="zeros")
        opt = SparseAdagrad([emb], lr=0.1)
        loss = emb(torch.tensor([], dtype=torch.int64)).sum() + emb(torch.tensor([3])).sum()
        loss.backward()
        opt.step()
        assert (c.pull("e", np.array([3])) != 0).all()
        assert (c.pull("e", np.array([4])) == 0).all()
