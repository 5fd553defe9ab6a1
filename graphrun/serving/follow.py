"""A refresher that stays up: the kept states follow the live graph's head.

``graphrun infer embed --live --follow`` (or ``--refresh --follow``) runs the kept pass
(or a refresh) once, then every ``poll_s`` asks the head and, when it moved, refreshes
to it (:func:`graphrun.serving.refresh.refresh`), reporting each pass. Between
refreshes it keeps what a refresh in a process of its own pays for again each time: the
store's sessions and sockets, the attached tables and their shared-memory mappings
(:meth:`States.warm`, once, before the first refresh), the head it asked (the refresh
reads at it without asking again), torch's and numpy's first calls. A refresh after
1,000 new edges then costs the requests that depend on the change (what changed, the
edges leaving it, one write a partition, the version) and the sums' arithmetic.

A refresh that fails (a partition's server gone, a request timed out) is tried again
after ``poll_s``, then twice that, and so on: the next refresh finishes the one that
failed partway (:mod:`graphrun.serving.refresh`). After ``ATTEMPTS`` failures in a row
the refresher stops with a StoreError carrying the last one; the states stay as they
were, and a refresh started later finishes them all the same.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from graphrun.errors import GraphrunError, StoreError
from graphrun.serving.refresh import States, by_sums, full, refresh
from graphrun.train.models import ByLayer

ATTEMPTS = 5  # refreshes in a row that fail before the refresher stops
log = logging.getLogger(__name__)


def follow(
    model: ByLayer, data: Any, ntype: str, feature: str, batch_size: int, *, live: bool,
    poll_s: float, stop: threading.Event, report: Callable[[dict[str, Any]], None],
) -> int:  # fmt: skip
    """The kept pass (``live``) or a refresh, then a refresh each time the head moves,
    until ``stop`` is set; each pass's result to ``report``. Returns the passes run."""
    what = (model, data, ntype, feature, batch_size)
    client = data.graph.ctx.client
    st = States(client, ntype)
    report(full(*what) if live else refresh(*what, states=st))
    at, passes, failed = st.load(), 1, 0
    st.warm(data.node_table(ntype, feature), len(model.convs), by_sums(model))
    while not stop.wait(poll_s * 2**failed):
        try:
            head = int(client.follow())
            if head > at:
                report(refresh(*what, version=head, states=st))
                at, passes = head, passes + 1
            failed = 0
        except GraphrunError as exc:
            failed += 1
            if failed == ATTEMPTS:
                raise StoreError(f"follow: {ATTEMPTS} refreshes in a row failed, the states "
                                 f"stay at version {at} (a refresh finishes them); the last: "
                                 f"{exc}") from exc  # fmt: skip
            log.warning("follow: refresh to the head failed (%d of %d): %s", failed,
                        ATTEMPTS, exc)  # fmt: skip
    return passes
