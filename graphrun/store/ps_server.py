"""A parameter server process (``graphrun ps``): one shard of a job's dense parameters.

It is a store server without a partition: the same ROUTER loop, wire codec, ``Limits``
and CURVE with the job's key (only the job's own processes get in: a parameter server
serves one job), and its state is :class:`~graphrun.store.ps_state.ShardState`.

=========  ==============================================================================
op         body; tensors -> reply
=========  ==============================================================================
stats      -> {"role", "ready", "clock", "parked"}   (readiness probe, as a store's stats)
ps_init    names, shapes, trainers, mode, staleness, optimizer; (param,) -> {}
ps_push    rank, clock; (grad,) -> {}
ps_pull    step -> {"clock"}; (param,), answered once the step's parameters exist
ps_save    -> {"names", "step", "clock"}; (param, exp_avg, exp_avg_sq)
ps_load    names, step; (param, exp_avg, exp_avg_sq) -> {}
stop       -> {} and the server shuts down
=========  ==============================================================================

Each body is read as its declared type (:class:`InitBody`, :class:`PushBody`,
:class:`PullBody`, :class:`LoadBody`, as the store's are in :mod:`.requests`): every
field checked at once, a bad one refused with one line naming the operation and field.

``ps_pull`` is the one request answered late: a pull for a step whose parameters are
not there yet (sync: not every trainer pushed; async: a trainer more than ``staleness``
steps behind; or ``ps_init`` not received) is parked and answered when a push makes it
ready. A parked pull keeps its peer, request id and step, never its request's frames; at
most :data:`PARKED_PER_PEER` a peer and :data:`PARKED` in all wait (a pull past them is
refused with an error), and one parked longer than :data:`PARK_S` (the trainer's own wait)
is answered with an error and forgotten; one whose connection closes is forgotten then.
Every count in a request is bounded: ``trainers`` by :data:`MAX_TRAINERS`, ``staleness``
and every step and clock by :data:`MAX_STEP`, a shape's sizes by what the parameters
frame can hold. (Before: 12 parked pulls kept +384 MiB, and ``trainers`` 2^27 took 1 GiB.)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import numpy as np

from graphrun.errors import ArgumentError, StoreError
from graphrun.names import MAX_TRAINERS, RoleName
from graphrun.rpc.auth import KeyPair
from graphrun.rpc.codec import DEFAULT_LIMITS, Limits, Message, MsgKind, error_message
from graphrun.rpc.transport import RpcServer
from graphrun.store.ps_state import AdamConfig, DenseAdam, ShardState
from graphrun.wire import convert

log = logging.getLogger("graphrun.ps")
T = TypeVar("T")

MAX_STEP = 1 << 62  # steps, clocks, staleness
MAX_NDIM = DEFAULT_LIMITS.max_ndim  # dimensions of a parameter
PARKED_PER_PEER = 4  # pulls waiting for one trainer (one per step it is ahead, a retry)
PARKED = 4 * MAX_TRAINERS  # pulls waiting in all
PARK_S = 300.0  # a parked pull's deadline (the trainers' PSClient timeout)


@dataclass(frozen=True)
class Parked:
    """A pull waiting for its step: what its answer needs, nothing of its request."""

    peer: bytes
    request_id: int
    step: int
    until: float  # time.monotonic() deadline
    conn: int  # the connection it came on (its fd; -1: none known)


@dataclass(frozen=True)
class PSConfig:
    index: int
    address: str = "tcp://127.0.0.1:0"
    keys: KeyPair | None = None
    profile_file: Path | None = None  # at stop, append a PSRecord line (placement profile)
    limits: Limits = DEFAULT_LIMITS  # what one request may be (graphrun.rpc.codec)


Step = Annotated[int, msgspec.Meta(ge=0, le=MAX_STEP)]  # a step, clock, rank or staleness
Size = Annotated[int, msgspec.Meta(ge=0)]
OPTIMIZER = frozenset(f.name for f in fields(AdamConfig))


class InitBody(msgspec.Struct, frozen=True, kw_only=True):
    """``ps_init``: the shard's parameters (a name and a shape each, in the order of the
    parameters frame), how many trainers push, and how."""

    names: list[str]
    shapes: list[Annotated[list[Size], msgspec.Meta(max_length=MAX_NDIM)]]
    trainers: Annotated[int, msgspec.Meta(ge=0, le=MAX_TRAINERS)]
    staleness: Step
    mode: Literal["sync", "async"] = "sync"
    optimizer: dict[str, float] = msgspec.field(default_factory=dict)  # AdamConfig's fields

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.names):
            raise ValueError(f"shapes: {len(self.shapes)} for {len(self.names)} names")
        for s in self.shapes:
            if math.prod(s) > MAX_STEP:  # int64 overflow could match
                raise ValueError(f"shapes: {s} is not a tensor's")
        if set(self.optimizer) - OPTIMIZER:
            raise ValueError(f"optimizer: unknown keys {sorted(set(self.optimizer) - OPTIMIZER)}")


class PushBody(msgspec.Struct, frozen=True):
    """``ps_push``: trainer ``rank``'s gradient of its step ``clock``."""

    rank: Step
    clock: Step


