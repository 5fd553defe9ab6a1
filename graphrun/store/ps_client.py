"""A trainer's connection to the job's parameter servers (numpy; torch glue is in
:mod:`graphrun.train.ps`).

The parameters (name -> float32 array) are sharded over the servers with
:func:`~graphrun.store.ps_state.shard_params`; each server gets its names' arrays
flattened into one vector. :meth:`PSClient.step` sends every shard's push, then every
shard's pull (all in flight together, one DEALER per server: each server handles a
trainer's push before its pull), and waits for the pulls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.rpc.auth import KeyPair
from graphrun.rpc.codec import DEFAULT_LIMITS
from graphrun.rpc.transport import RpcClient
from graphrun.store.ps_state import AdamConfig, Mode, shard_params


class PSClient:
    """The parameter servers of a job, in ``ps:J`` order, holding ``shapes``' parameters."""

    def __init__(
        self,
        addresses: Sequence[str],
        shapes: Mapping[str, tuple[int, ...]],
        keys: KeyPair | None,
        timeout: float = 300.0,
    ) -> None:
        if not addresses:
            raise ArgumentError("parameter servers: none given")
        self.addresses = list(addresses)
        self.shapes = {n: tuple(int(x) for x in s) for n, s in shapes.items()}
        sizes = {n: 4 * int(np.prod(s, dtype=np.int64)) for n, s in self.shapes.items()}
        self.shards = shard_params(sizes, len(addresses))
        limit = DEFAULT_LIMITS.max_request_frame_bytes  # a push is one frame per server
        biggest = max(sum(sizes[n] for n in names) for names in self.shards)
        if biggest > limit:
            raise ArgumentError(
                f"parameter servers: a shard of {biggest} bytes exceeds a request frame's "
                f"{limit}; raise runtime.parameterServers"
            )
        self.timeout = timeout
        own = replace(keys, server=None) if keys is not None else None  # the job's own key
        self.clients = [RpcClient(a, keys=own, timeout=timeout) for a in addresses]

    def _flat(self, j: int, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        parts = [np.asarray(arrays[n], dtype=np.float32).ravel() for n in self.shards[j]]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def _split(self, j: int, flat: np.ndarray, out: dict[str, np.ndarray]) -> None:
        at = 0
        for n in self.shards[j]:
            size = int(np.prod(self.shapes[n], dtype=np.int64))
            out[n] = flat[at : at + size].reshape(self.shapes[n])
            at += size

    def init(
        self,
        params: Mapping[str, np.ndarray],
        trainers: int,
        mode: Mode,
        staleness: int,
        optimizer: AdamConfig,
    ) -> None:
        """Give every server its shard's first values (trainer 0, before any step)."""
        opt = {k: float(getattr(optimizer, k)) for k in ("lr", "beta1", "beta2", "eps")}
        opt["weight_decay"] = float(optimizer.weight_decay)
        rids = []
        for j, c in enumerate(self.clients):
            body = {
                "names": self.shards[j], "shapes": [list(self.shapes[n]) for n in self.shards[j]],
                "trainers": trainers, "mode": mode, "staleness": staleness, "optimizer": opt,
            }  # fmt: skip
            rids.append(c.send("ps_init", body, (self._flat(j, params),)))
        for c, rid in zip(self.clients, rids, strict=True):
            c.wait(rid)

    def pull(self, step: int) -> dict[str, np.ndarray]:
        """The parameters for ``step`` (waits until the servers have them)."""
        rids = [c.send("ps_pull", {"step": step}) for c in self.clients]
        return self._collect(rids)

    def step(self, rank: int, clock: int, grads: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Push trainer ``rank``'s gradients of step ``clock``, pull step ``clock + 1``."""
        pushes = [
            c.send("ps_push", {"rank": rank, "clock": clock}, (self._flat(j, grads),))
            for j, c in enumerate(self.clients)
        ]
        pulls = [c.send("ps_pull", {"step": clock + 1}) for c in self.clients]
        for c, rid in zip(self.clients, pushes, strict=True):
            c.wait(rid)
        return self._collect(pulls)

    def _collect(self, rids: Sequence[int]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for j, (c, rid) in enumerate(zip(self.clients, rids, strict=True)):
            msg = c.wait(rid)
            if len(msg.tensors) != 1:
                raise ArgumentError(f"{c.address}: ps_pull answered {len(msg.tensors)} tensors")
            self._split(j, msg.tensors[0], out)
        return out

    def save(self) -> dict[str, Any]:
        """Every shard's parameters and optimizer state (for a checkpoint)."""
        rids = [c.send("ps_save") for c in self.clients]
        out: dict[str, Any] = {"params": {}, "exp_avg": {}, "exp_avg_sq": {}, "step": []}
        for j, (c, rid) in enumerate(zip(self.clients, rids, strict=True)):
            msg = c.wait(rid)
            for key, flat in zip(("params", "exp_avg", "exp_avg_sq"), msg.tensors, strict=True):
                self._split(j, np.array(flat), out[key])
            out["step"].append(int(msg.body["step"]))
        return out

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`save` returned; every server's clocks restart at 0."""
        steps = list(state["step"])
        if len(steps) != len(self.clients):
            raise ArgumentError(
                f"checkpoint: saved by {len(steps)} parameter servers, the job has "
                f"{len(self.clients)} (runtime.parameterServers)"
            )
        for key in ("params", "exp_avg", "exp_avg_sq"):
            missing = set(self.shapes) - set(state[key])
            if missing:
                raise ArgumentError(f"checkpoint: no {key} for {sorted(missing)}")
        rids = []
        for j, c in enumerate(self.clients):
            arrays = tuple(self._flat(j, state[k]) for k in ("params", "exp_avg", "exp_avg_sq"))
            rids.append(c.send("ps_load", {"names": self.shards[j], "step": steps[j]}, arrays))
        for c, rid in zip(self.clients, rids, strict=True):
            c.wait(rid)

    def close(self) -> None:
        for c in self.clients:
            c.close()


def stop_parameter_servers(addresses: Sequence[str], keys: KeyPair | None) -> None:
    """Ask every parameter server to stop (trainer 0, once all trainers finished)."""
    own = replace(keys, server=None) if keys is not None else None
    for a in addresses:
        with RpcClient(a, keys=own, timeout=10.0) as c:
            c.call("stop", {})
