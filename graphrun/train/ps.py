"""Dense parameters on parameter servers: :class:`PSOptimizer` replaces DDP's all-reduce
and the local ``torch.optim.Adam`` of a model (``training.sync: ps``).

It has an optimizer's face (``zero_grad``, ``step``, ``state_dict``, ``load_state_dict``),
so a task, the loop and checkpoints use it as they use Adam:

* construction: trainer 0 gives the servers the model's first parameters, every trainer
  waits for it (a barrier) and pulls them;
* ``step()``: push this trainer's gradients of step ``c`` and pull the parameters of step
  ``c + 1`` (:class:`~graphrun.store.ps_client.PSClient`); in sync mode they are what
  all-reduce + Adam gives, up to floating-point order; in async mode at most
  ``staleness`` steps of the slowest trainer are missing from them;
* ``state_dict()``: the servers' parameters and Adam state (trainer 0's checkpoint);
  ``load_state_dict()``: trainer 0 restores the servers, every trainer copies the saved
  parameters into its model, and the step clocks restart at 0 (exact resume).

A user entry point can use it too: ``PSOptimizer(model, ctx.ps, ctx.rank, ...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphrun.errors import ArgumentError
from graphrun.rpc.auth import KeyPair
from graphrun.store.ps_client import PSClient
from graphrun.store.ps_state import AdamConfig, Mode

FORMAT = "graphrun-ps"


class PSOptimizer:
    """Adam on the job's parameter servers for ``model``'s parameters."""

    def __init__(
        self,
        model: torch.nn.Module,
        client: PSClient,
        rank: int,
        world_size: int,
        mode: Mode = "sync",
        staleness: int = 0,
        lr: float = 0.001,
        weight_decay: float = 0.0,
        barrier: Any = None,
    ) -> None:
        self.params = dict(model.named_parameters())
        shapes = {n: tuple(p.shape) for n, p in self.params.items()}
        if shapes != client.shapes:
            raise ArgumentError("PSOptimizer: the client was made for other parameters")
        self.client = client
        self.rank = rank
        self.staleness = staleness if mode == "async" else 0
        self.clock = 0
        self.param_groups = [{"lr": lr}]  # what schedulers and loggers read
        if rank == 0:
            first = {n: p.detach().cpu().numpy() for n, p in self.params.items()}
            client.init(first, world_size, mode, self.staleness, AdamConfig(lr=lr,
                        weight_decay=weight_decay))  # fmt: skip
        if barrier is not None and world_size > 1:
            barrier()  # trainer 0's parameters are on the servers
        self._copy_in(client.pull(0))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params.values():
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        grads = {}
        for n, p in self.params.items():
            g = p.grad
            grads[n] = np.zeros(p.shape, np.float32) if g is None else g.detach().cpu().numpy()
        fresh = self.client.step(self.rank, self.clock, grads)
        self.clock += 1
        self._copy_in(fresh)

    @torch.no_grad()
    def _copy_in(self, arrays: dict[str, np.ndarray]) -> None:
        for n, p in self.params.items():
            p.copy_(torch.from_numpy(np.asarray(arrays[n])).to(p.device, p.dtype))

    def state_dict(self) -> dict[str, Any]:
        saved = self.client.save()
        return {
            "format": FORMAT,
            "step": [int(s) for s in saved["step"]],
            **{
                key: {n: torch.from_numpy(np.array(a)) for n, a in saved[key].items()}
                for key in ("params", "exp_avg", "exp_avg_sq")
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ArgumentError(
                "checkpoint: its optimizer state is not a parameter server's (trained with "
                "training.sync: allreduce? resume with the same sync mode)"
            )
        arrays = {
            key: {n: t.numpy() for n, t in state[key].items()}
            for key in ("params", "exp_avg", "exp_avg_sq")
        }
        if self.rank == 0:
            self.client.load({**arrays, "step": state["step"]})
        self._copy_in(arrays["params"])
        self.clock = 0


@dataclass(frozen=True)
class PSSettings:
    """Where a trainer's parameter servers are and how it trains with them (built at
    the edge, :mod:`graphrun.machine.trainer`, and carried by the TrainContext)."""

    addresses: tuple[str, ...]
    keys: KeyPair | None
    mode: Mode = "sync"
    staleness: int = 0
    timeout_s: float = 300.0

    def optimizer(
        self,
        model: torch.nn.Module,
        rank: int,
        world_size: int,
        lr: float,
        weight_decay: float,
        barrier: Any = None,
    ) -> PSOptimizer:
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        client = PSClient(self.addresses, shapes, self.keys, self.timeout_s)
        return PSOptimizer(
            model, client, rank, world_size, self.mode, self.staleness, lr, weight_decay, barrier
        )