class PullBody(msgspec.Struct, frozen=True):
    """``ps_pull``: the parameters of ``step`` (answered once they exist)."""

    step: Step


class LoadBody(msgspec.Struct, frozen=True):
    """``ps_load``: a saved shard (its parameter names and step) back in."""

    names: list[str]
    step: Step


def _args(type_: type[T], msg: Message) -> T:
    """The body of ``msg`` as ``type_``: ArgumentError naming the operation and field."""
    return convert(type_, msg.body, msg.op, ArgumentError)


def _tensor(msg: Message, i: int, what: str) -> np.ndarray:
    if i >= len(msg.tensors):
        raise ArgumentError(f"{msg.op}: tensor {i} ({what}) is missing")
    return msg.tensors[i]


def init_shard(body: InitBody, tensors: tuple[np.ndarray, ...]) -> ShardState:
    """The shard a ``ps_init`` request describes."""
    if not tensors:
        raise ArgumentError("ps_init: tensor 0 (parameters) is missing")
    param = np.array(tensors[0], dtype=np.float32, copy=True)  # a frame is read-only
    return ShardState(
        names=tuple(body.names),
        shapes=tuple(tuple(s) for s in body.shapes),
        param=param,
        opt=DenseAdam(AdamConfig(**body.optimizer), param.size),
        trainers=body.trainers,
        mode=body.mode,
        staleness=body.staleness,
    )


