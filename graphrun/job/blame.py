"""Which failed role is the cause? One rule for both backends (pure).

When one role of a job fails, others fail because of it: a trainer whose collective
peer died sees gloo's "Connection closed by peer", a trainer whose store server died
sees its requests refused, a partitioning rank whose peer failed exits
:data:`~graphrun.errors.PEER_LOST_EXIT`. Whoever noticed first is often such a
bystander. ``graphrun run`` (:mod:`graphrun.local`) reads failures from its machines'
status files and its steps' exits, the operator (:mod:`graphrun.operator`) from its
pods' termination messages and the probe's members; all of them name the failure to
blame with :func:`culprit`, so a job that fails the same way is blamed the same way on
both.

The order (:func:`blame_order`): a role that failed by itself (or was killed by a
signal, or by the kernel as OOMKilled's 137) first, then one that lost a server it
called, then one that lost a peer of a collective step; among equals the earliest.
A rank's collective peer only ever ends because of something else, so a rank that
lost a server is nearer the cause than one that lost that rank, however fast it
noticed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TypeVar

from graphrun.errors import PEER_LOST_EXIT

T = TypeVar("T")

# what a role that only lost a collective peer says (gloo's words for a dead other rank)
_PEER_LOST = re.compile(
    r"Connection reset by peer|Connection closed by peer|Broken pipe|peer.*(closed|died|lost)",
    re.IGNORECASE,
)
# what a role that lost a server it called says (ZeroMQ clients, a refused connect)
_SERVER_LOST = re.compile(r"Connection refused|connection lost", re.IGNORECASE)

#: a failure as the rule reads it: (exit code, its reason, when it was seen)
Failure = tuple[int | None, str, float | datetime | None]


def blame_order(exit_code: int | None, reason: str) -> int:
    """How late a role that ended this way is blamed: 0 it failed by itself (or was
    killed by a signal), 1 it lost a server it called, 2 it lost a peer of a collective
    step (it exited :data:`~graphrun.errors.PEER_LOST_EXIT`, or gloo's dead other end)."""
    if exit_code is None or exit_code <= 0:
        return 0
    if exit_code == PEER_LOST_EXIT or _PEER_LOST.search(reason):
        return 2
    return 1 if _SERVER_LOST.search(reason) else 0


def lost_a_peer(exit_code: int | None, reason: str) -> bool:
    """Whether a role that ended this way only lost another role (a bystander: a server
    or a collective peer) rather than failing by itself."""
    return blame_order(exit_code, reason) > 0


def culprit(failed: Iterable[T], failure: Callable[[T], Failure]) -> T | None:
    """The failure to blame among ``failed`` (None if there is none): the lowest
    :func:`blame_order`, then the earliest (one seen at no known time comes after those
    that were), then the first given."""
    best: tuple[int, bool, float, int] | None = None
    chosen: T | None = None
    for i, item in enumerate(failed):
        code, reason, at = failure(item)
        when = at.timestamp() if isinstance(at, datetime) else at
        key = (blame_order(code, reason), when is None, when or 0.0, i)
        if best is None or key < best:
            best, chosen = key, item
    return chosen
