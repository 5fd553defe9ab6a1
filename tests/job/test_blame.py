"""The one rule that names the failure to blame (graphrun.job.blame), read by both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from graphrun.errors import PEER_LOST_EXIT
from graphrun.job.blame import blame_order, culprit, lost_a_peer

GLOO = "RuntimeError: [gloo] Connection closed by peer [10.0.0.2]:4000"
REFUSED = "ConnectionError: store:0 at 10.0.0.1:5000: Connection refused"


@pytest.mark.parametrize(
    ("code", "reason", "order"),
    [
        (1, "ValueError: boom", 0),
        (137, "OOMKilled", 0),
        (-9, "killed by SIGKILL", 0),
        (None, "", 0),
        (1, REFUSED, 1),
        (1, GLOO, 2),
        (PEER_LOST_EXIT, "rank 1 lost", 2),
        (-9, GLOO, 0),  # killed by a signal: the cause, whatever it printed before
    ],
)
def test_the_order_reads_the_exit_and_the_reason(code: int | None, reason: str, order: int) -> None:
    assert blame_order(code, reason) == order
    assert lost_a_peer(code, reason) == (order > 0)


def test_who_failed_by_itself_is_blamed_before_earlier_bystanders() -> None:
    t = datetime(2026, 11, 29, tzinfo=UTC)
    failed = [
        ("m1 lost its peer", PEER_LOST_EXIT, GLOO, t),
        ("m2 lost its store", 1, REFUSED, t + timedelta(seconds=1)),
        ("m0 failed", 1, "ValueError: boom", t + timedelta(seconds=2)),
    ]
    assert culprit(failed, lambda f: f[1:])[0] == "m0 failed"
    assert culprit(failed[:2], lambda f: f[1:])[0] == "m2 lost its store"
    assert culprit([], lambda f: f) is None


def test_among_equals_the_earliest_then_the_first_given() -> None:
    failed = [("late", 1, "a", 5.0), ("unknown", 1, "b", None), ("early", 1, "c", 2.0)]
    assert culprit(failed, lambda f: f[1:])[0] == "early"
    assert culprit([*failed[1:2], ("also", 1, "d", None)], lambda f: f[1:])[0] == "unknown"