class ParameterServer:
    """The request handler and the parked pulls of one parameter server."""

    def __init__(self, index: int) -> None:
        self.name = str(RoleName.ps(index))
        self.shard: ShardState | None = None
        self.parked: list[Parked] = []
        self.pushes = 0  # gradients received (the profile's CPU per step divides by them)
        self.stop_requested = False
        self.reply: Callable[[bytes, Message], None] = lambda peer, msg: None
        self.conn: Callable[[], int] = lambda: -1  # the current request's connection

    def handle(self, peer: bytes, msg: Message) -> Message | None:
        op = msg.op
        if op == "stats":
            clock = self.shard.clock if self.shard else None
            return self._ok(msg, {"role": self.name, "ready": self.shard is not None,
                                  "clock": clock, "parked": len(self.parked)})  # fmt: skip
        if op == "stop":
            self.stop_requested = True
            return self._ok(msg)
        if op == "ps_init":
            self.shard = init_shard(_args(InitBody, msg), msg.tensors)
            log.info("%s: %d parameters (%d values), %s, %d trainers, staleness %d",
                     self.name, len(self.shard.names), self.shard.param.size,
                     self.shard.mode, self.shard.trainers, self.shard.staleness)  # fmt: skip
            self._release()
            return self._ok(msg)
        if op == "ps_pull":
            step = _args(PullBody, msg).step
            if self.shard is None or not self.shard.ready(step):
                self._park(peer, msg.request_id, step)
                return None
            return self._params(msg.request_id)
        shard = self._shard(op)
        if op == "ps_push":
            push = _args(PushBody, msg)
            if shard.push(push.rank, push.clock, _tensor(msg, 0, "gradient")):
                self._release()
            self.pushes += 1
            return self._ok(msg)
        if op == "ps_save":
            saved, arrays = shard.save()
            return Message(MsgKind.REPLY, op, msg.request_id, saved, arrays)
        if op == "ps_load":
            load = _args(LoadBody, msg)
            shard.load(load.names, load.step, msg.tensors)
            return self._ok(msg)
        raise ArgumentError(f"unknown operation {op!r}")

    def _shard(self, op: str) -> ShardState:
        if self.shard is None:
            raise StoreError(f"{op}: {self.name} has no parameters yet (no ps_init)")
        return self.shard

    @staticmethod
    def _ok(msg: Message, body: dict[str, Any] | None = None) -> Message:
        return Message(MsgKind.REPLY, msg.op, msg.request_id, body or {})

    def _params(self, request_id: int) -> Message:
        shard = self._shard("ps_pull")
        body = {"clock": shard.clock}
        return Message(MsgKind.REPLY, "ps_pull", request_id, body, (shard.param.copy(),))

    def _park(self, peer: bytes, request_id: int, step: int) -> None:
        mine = sum(p.peer == peer for p in self.parked)
        if mine >= PARKED_PER_PEER or len(self.parked) >= PARKED:
            limit = f"{PARKED_PER_PEER} a peer" if mine >= PARKED_PER_PEER else f"{PARKED} in all"
            raise StoreError(f"ps_pull: too many pulls wait for their step ({limit})")
        until = time.monotonic() + PARK_S
        self.parked.append(Parked(peer, request_id, step, until, self.conn()))

    def disconnected(self, conn: int) -> None:
        """Forget the pulls parked on connection ``conn``, closed (no one to answer)."""
        self.parked = [p for p in self.parked if p.conn != conn]

    def _release(self) -> None:
        """Answer the parked pulls that are ready now."""
        shard = self.shard
        if shard is None or not self.parked:
            return
        keep = []
        for p in self.parked:
            if shard.ready(p.step):
                self.reply(p.peer, self._params(p.request_id))
            else:
                keep.append(p)
        self.parked = keep

    def expire(self) -> None:
        """Answer the parked pulls past their deadline with an error, and forget them."""
        now = time.monotonic()
        late = [p for p in self.parked if p.until < now]
        if not late:
            return
        self.parked = [p for p in self.parked if p.until >= now]
        text = f"step not ready within {PARK_S:g} s (a trainer gone?)"
        for p in late:
            self.reply(p.peer, error_message(p.request_id, "ps_pull", "StoreError", text))


def run_ps(
    cfg: PSConfig,
    should_stop: Callable[[], bool] = lambda: False,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve one parameter-server shard until a ``stop`` request or ``should_stop()``."""
    ps = ParameterServer(cfg.index)
    server = RpcServer(cfg.address, ps.handle, keys=cfg.keys, limits=cfg.limits, name=ps.name)
    ps.reply = server.reply
    ps.conn = lambda: server.current_conn
    server.on_disconnect = ps.disconnected
    try:
        log.info("%s serving on %s", ps.name, server.address)
        if on_ready is not None:
            on_ready(server.address)
        t0 = time.process_time()
        server.serve_forever(lambda: ps.stop_requested or should_stop(), ps.expire)
        cpu_s = time.process_time() - t0
        log.info("%s stopping; clock %s, %d pushes, cpu %.2fs", ps.name,
                 ps.shard.clock if ps.shard else None, ps.pushes, cpu_s)  # fmt: skip
        if cfg.profile_file is not None:  # imported here: pydantic stays off start-up
            from graphrun.placement.profile import PSRecord

            trainers = ps.shard.trainers if ps.shard else 1
            with open(cfg.profile_file, "a") as f:
                rec = PSRecord(index=cfg.index, cpu_s=cpu_s, pushes=ps.pushes, trainers=trainers)
                f.write(rec.to_json() + "\n")
    finally:
        server.close()
