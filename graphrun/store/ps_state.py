"""A parameter server's state, as pure data: its shard of the dense parameters, their
optimizer and the trainers' clocks. No sockets here (:mod:`graphrun.store.ps_server`
serves it); every method is a function of the state and its arguments, unit-tested.

**Sharding** (:func:`shard_params`): the parameters (by name, each whole) are dealt to
``N`` servers balanced by bytes: largest first, each to the lightest server so far
(ties: the lower index). Every trainer computes the same layout from the same model.

**A shard** keeps its parameters as one flat float32 vector (``names`` in order, each
flattened): one frame each way on the wire, whatever the model's layer count.

**Clocks.** Trainer ``r`` pushes the gradient of its step ``c`` (``c`` = steps it took
before, from 0) and then pulls the parameters for step ``c + 1``:

* ``sync``: the shard sums the pushes of step ``c`` and, when all ``W`` trainers have
  pushed, applies their mean once (what all-reduce + a local optimizer step does) and
  every clock becomes ``c + 1``; a push for another step than the current one is refused.
* ``async``: each push is applied at once, with the learning rate divided by ``W`` (``W``
  pushes move the parameters about as far as one synchronous step), and the pusher's
  clock becomes ``c + 1``.

A pull for step ``s`` is answered when ``min(clocks) >= s - staleness`` (:meth:`ready`;
``staleness`` 0 in sync mode): in sync mode once step ``s - 1`` is applied, in async mode
once the slowest trainer is at most ``staleness`` steps behind — stale synchronous
parallel (SSP).

**The optimizer** (:class:`DenseAdam`) is ``torch.optim.Adam``'s update (L2 weight decay
added to the gradient, bias corrections, ``eps`` outside the square root) on float32
numpy arrays, one step count per shard (every parameter steps together: trainers push
zeros for a parameter without a gradient). Tested equal to torch's on the same gradients.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from graphrun.errors import ArgumentError, StoreError

Mode = Literal["sync", "async"]
MODES: tuple[Mode, ...] = ("sync", "async")


def shard_params(sizes: Mapping[str, int], servers: int) -> list[list[str]]:
    """Parameter names per server, balanced by bytes (``sizes``: name -> bytes).

    Largest first to the least loaded server (ties by name, then the lower server); each
    server's names come back in ``sizes``' order. A server may get none (more servers
    than parameters)."""
    if servers < 1:
        raise ArgumentError(f"servers: expected >= 1, got {servers}")
    load = [0] * servers
    owner: dict[str, int] = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        j = min(range(servers), key=lambda i: (load[i], i))
        owner[name] = j
        load[j] += sizes[name]
    return [[n for n in sizes if owner[n] == j] for j in range(servers)]


@dataclass(frozen=True)
class AdamConfig:
    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        for name in ("lr", "beta1", "beta2", "eps", "weight_decay"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or isinstance(v, bool) or not np.isfinite(v):
                raise ArgumentError(f"optimizer.{name}: expected a finite number, got {v!r}")
        if not (self.lr > 0 and 0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ArgumentError("optimizer: expected lr > 0 and betas in [0, 1)")


@dataclass
class DenseAdam:
    """Adam over one flat float32 vector, as ``torch.optim.Adam`` computes it."""

    config: AdamConfig
    size: int
    step: int = 0
    exp_avg: np.ndarray = field(init=False)
    exp_avg_sq: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.exp_avg = np.zeros(self.size, np.float32)
        self.exp_avg_sq = np.zeros(self.size, np.float32)

    def apply(self, param: np.ndarray, grad: np.ndarray, lr_scale: float = 1.0) -> None:
        c = self.config
        g = grad.astype(np.float32, copy=True)
        if c.weight_decay:
            g += np.float32(c.weight_decay) * param
        self.step += 1
        self.exp_avg += np.float32(1 - c.beta1) * (g - self.exp_avg)  # torch: lerp
        self.exp_avg_sq *= np.float32(c.beta2)
        self.exp_avg_sq += np.float32(1 - c.beta2) * g * g
        bc1 = 1 - c.beta1**self.step
        bc2_sqrt = (1 - c.beta2**self.step) ** 0.5
        denom = np.sqrt(self.exp_avg_sq) / np.float32(bc2_sqrt) + np.float32(c.eps)
        param -= np.float32(c.lr * lr_scale / bc1) * (self.exp_avg / denom)


@dataclass
class ShardState:
    """One parameter server's shard: parameters, optimizer, clocks (see the module doc)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    param: np.ndarray  # flat float32
    opt: DenseAdam
    trainers: int
    mode: Mode = "sync"
    staleness: int = 0
    clocks: np.ndarray = field(init=False)
    pending: np.ndarray | None = None  # sync: the sum of this step's pushes
    pushed: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ArgumentError(f"mode: {self.mode!r} is not one of {', '.join(MODES)}")
        if self.trainers < 1 or self.staleness < 0:
            raise ArgumentError("trainers must be >= 1 and staleness >= 0")
        if self.mode == "sync" and self.staleness:
            raise ArgumentError("staleness: only the async mode has one")
        sizes = sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes)
        if self.param.dtype != np.float32 or self.param.shape != (sizes,):
            raise ArgumentError(
                f"parameters: expected {sizes} float32 values for {len(self.names)} tensors, "
                f"got {self.param.dtype} {self.param.shape}"
            )
        self.clocks = np.zeros(self.trainers, np.int64)

    @property
    def clock(self) -> int:
        """The step every trainer has reached (the slowest trainer's clock)."""
        return int(self.clocks.min())

    def push(self, rank: int, clock: int, grad: np.ndarray) -> bool:
        """Trainer ``rank``'s gradient of its step ``clock``; True when it changed the
        parameters (sync: the step's last push; async: every push)."""
        if not 0 <= rank < self.trainers:
            raise ArgumentError(f"ps_push: rank {rank} is not in [0, {self.trainers})")
        if grad.shape != self.param.shape or grad.dtype.kind != "f":
            raise ArgumentError(
                f"ps_push: gradient of shape {grad.shape} {grad.dtype}, expected "
                f"{self.param.shape} float"
            )
        if clock != int(self.clocks[rank]):
            raise StoreError(
                f"ps_push: trainer {rank} pushed step {clock}, the server expects its step "
                f"{int(self.clocks[rank])} (a trainer restarted without the others?)"
            )
        if self.mode == "async":
            self.opt.apply(self.param, grad, 1.0 / self.trainers)
            self.clocks[rank] = clock + 1
            return True
        if rank in self.pushed:  # unreachable with the clock check; kept as a guard
            raise StoreError(f"ps_push: trainer {rank} pushed step {clock} twice")
        g = grad.astype(np.float32, copy=False)
        self.pending = g.copy() if self.pending is None else self.pending + g
        self.pushed.add(rank)
        if len(self.pushed) < self.trainers:
            return False
        mean = self.pending / np.float32(self.trainers)
        self.opt.apply(self.param, mean)
        self.pending, self.pushed = None, set()
        self.clocks[:] = clock + 1
        return True

    def ready(self, step: int) -> bool:
        """Whether a pull of the parameters for ``step`` can be answered now."""
        return self.clock >= step - self.staleness

    # --- checkpoints ----------------------------------------------------------------

    def save(self) -> tuple[dict[str, object], tuple[np.ndarray, ...]]:
        """``(body, (param, exp_avg, exp_avg_sq))``: what a checkpoint keeps."""
        body = {"names": list(self.names), "step": self.opt.step, "clock": self.clock}
        return body, (self.param.copy(), self.opt.exp_avg.copy(), self.opt.exp_avg_sq.copy())

    def load(self, names: Sequence[str], step: int, arrays: Sequence[np.ndarray]) -> None:
        """Restore a saved shard; every clock restarts at 0 (a resumed run's first step)."""
        if tuple(names) != self.names:
            raise ArgumentError(
                f"ps_load: the checkpoint's parameters {list(names)} are not this shard's "
                f"{list(self.names)} (another model, or another parameterServers?)"
            )
        if len(arrays) != 3 or any(a.shape != self.param.shape for a in arrays):
            raise ArgumentError("ps_load: expected parameters, exp_avg and exp_avg_sq")
        if not isinstance(step, int) or step < 0:
            raise ArgumentError(f"ps_load: step {step!r} is not a count")
        self.param[...] = arrays[0]
        self.opt.exp_avg[...] = arrays[1]
        self.opt.exp_avg_sq[...] = arrays[2]
        self.opt.step = step
        self.clocks[:] = 0
        self.pending, self.pushed = None, set()
