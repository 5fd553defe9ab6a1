"""``graphrun bench elastic``'s chaos thread: it fails at once, saying what never
happened, when the job ends before the kill (it waited an hour for a step that could
not come, and the bench printed nulls with exit 0)."""

from __future__ import annotations

import io

from graphrun.bench.elastic import Chaos


def test_a_job_that_ends_before_the_kill_fails_the_chaos_at_once(tmp_path):
    chaos = Chaos(tmp_path, io.StringIO("[graphrun] phase Training\n"), "m1", 2)
    chaos.job_done.set()
    chaos.start()
    chaos.join(60)
    assert not chaos.is_alive()  # it waited up to an hour before
    assert chaos.error == "RuntimeError: the job ended before its first step"
    assert chaos.killed_at is None and chaos.lost_updates is None
