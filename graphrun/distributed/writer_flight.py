"""A pipelined :class:`~graphrun.distributed.writer.GraphWriter`'s batches on their way
(:class:`Flight`) and what the caller hears of each (:class:`Answer`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphrun.distributed.writer_plan import Plan
from graphrun.errors import ArgumentError, StoreError
from graphrun.rpc.codec import Message
from graphrun.store.session import Pending


def own_held(reply: Message) -> bool:
    """Whether partition 0's piece rode in this ``live_begin`` and is held there (not:
    none rode, or it was told ``retry_after``, or the server predates it: it goes as a
    ``live_prepare``); its refusal is raised."""
    own = reply.body.get("piece")
    if not isinstance(own, dict):
        return False
    if "refused" in own:
        kind = ArgumentError if own.get("error") == "ArgumentError" else StoreError
        raise kind(str(own["refused"]))
    return "held" in own


LOCKSTEP_AGE = {"begin": 1, "prepare": 2, "decide": 4}  # submits since its own


@dataclass(frozen=True)
class Answer:
    """A submitted batch's fate: ``tag`` as given to ``submit``, and its ``version``
    (acknowledged) or the ``error`` that refused it (``version`` 0: nothing applied).
    ``unknown``: its commit was sent and the sequencer's answer lost (``error`` says so,
    ``version`` is its version): it may be committed; :meth:`GraphWriter.settle` asks."""

    tag: object
    version: int
    error: BaseException | None = None
    unknown: bool = False


@dataclass
class Flight:
    """One submitted batch on its way: ``begin`` (live_begin sent), ``prepare`` (its
    pieces sent), ``decide`` (decided: carried by ``carrier``'s live_begin, or not sent
    yet), ``done``."""

    plan: Plan
    begun: Pending
    stage: str = "begin"
    version: int = 0
    commit: bool = False
    pieces: dict[int, tuple[dict[str, object], list[np.ndarray]]] = field(default_factory=dict)
    sent: dict[int, Pending] = field(default_factory=dict)
    reply: Message | Exception | None = None  # live_begin's answer (or its refusal)
    carrier: Flight | None = None  # the flight whose live_begin carried this decision
    decide: Pending | None = None  # or its live_decide
    error: BaseException | None = None
    deadline: float = 0.0
    age: int = 0  # submits since its own
    tag: object = None  # the caller's name for it (``submit``'s)
    unknown: bool = False  # its commit sent, the sequencer's answer lost


@dataclass(frozen=True)
class Unknown:
    """A batch whose commit was sent and whose answer was lost: its ``tag``, ``version``
    and the partitions besides 0 holding a piece of it (told its fate once known)."""

    tag: object
    version: int
    parts: tuple[int, ...]
