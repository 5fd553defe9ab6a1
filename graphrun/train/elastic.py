"""Elastic trainers: the survivors of a lost machine re-form and go on (``runtime.elastic``).

The protocol (docs/elastic.md):

1. **Noticed.** A trainer's collective fails: gloo raises at once when a peer's process
   died (its connections reset), and after ``timeout_s`` when a peer stopped answering
   (every group of an elastic job waits that long at most). :func:`peer_lost` tells these
   errors from the rest. The loop keeps what the epoch did so far (:class:`EpochWork`).
   A survivor shuts its connections of the broken group before anything else
   (:meth:`Regroup.abandon`, :mod:`graphrun.train.sockets`): one blocked in a receive
   from it fails at once instead of after ``timeout_s``.
2. **Re-formed.** Each survivor destroys its process group, first checks that it is not
   the one cut off (it reaches, with a TCP connect, a store server on at least
   ``min_machines - 1`` of the other machines of the group, ``cfg.probes``; else it raises
   :class:`CutOff`: on one host the rendezvous file is shared even by a host whose link is
   down), and meets the others at the job's rendezvous under a new *generation* ``g``:
   the same file (``<file>.g<g>``, one host) or trainer 0's CURVE store (``g<g>/``
   keys): never an unauthenticated listener.
   It writes ``g<g>/in/<ident>`` (``ident``: its rank in the first group; the value: its
   settle time), waits until every member of the last group wrote it or the longest
   settle time asked by those present passed (``settle_s`` when a peer's connection
   dropped: every survivor notices that at once; ``timeout_s`` when a collective timed
   out: a slow but living trainer gets as long to come), and the first to finish
   waiting fixes the members with a compare-and-set of ``g<g>/members``; everyone reads
   that one list, as soon as it is set. A trainer left out of it (too slow to notice)
   exits with an error. Fewer machines than ``min_machines`` left: every survivor raises
   :class:`BelowMinimum`, the trainers exit non-zero and the job restarts from its last
   checkpoint, as without elastic. Then ``init_process_group`` with the new ranks
   (members in ident order) on the generation's prefix.
3. **Caught up.** The new rank 0's step count, model and dense optimiser state are
   broadcast (DDP is rebuilt on the new group, which broadcasts the parameters; the Adam
   moments follow): a trainer that finished the step the others abandoned is undone.
   Sparse embeddings live in the replicated store and need nothing.
4. **Re-split.** Every survivor computes the epoch's remaining seed nodes: each member of
   the last group's batch order (the loaders' order is a function of seed, epoch and
   rank) from the steps taken on, the lost trainers' included, and deals them with
   ``node_split`` to the new group (home partitions first, equal counts). The epoch goes
   on from its step; the next epochs split the training nodes over the new group.

**Re-join.** A trainer started in *join mode* (``graphrun worker --join``, or
``GRAPHRUN_ELASTIC_JOIN=1``: a machine relaunched after its loss, or its replacement)
takes no part in the first group's rendezvous. It posts ``req/<ident> = "<time> <token>"``
at the job's *join door* (``<file>.join``, or ``elastic/join/`` keys of the CURVE store)
and waits. At every epoch boundary the group's rank 0 looks for requests of idents not
in the group and broadcasts them (one small broadcast); with any, every trainer forms
generation ``g + 1`` of the members followed by the joiners (same layout as a re-form:
``g<g>/members`` fixed with a compare-and-set, ``init_process_group`` on ``g<g>/pg``),
rank 0 answers ``ans/<ident> = "<g>,<epoch>,<token>"`` and the joiner comes in at that
epoch. The old rank 0 stays rank 0 (joiners come last), so everything is brought over
from it: the parameters (DDP on the new group), the optimiser's state (its layout first,
:func:`share_optimizer_layout`: a joiner has none). Once training is over rank 0 writes
``closed``: a joiner then ends without training.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from graphrun.errors import BelowMinimum, CutOff, GraphrunError, LeftOut, RpcTimeout
from graphrun.names import Endpoint
from graphrun.train.config import ElasticConfig
from graphrun.train.ddp import DDPConfig
from graphrun.train.rendezvous import as_bytes
from graphrun.train.sockets import opened, port_of, shut

POLL_S = 0.05
PROBE_S = 2.0  # how long a reachability probe waits for a TCP connection
# what gloo's and NCCL's errors say when a peer is gone or silent
_LOST = ("Connection closed", "Connection reset", "Broken pipe", "Timed out", "timed out",
         "timeout", "NCCL", "gloo", "Socket Timeout", "recvBytes", "sendBytes")  # fmt: skip


def reachable(
    probes: Mapping[str, Endpoint], machines: Sequence[str], timeout_s: float = PROBE_S
) -> set[str]:
    """Those of ``machines`` whose probe endpoint (``host:port`` of a store server there)
    accepts a TCP connection within ``timeout_s``, probed together; nothing is sent. A
    machine without a probe counts as reached (nothing tells otherwise)."""
    from concurrent.futures import ThreadPoolExecutor

    def reach(machine: str) -> bool:
        ep = probes.get(machine)
        if ep is None:
            return True
        try:
            socket.create_connection((ep.host.strip("[]"), ep.port), timeout=timeout_s).close()
        except (OSError, ValueError):
            return False
        return True

    if not machines:
        return set()
    with ThreadPoolExecutor(len(machines)) as pool:
        return {m for m, ok in zip(machines, pool.map(reach, machines), strict=True) if ok}


def dropped(exc: BaseException) -> bool:
    """Whether a peer's connection dropped (its process died), rather than timed out."""
    return any(s in str(exc) for s in ("Connection closed", "Connection reset", "Broken pipe"))


