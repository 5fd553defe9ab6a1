"""The name of each process of a job: ``store:P`` (``store:P:B`` for backup B,
``store:P:r`` for the replica of partition P on another machine, ``store:P:rK`` for
replica K > 1), ``trainer:R``, ``sampler:R:W`` and ``ps:J`` (a parameter server,
``training.sync: ps``). :class:`RoleName` formats (``str()``) and parses
(:meth:`parse`) them; nothing else spells them out. :func:`home_partition` is the one
definition of the
partition a trainer trains on, for the runtime and the placement model alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["store", "trainer", "sampler", "ps"]
KINDS: tuple[Kind, ...] = ("store", "trainer", "sampler", "ps")


@dataclass(frozen=True, order=True)
class RoleName:
    kind: Kind
    index: int  # the partition of a store, the rank of a trainer or sampler, a ps number
    sub: int = 0  # the backup of a store (0: the main server), the worker of a sampler
    replica: int = 0  # a store's replica (0: the partition's primary), see store/replicas.py

    @classmethod
    def store(cls, part: int, backup: int = 0, replica: int = 0) -> RoleName:
        return cls("store", part, backup, replica)

    @classmethod
    def trainer(cls, rank: int) -> RoleName:
        return cls("trainer", rank)

    @classmethod
    def sampler(cls, rank: int, worker: int) -> RoleName:
        return cls("sampler", rank, worker)

    @classmethod
    def ps(cls, index: int) -> RoleName:
        return cls("ps", index)

    @classmethod
    def parse(cls, text: str) -> RoleName:
        """The role named ``text``; ValueError naming it when it is no role's name."""
        kind, *numbers = str(text).split(":")
        if kind == "store" and len(numbers) == 2 and numbers[1].startswith("r"):
            k = numbers[1][1:] or "1"
            if numbers[0].isdigit() and k.isdigit() and int(k) >= 1:
                return cls("store", int(numbers[0]), 0, int(k))
        arity = {"store": (1, 2), "trainer": (1,), "sampler": (2,), "ps": (1,)}.get(kind, ())
        if len(numbers) not in arity or not all(n.isdigit() for n in numbers):
            raise ValueError(
                f"{text!r} is not a role name (store:P[:B], store:P:r[K], trainer:R, "
                "sampler:R:W, ps:J)"
            )
        return cls(kind, *(int(n) for n in numbers))  # type: ignore[arg-type]

    def __str__(self) -> str:
        if self.kind == "store" and self.replica:
            return f"store:{self.index}:r" + (str(self.replica) if self.replica > 1 else "")
        if self.kind == "sampler" or (self.kind == "store" and self.sub):
            return f"{self.kind}:{self.index}:{self.sub}"
        return f"{self.kind}:{self.index}"


def home_partition(rank: int, world_size: int, num_parts: int) -> int:
    """Trainer ``rank``'s home partition of ``num_parts``: ``rank * num_parts //
    world_size`` (consecutive ranks share a partition when there are more trainers than
    partitions, as consecutive ranks share a machine). The runtime splits the training
    ids by it (:func:`graphrun.distributed.split.node_split`) and the placement model
    charges a trainer's "own" bytes to that partition's store."""
    return rank * num_parts // world_size
