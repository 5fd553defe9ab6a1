"""The distributed context: one object, built once, passed to whatever needs it.

    ctx = initialize(["tcp://10.0.0.1:7000", "tcp://10.0.0.2:7000"], rank=0, world_size=2,
                     job="my-job", keys=load_keys("job.key"))
    g = DistGraph(ctx)
    ...
    ctx.close()   # or `with initialize(...) as ctx:`

Nothing is read from the environment: the launcher (or the user) builds a
:class:`DistConfig` at the edge and calls :func:`initialize`, and everything takes the
context it returns; only DistDGL-style calls (:mod:`~graphrun.distributed.dglnames`)
find it as the *current* context instead. The config is a plain frozen value, so
loader worker processes rebuild their own context from it (a store client is never
shared across processes or threads).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from graphrun.distributed.cache import CachePlan, FeatureCache
from graphrun.errors import ArgumentError
from graphrun.names import RoleName, home_partition
from graphrun.partition.book import PartitionBook
from graphrun.rpc.auth import KeyPair
from graphrun.sampling.distributed import DistOneHopSampler
from graphrun.store.client import ClientConfig, KVClient

_CURRENT: ContextVar[DistContext | None] = ContextVar("graphrun_context", default=None)


def current_context() -> DistContext:
    """The context :func:`initialize` made last (and not yet closed): what DistDGL-style
    calls without a context use (:mod:`graphrun.distributed.dglnames`)."""
    ctx = _CURRENT.get()
    if ctx is None:
        raise ArgumentError("no graphrun context: call graphrun.distributed.initialize(...) first")
    return ctx


@dataclass(frozen=True)
class DistConfig:
    """Everything needed to join a running store as one trainer (or one of its workers).

    ``partition`` is the trainer's home partition (the one whose ids
    :func:`~graphrun.distributed.split.node_split` prefers); None picks the co-located
    partition if there is one, else ``rank * num_parts // world_size``.
    """

    servers: tuple[str, ...]
    job: str = "default"
    keys: KeyPair | None = None
    rank: int = 0
    world_size: int = 1
    partition: int | None = None
    timeout: float = 30.0
    heartbeat_interval: float = 5.0
    use_shm: bool | None = None
    name: str = "trainer"
    machine: str = ""  # the job's name for this machine (failures name it); "" = host name
    replicas: tuple[tuple[str, ...], ...] = ()  # per server: its replicas (store/replicas.py)

    def __post_init__(self) -> None:
        if not self.servers:
            raise ArgumentError("servers: at least one store server address is needed")
        if self.world_size < 1:
            raise ArgumentError(f"world_size: must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ArgumentError(f"rank: {self.rank} is not in [0, {self.world_size})")

    def client_config(self, name: str | None = None) -> ClientConfig:
        return ClientConfig(
            servers=list(self.servers),
            job=self.job,
            keys=self.keys,
            timeout=self.timeout,
            heartbeat_interval=self.heartbeat_interval,
            use_shm=self.use_shm,
            name=name or f"{self.name}:{self.rank}",
            replicas=self.replicas,
        )

    def for_worker(self, worker: int) -> DistConfig:
        return replace(self, name=str(RoleName.sampler(self.rank, worker)))


class DistContext:
    """A joined store client plus the trainer's identity; close it when done."""

    def __init__(self, config: DistConfig) -> None:
        self.config = config
        self.client = KVClient(config.client_config(config.name))
        self.book: PartitionBook = self.client.book
        self._caches: dict[str, FeatureCache] = {}
        try:
            self.sampler = DistOneHopSampler(self.client, self.book)
            self.partition = self._home_partition()
        except BaseException:
            self.client.close()
            raise

    def feature_cache(self, plan: CachePlan) -> FeatureCache:
        """The process's one cache of ``plan`` (every loader of this process shares it)."""
        if plan.token not in self._caches:
            self._caches[plan.token] = FeatureCache(self.client, plan)
        return self._caches[plan.token]

    def _home_partition(self) -> int:
        p = self.config.partition
        num = self.book.num_parts
        if p is not None:
            if not 0 <= p < num:
                raise ArgumentError(f"partition: {p} is not in [0, {num})")
            return p
        local = self.client.local_parts
        if len(local) == 1:
            return local[0]
        return home_partition(self.config.rank, self.config.world_size, num)

    @property
    def rank(self) -> int:
        return self.config.rank

    @property
    def world_size(self) -> int:
        return self.config.world_size

    def close(self) -> None:
        if _CURRENT.get() is self:
            _CURRENT.set(None)
        self._caches.clear()
        self.client.close()

    def __enter__(self) -> DistContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"DistContext(rank={self.rank}/{self.world_size}, partition={self.partition}, "
            f"parts={self.book.num_parts}, job={self.config.job!r})"
        )


def initialize(
    servers: list[str] | tuple[str, ...],
    *,
    job: str = "default",
    keys: KeyPair | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    partition: int | None = None,
    **options: Any,
) -> DistContext:
    """Join the store serving ``servers`` (main address of every partition) as one trainer.

    ``rank``/``world_size`` default to ``torch.distributed``'s when its process group is
    initialised, else to 0 and 1. ``options``: ``timeout``, ``heartbeat_interval``,
    ``use_shm``, ``name``, ``machine``, ``replicas`` (see :class:`DistConfig`). Returns
    the context, which is also the current one (:func:`current_context`) until it is
    closed: only DistDGL-style calls read that.
    """
    if rank is None or world_size is None:
        group_rank, group_size = _process_group()
        rank = group_rank if rank is None else rank
        world_size = group_size if world_size is None else world_size
    config = DistConfig(
        tuple(servers),
        job=job,
        keys=keys,
        rank=rank,
        world_size=world_size,
        partition=partition,
        **options,
    )
    ctx = DistContext(config)
    _CURRENT.set(ctx)
    return ctx


def _process_group() -> tuple[int, int]:
    """``(rank, world_size)`` of torch.distributed's default group, or ``(0, 1)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
