"""For the test trainers of elastic groups (``tests/train/test_elastic_group.py``,
``tests/cli/test_rendezvous.py``): processes that form a group, lose a peer, re-form."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until_a_peer_is_lost(ddp: Any, report: Callable[[str], None]) -> bool:
    """All-reduce in ``ddp``'s group until a collective fails because a peer is lost:
    True. False, once ``report`` was told what happened instead: no loss within 1000
    rounds (``"no error"``), or a failure of another kind (``"not a lost peer: ..."``)."""
    from graphrun.train.ddp import all_sum
    from graphrun.train.elastic import peer_lost

    try:
        for _ in range(1000):
            all_sum([1.0], ddp)
            time.sleep(0.01)
    except RuntimeError as exc:
        if peer_lost(exc):
            return True
        report(f"not a lost peer: {exc}")
        return False
    report("no error")
    return False
