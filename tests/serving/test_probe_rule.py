"""The endpoint's readiness rule (graphrun/serving/app.py): one slow or lost store probe
on a busy machine does not turn the endpoint away; PROBE_FAILURES in a row do (and it
joins the store again once a probe answers). Before, a single probe that took over its
1 s timeout answered every request 503 until the next probe (the suite's
test_server_bounds[endpoint-garbage] on a loaded box)."""

from __future__ import annotations

import asyncio

from graphrun.serving.app import PROBE_FAILURES, Server, Settings


class Joined:
    """The engine's join state, as the rule sees it (the rule itself is what is tested;
    the store's side is tests/serving/test_readiness.py's, with real servers)."""

    def __init__(self) -> None:
        self.connected, self.joins, self.closes = True, 0, 0

    def connect(self) -> None:
        self.connected, self.joins = True, self.joins + 1

    def close(self) -> None:
        self.connected, self.closes = False, self.closes + 1


def _readiness(answers: list[bool]) -> tuple[list[bool], Joined]:
    engine, script = Joined(), iter(answers)
    server = Server(engine, Settings("m"), lambda: next(script))  # type: ignore[arg-type]

    async def probes() -> list[bool]:
        return [await server.check_ready() for _ in answers]

    try:
        return asyncio.run(probes()), engine
    finally:
        server.pool.shutdown()


def test_a_lost_probe_is_not_a_store_gone_but_several_in_a_row_are() -> None:
    fails = [False] * PROBE_FAILURES
    ready, engine = _readiness([True, False, True, *fails[:-1], True])
    assert all(ready) and engine.closes == 0
    ready, engine = _readiness([True, *fails, False, True, True])
    assert ready == [True] * PROBE_FAILURES + [False, False, True, True]
    assert (engine.closes, engine.joins) == (1, 1)  # left the store, joined it again