def peer_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because a peer died or went silent."""
    if isinstance(exc, RpcTimeout):
        return False
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(exc, dist_error):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _LOST)


@dataclass
class EpochWork:
    """What an epoch did so far on this trainer, kept across a re-form."""

    done: int = 0  # steps taken, the same on every trainer
    sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    own: dict[str, float] = field(default_factory=dict)  # this trainer's breakdown parts
    last_step_at: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)  # the epoch's start
    cpu0: float = field(default_factory=time.process_time)
    # after a re-form: each member's seed nodes for the rest of the epoch (new-rank order)
    plan: list[Tensor] | None = None
    plan_from: int = 0  # ``done`` when ``plan`` was made


def agree_members(
    store: Any,
    gen: int,
    ident: int,
    last: Sequence[int],
    settle_s: float,
    timeout_s: float,
    enough: Callable[[list[int]], bool] | None = None,
) -> list[int]:
    """The members of generation ``gen`` (idents, sorted), the same list on every survivor.

    Waits ``settle_s`` for every member of ``last``; when those present then are not
    ``enough`` (fewer machines than the job's minimum: fixing them would stop the job),
    waits on for more up to ``timeout_s``: a survivor that noticed the loss late (busy
    outside a collective when the peer died) is let in instead of being lost too.

    Each survivor writes the settle time it asks for (``g<g>/in/<ident>``) and each waits
    the longest asked by those present: one that noticed a timeout (a silent peer) gives
    a slow trainer as long to come, even where another only saw a connection close (the
    first one shut its connections). Once someone fixed the list, everyone takes it at
    once instead of waiting out its own settle time."""
    prefix = f"g{gen}/"
    store.set(f"{prefix}in/{ident}", f"{settle_s:g}".encode())
    asked: dict[int, float] = {}

    def present() -> list[int]:
        return [r for r in last if store.check([f"{prefix}in/{r}"])]

    def settle(now: list[int]) -> float:
        for r in now:
            if r not in asked:
                try:
                    asked[r] = float(as_bytes(store.get(f"{prefix}in/{r}")).decode())
                except ValueError:  # not a number: asks for nothing more
                    asked[r] = 0.0
        return max([settle_s, *(asked[r] for r in now)])

    start = time.monotonic()
    while not store.check([f"{prefix}in/{r}" for r in last]):
        if store.check([f"{prefix}members"]):
            break  # fixed by someone else: the list is final
        waited, now = time.monotonic() - start, present()
        if waited >= timeout_s or (waited >= settle(now) and (enough is None or enough(now))):
            break
        time.sleep(POLL_S)
    mine = ",".join(str(r) for r in present()).encode()
    fixed = as_bytes(store.compare_set(f"{prefix}members", b"", mine))
    if not fixed:  # an older torch store answers the expected value: read it back
        fixed = as_bytes(store.get(f"{prefix}members"))
    return [int(x) for x in fixed.decode().split(",") if x]


class Regroup:
    """This trainer's view of the elastic group: who is in it, and how to re-form it.

    ``base``: the CURVE store of a keyed TCP rendezvous (trainer 0 or ``graphrun
    rendezvous`` serves it), or None for a file rendezvous (a fresh file per generation).
    ``joining``: this trainer was not in the first group and comes in at an epoch
    boundary (:meth:`join`). ``sockets``: the first group's connections
    (:func:`graphrun.train.ddp.process_group` notes them), shut by :meth:`reform`."""

    def __init__(
        self, ddp: DDPConfig, cfg: ElasticConfig, machines: Sequence[str], base: Any = None,
        joining: bool = False, sockets: set[tuple[int, int]] | None = None,
    ) -> None:  # fmt: skip
        self.ddp = ddp
        self.cfg = cfg
        self.ident = ddp.rank
        self.machines = tuple(machines) or tuple(f"trainer{r}" for r in range(ddp.world_size))
        self.base = base
        self.members: tuple[int, ...] = tuple(range(ddp.world_size))
        self.generation = 0
        self.first_world = ddp.world_size  # idents are ranks of the first group
        self.joining = joining
        self.joined = False
        self._door: Any = None
        self._tokens: dict[int, str] = {}  # rank 0: the pending requests' tokens
        self._boundary = ""
        # the current group's connections (graphrun.train.sockets), shut when it breaks
        self.sockets: set[tuple[int, int]] = set(sockets or ())

    def home_parts(self, num_parts: int) -> list[int]:
        """Each member's home partition, in new-rank order (as in the first group)."""
        from graphrun.names import home_partition

        return [home_partition(r, len(self.machines), num_parts) for r in self.members]

    def machine_of(self, ident: int) -> str:
        return self.machines[ident] if ident < len(self.machines) else f"trainer{ident}"

    def shorten_timeout(self) -> None:
        """The first group waits ``cfg.timeout_s`` for a silent peer from now on (it was
        formed with the rendezvous timeout: trainers start at different times)."""
        from torch.distributed.distributed_c10d import _set_pg_timeout

        with contextlib.suppress(RuntimeError, ValueError):
            _set_pg_timeout(timedelta(seconds=self.cfg.timeout_s))

    def _store(self, gen: int) -> Any:
        if self.base is not None:
            return dist.PrefixStore("elastic/", self.base)
        url = self.ddp.rendezvous
        if not url.startswith("file://"):
            raise BelowMinimum(
                f"cannot re-form: rendezvous {url!r} is neither a file nor the job's CURVE store"
            )
        store = dist.FileStore(f"{url.removeprefix('file://')}.g{gen}", -1)
        store.set_timeout(timedelta(seconds=self.ddp.timeout_s))
        return store

    def reform(self, settle_s: float | None = None) -> DDPConfig:
        """Destroy the broken group and form the next one of the survivors; returns the
        new :class:`DDPConfig` (rank and world size in the new group). ``settle_s``: how
        long to wait for the last group's members (default ``cfg.settle_s``)."""
        settle = self.cfg.settle_s if settle_s is None else settle_s
        gen = self.generation + 1
        self.abandon()
        self.check_not_cut_off()
        try:
            store = self._store(gen)
            # fewer than min_machines present after the settle time: a late survivor gets
            # timeout_s more (it may have been stuck in a store request that long)
            members = agree_members(
                store, gen, self.ident, self.members, settle, settle + self.cfg.timeout_s,
                lambda idents: len({self.machine_of(r) for r in idents}) >= self.cfg.min_machines,
            )  # fmt: skip
        except RpcTimeout as exc:  # trainer 0's CURVE store went with its machine
            raise BelowMinimum(f"cannot re-form: the rendezvous is gone ({exc})") from None
        if self.ident not in members:
            raise LeftOut(
                f"trainer {self.ident}: the other trainers re-formed without it "
                f"(generation {gen}: {members})"
            )
        left = {self.machine_of(r) for r in members}
        if len(left) < self.cfg.min_machines:
            lost = sorted({self.machine_of(r) for r in self.members} - left)
            raise BelowMinimum(
                f"lost machine(s) {', '.join(lost)}: {len(left)} left, fewer than "
                f"runtime.elastic.minMachines ({self.cfg.min_machines}); restarting instead"
            )
        self.generation, self.members = gen, tuple(members)
        self.ddp = self._init(gen, store)
        return self.ddp

    def abandon(self) -> None:
        """Leave the broken group: shut its connections first, so that a survivor blocked
        in a receive from this trainer fails at once (and comes to the re-form) instead of
        waiting out the collective timeout (:mod:`graphrun.train.sockets`), then destroy
        it."""
        shut(self.sockets)
        self.sockets = set()
        if dist.is_initialized():
            with contextlib.suppress(RuntimeError, ValueError):
                dist.destroy_process_group()

    def lost_since(self, before: Sequence[int]) -> list[int]:
        return [r for r in before if r not in self.members]

    # ---- re-join at an epoch boundary ---------------------------------------------------

    def door(self) -> Any:
        """Where joiners ask to come in: the CURVE store's ``elastic/join/`` keys, or the
        file ``<rendezvous file>.join`` (in the run directory's 0700 rendezvous folder)."""
        if self._door is None:
            if self.base is not None:
                self._door = dist.PrefixStore("elastic/join/", self.base)
            else:
                url = self.ddp.rendezvous
                if not url.startswith("file://"):
                    raise GraphrunError(
                        f"cannot join: rendezvous {url!r} is neither a file nor the job's "
                        "CURVE store"
                    )
                self._door = dist.FileStore(f"{url.removeprefix('file://')}.join", -1)
                self._door.set_timeout(timedelta(seconds=self.ddp.timeout_s))
        return self._door

    def pending(self, epoch: int) -> dict[int, float]:
        """Rank 0: the trainers waiting to join (ident: when each asked), at the boundary
        before ``epoch`` (which is marked, so a waiting joiner knows the group lives).
        A request is ``"<time> <token>"`` (empty: taken back); it is answered once
        ``ans/<ident>`` carries its token. Nothing is ever deleted: the CURVE store's
        keys are reached through a ``PrefixStore``, which cannot delete them."""
        door = self.door()
        door.set("boundary", str(epoch).encode())
        out = {}
        for r in range(self.first_world):
            if r in self.members or not door.check([f"req/{r}"]):
                continue
            when, _, token = as_bytes(door.get(f"req/{r}")).decode().partition(" ")
            if token and _answer(door, r)[2] != token:
                out[r] = float(when)
                self._tokens[r] = token
        return out

    def agree_joiners(self, epoch: int) -> dict[int, float]:
        """The joiners every trainer lets in before ``epoch``: rank 0's :meth:`pending`,
        broadcast (ident: when it asked)."""
        asked: dict[int, float] = {}
        if self.ddp.rank == 0:
            try:
                asked = self.pending(epoch)
            except (RuntimeError, ValueError, RpcTimeout) as exc:  # the group goes on as is
                print(f"elastic: cannot read the join requests ({exc})", file=sys.stderr)
        t = torch.zeros(self.first_world, dtype=torch.float64)
        for r, when in asked.items():
            t[r] = max(when, 1e-9)
        t = t.to(self.ddp.collective_device)
        dist.broadcast(t, 0)
        return {r: float(v) for r, v in enumerate(t.tolist()) if v > 0}

    def grow(self, joiners: Sequence[int], epoch: int) -> DDPConfig:
        """Form generation ``g + 1`` of the members and ``joiners`` (:meth:`admit`);
        returns the new config."""
        gen, store = self.admit(joiners, epoch)
        with contextlib.suppress(RuntimeError, ValueError):
            dist.destroy_process_group()
        self.ddp = self._init(gen, store)
        return self.ddp

    def admit(self, joiners: Sequence[int], epoch: int) -> tuple[int, Any]:
        """Fix generation ``g + 1``'s members: the members, then ``joiners`` (new ranks in
        that order: rank 0 stays rank 0); rank 0 answers the joiners. Returns the new
        generation and its store; from now on this is the group a re-form starts from."""
        gen = self.generation + 1
        store = self._store(gen)
        members = [*self.members, *sorted(joiners)]
        mine = ",".join(str(r) for r in members).encode()
        fixed = as_bytes(store.compare_set(f"g{gen}/members", b"", mine)) or mine
        members = [int(x) for x in fixed.decode().split(",") if x]
        if self.ddp.rank == 0:
            door = self.door()
            for r in joiners:
                door.set(f"ans/{r}", f"{gen},{epoch},{self._tokens.get(r, '')}".encode())
        self.generation, self.members = gen, tuple(members)
        return gen, store

    def join(self, stopped: Callable[[], bool] = lambda: False) -> tuple[DDPConfig, int] | None:
        """A joiner: ask to come in and wait for the epoch boundary that lets it in
        (:meth:`admission`); returns its config in the grown group and the epoch it starts
        with, or None when the trainers finished first or it was told to stop."""
        got = self.admission(stopped)
        if got is None:
            return None
        gen, epoch, store = got
        self.ddp = self._init(gen, store)
        self.joined = True
        return self.ddp, epoch

    def admission(self, stopped: Callable[[], bool] = lambda: False) -> tuple[int, int, Any] | None:
        """Ask to come in (``req/<ident>``) and wait for the answer: ``(generation, epoch,
        its store)`` with the members set, or None once the door is closed or ``stopped()``
        (SIGTERM: its request is taken back). Raises when no epoch boundary passed for the
        rendezvous timeout (``ddp.timeout_s``)."""
        door, me = self.door(), self.ident
        token = f"{os.getpid()}-{time.time_ns()}"  # tells its answer from an earlier one's
        door.set(f"req/{me}", f"{time.time()} {token}".encode())
        deadline = time.monotonic() + self.ddp.timeout_s
        while _answer(door, me)[2] != token:
            if door.check(["closed"]):
                return None
            if stopped():
                door.set(f"req/{me}", b"")  # taken back
                if _answer(door, me)[2] != token:  # unless let in meanwhile: then it comes
                    return None
                break
            if door.check(["boundary"]):
                mark = as_bytes(door.get("boundary")).decode()
                if mark != self._boundary:  # the group lives: wait on
                    self._boundary, deadline = mark, time.monotonic() + self.ddp.timeout_s
            if time.monotonic() > deadline:
                raise GraphrunError(
                    f"trainer {me}: asked to join, but the trainers passed no epoch boundary "
                    f"in {self.ddp.timeout_s:g}s (the rendezvous timeout)"
                )
            time.sleep(4 * POLL_S)
        gen, epoch, _ = _answer(door, me)
        store = self._store(gen)
        members = [int(x) for x in as_bytes(store.get(f"g{gen}/members")).decode().split(",") if x]
        if me not in members:
            raise LeftOut(f"trainer {me}: generation {gen} ({members}) does not include it")
        self.generation, self.members = gen, tuple(members)
        return gen, epoch, store

    def close_door(self) -> None:
        """Rank 0, once training is over: a waiting (or later) joiner ends at once."""
        with contextlib.suppress(RuntimeError, ValueError, RpcTimeout):
            self.door().set("closed", b"1")

    def _init(self, gen: int, store: Any) -> DDPConfig:
        """``init_process_group`` for this trainer in generation ``gen`` (``self.members``)."""
        new = replace(self.ddp, rank=self.members.index(self.ident), world_size=len(self.members))
        self.sockets = set()
        if new.world_size > 1:
            with opened(self.sockets, port_of(self.ddp.rendezvous) if self.base else None):
                dist.init_process_group(
                    new.resolved_backend, store=dist.PrefixStore(f"g{gen}/pg", store),
                    rank=new.rank, world_size=new.world_size,
                    timeout=timedelta(seconds=self.cfg.timeout_s),
                )  # fmt: skip
        return new

    def check_not_cut_off(self) -> None:
        """Raise :class:`CutOff` when this trainer reaches a store server on fewer than
        ``min_machines - 1`` of the group's other machines (``cfg.probes``)."""
        own = self.machine_of(self.ident)
        others = sorted({self.machine_of(r) for r in self.members} - {own})
        if not self.cfg.probes or not others:
            return
        reached = reachable(dict(self.cfg.probes), others)
        if len(reached) + 1 < self.cfg.min_machines:
            raise CutOff(
                f"trainer {self.ident} on {own}: reaches {len(reached)} of the other "
                f"machines ({', '.join(others)}), fewer than runtime.elastic.minMachines - 1 "
                f"({self.cfg.min_machines - 1}): this machine is cut off; the others go on"
            )


def _answer(door: Any, ident: int) -> tuple[int, int, str]:
    """``ans/<ident>``: ``(generation, epoch, token)``, or ``(0, 0, "")`` when unset."""
    if not door.check([f"ans/{ident}"]):
        return 0, 0, ""
    gen, epoch, token = as_bytes(door.get(f"ans/{ident}")).decode().split(",")
    return int(gen), int(epoch), token


def broadcast_optimizer(opt: torch.optim.Optimizer, ddp: DDPConfig) -> None:
    """Every tensor of ``opt``'s state from rank 0 (all trainers took the same steps, so
    they hold the same keys; a trainer without state yet takes none)."""
    if ddp.world_size == 1:
        return
    from graphrun.train.ddp import all_min

    if not all_min(1 if opt.state else 0, ddp):
        return
    for group in opt.param_groups:
        for p in group["params"]:
            for v in opt.state.get(p, {}).values():
                if isinstance(v, Tensor):
                    t = v.to(ddp.collective_device)
                    dist.broadcast(t, 0)
                    if t is not v:
                        v.copy_(t)


def share_optimizer_layout(opt: torch.optim.Optimizer, ddp: DDPConfig) -> None:
    """Rank 0's optimiser state layout on every trainer that has no state yet (a joiner):
    zero tensors of rank 0's shapes and dtypes (Adam's ``step`` included), and rank 0's
    group settings (``lr``, ...), so that :func:`broadcast_optimizer` then fills them.
    Two broadcasts (the layout's length, then its JSON bytes); no pickle."""
    if ddp.world_size == 1:
        return
    params = [p for g in opt.param_groups for p in g["params"]]
    layout = b""
    if ddp.rank == 0:
        state = []
        for i, p in enumerate(params):
            entry: dict[str, dict[str, Any]] = {}
            for k, v in opt.state.get(p, {}).items():
                if isinstance(v, Tensor):
                    dtype = str(v.dtype).removeprefix("torch.")
                    entry[k] = {
                        "shape": list(v.shape),
                        "dtype": dtype,
                        "on_param": v.device == p.device,
                    }
                elif isinstance(v, int | float | bool):
                    entry[k] = {"value": v}
            if entry:
                state.append([i, entry])
        groups = [
            {k: v for k, v in g.items() if k != "params" and isinstance(v, int | float | bool)}
            for g in opt.param_groups
        ]
        layout = json.dumps({"state": state, "groups": groups}).encode()
    dev = ddp.collective_device
    n = torch.tensor([len(layout)], dtype=torch.int64, device=dev)
    dist.broadcast(n, 0)
    buf = torch.zeros(int(n.item()), dtype=torch.uint8, device=dev)
    if ddp.rank == 0:
        buf.copy_(torch.frombuffer(bytearray(layout), dtype=torch.uint8))
    dist.broadcast(buf, 0)
    if ddp.rank == 0 or opt.state:
        return
    got = json.loads(bytes(buf.cpu().numpy().tobytes()).decode())
    for group, settings in zip(opt.param_groups, got["groups"], strict=True):
        group.update(settings)
    for i, entry in got["state"]:
        p = params[i]
        opt.state[p] = {k: _zeros_like_entry(e, p.device) for k, e in entry.items()}


def _zeros_like_entry(e: dict[str, Any], device: torch.device) -> object:
    """A state value of :func:`share_optimizer_layout`'s layout: zeros, or the value."""
    if "shape" not in e:
        return e["value"]
    where = device if e["on_param"] else torch.device("cpu")
    return torch.zeros(e["shape"], dtype=getattr(torch, e["dtype"]), device=where)


def remaining(orders: Sequence[Tensor], steps_taken: int, batch_size: int) -> Tensor:
    """The seed nodes of every member's batches from step ``steps_taken`` on."""
    rest = [o[steps_taken * batch_size :] for o in orders]
    return torch.cat(rest) if rest else torch.empty(0, dtype=torch.int64)


def plan_rest(
    rest: Tensor, world: int, split: Callable[[Tensor, int, int], Tensor], seed: int, epoch: int
) -> list[Tensor]:
    """``rest`` dealt to the ``world`` trainers of the new group (``split(ids, rank,
    world)``: node_split with the members' home partitions), each share shuffled as the
    loaders shuffle (``seed + rank``, ``epoch``). A split sorts the ids: dealt in that
    order, a survivor trained the rest of the epoch in node-id order, which on a graph
    whose ids follow its communities is batches of one class after another, and the
    epoch ended on a model drawn to the last ones (validation 0.65 against 0.88)."""
    from graphrun.distributed.minibatch import shuffled

    return [shuffled(split(rest, r, world), seed + r, epoch) for r in range(world)]
