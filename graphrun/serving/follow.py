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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from graphrun.serving.refresh import States, by_sums, full, refresh
from graphrun.train.models import ByLayer


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
    st.load()
    st.warm(data.node_table(ntype, feature), len(model.convs), by_sums(model))
    at, passes = st.load(), 1
    while not stop.wait(poll_s):
        head = int(client.follow())
        if head > at:
            report(refresh(*what, version=head, states=st))
            at, passes = head, passes + 1
    return passes
