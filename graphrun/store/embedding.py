"""``DistEmbedding`` and sparse optimizers whose state lives on the store servers.

    emb = DistEmbedding(client, num_nodes, 16, "user_emb")   # uniform(-1, 1) init
    opt = SparseAdam([emb], lr=0.01)
    x = emb(ids)                 # pulled rows, requires_grad; the call is recorded
    loss(x).backward()
    opt.step()                   # pushes d loss/d x per row; the servers update rows + state
    opt.zero_grad()

The optimizer never pulls state: ``step()`` sends each looked-up row's gradient with
the ``sparse_adagrad`` / ``sparse_adam`` reducer (see :mod:`graphrun.store.reducers`),
which coalesces repeated rows and updates the embedding and its state tensors
(``<name>.adagrad.sum``; ``<name>.adam.m``, ``.adam.v``, ``.adam.step``) in place on
the owning servers. Several trainers may share one embedding; their steps are applied
in arrival order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from graphrun.errors import ArgumentError
from graphrun.names import PolicyName
from graphrun.store.client import KVClient
from graphrun.store.dist_tensor import DistTensor, as_torch, to_numpy_ids
from graphrun.store.reducers import STATE_SPECS


class DistEmbedding:
    """A ``num_embeddings x embedding_dim`` float32 table on the servers."""

    def __init__(
        self,
        client: KVClient,
        num_embeddings: int,
        embedding_dim: int,
        name: str,
        *,
        policy: PolicyName | str | None = None,
        init: str = "uniform",
        init_args: Mapping[str, Any] | None = None,
        persistent: bool = False,
    ) -> None:
        self.weight = DistTensor(
            client,
            name,
            (num_embeddings, embedding_dim),
            "float32",
            policy,
            init=init,
            init_args=init_args,
            persistent=persistent,
        )
        self.name = name
        self.persistent = persistent
        self._trace: list[tuple[np.ndarray, torch.Tensor]] = []

    @property
    def client(self) -> KVClient:
        return self.weight.client

    @property
    def num_embeddings(self) -> int:
        return self.weight.shape[0]

    @property
    def embedding_dim(self) -> int:
        return self.weight.shape[1]

    def __call__(self, ids: Any) -> torch.Tensor:
        ids_np = to_numpy_ids(ids).astype(np.int64, copy=False)
        rows = as_torch(self.weight.pull_numpy(ids_np))
        if torch.is_grad_enabled():
            rows = rows.clone().requires_grad_(True)
            self._trace.append((ids_np, rows))
        return rows

    def take_trace(self) -> list[tuple[np.ndarray, torch.Tensor]]:
        trace, self._trace = self._trace, []
        return trace


class _SparseOptimizer:
    reducer = ""

    def __init__(self, params: Sequence[DistEmbedding], hyper: dict[str, float]) -> None:
        if not params or not all(isinstance(p, DistEmbedding) for p in params):
            raise ArgumentError("params: expected a non-empty list of DistEmbedding")
        self.params = list(params)
        self.hyper = hyper
        self._states: dict[str, list[str]] = {}
        self._tensors: dict[str, DistTensor] = {}
        for emb in self.params:
            names = []
            for suffix, full_row in STATE_SPECS[self.reducer]:
                state = f"{emb.name}.{self.reducer.removeprefix('sparse_')}.{suffix}"
                shape = (
                    (emb.num_embeddings, emb.embedding_dim) if full_row else (emb.num_embeddings,)
                )
                self._tensors[state] = DistTensor(
                    emb.client,
                    state,
                    shape,
                    "float32",
                    emb.weight.policy,
                    persistent=emb.persistent,
                )
                names.append(state)
            self._states[emb.name] = names

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every optimizer state tensor, all rows (state name -> tensor), for a checkpoint."""
        return {name: t[np.arange(t.shape[0], dtype=np.int64)] for name, t in self._tensors.items()}

    def rows(self, ids: np.ndarray, of: DistEmbedding | None = None) -> dict[str, torch.Tensor]:
        """The rows ``ids`` of every state tensor, or of ``of``'s only (a heterograph's
        table per node type: ``ids`` of its type), state name -> rows (a live graph's new
        nodes: their ids are past the tables' shape)."""
        names = self._tensors if of is None else self._states.get(of.name, [])
        return {name: self._tensors[name][ids] for name in names}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Write back what :meth:`state_dict` returned; unknown or misshaped states are an
        ArgumentError naming them."""
        for name, value in state.items():
            t = self._state(name)
            if tuple(value.shape) != tuple(t.shape):
                raise ArgumentError(
                    f"optimizer state {name!r}: shape {tuple(value.shape)}, expected {t.shape}"
                )
            t[np.arange(t.shape[0], dtype=np.int64)] = value

    def load_rows(self, ids: np.ndarray, rows: Mapping[str, torch.Tensor]) -> None:
        """Write back what :meth:`rows` returned for ``ids``."""
        for name, value in rows.items():
            t = self._state(name)
            if tuple(value.shape) != (len(ids), *t.shape[1:]):
                raise ArgumentError(f"optimizer state {name!r}: {tuple(value.shape)} rows for "
                                    f"{len(ids)} ids")  # fmt: skip
            t[ids] = value

    def _state(self, name: str) -> DistTensor:
        t = self._tensors.get(name)
        if t is None:
            raise ArgumentError(f"optimizer state {name!r}: this optimizer has no such state")
        return t

    def step(self) -> None:
        """Send every recorded row gradient to the servers, which update rows and state."""
        for emb in self.params:
            trace = emb.take_trace()
            grads = [(i, t.grad) for i, t in trace if t.grad is not None]
            if not grads:
                continue
            ids = np.concatenate([i for i, _ in grads])
            g = torch.cat([gr.reshape(len(i), *emb.weight.shape[1:]) for i, gr in grads]).numpy()
            emb.client.push(
                emb.name,
                ids,
                np.ascontiguousarray(g, dtype=np.float32),
                self.reducer,
                self.hyper,
                self._states[emb.name],
            )

    def zero_grad(self) -> None:
        for emb in self.params:
            emb.take_trace()


class SparseAdagrad(_SparseOptimizer):
    reducer = "sparse_adagrad"

    def __init__(self, params: Sequence[DistEmbedding], lr: float, eps: float = 1e-10) -> None:
        super().__init__(params, {"lr": float(lr), "eps": float(eps)})


class SparseAdam(_SparseOptimizer):
    reducer = "sparse_adam"

    def __init__(
        self,
        params: Sequence[DistEmbedding],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        hyper = {"lr": float(lr), "beta1": float(betas[0]), "beta2": float(betas[1])}
        super().__init__(params, {**hyper, "eps": float(eps)})
