from __future__ import annotations

import pytest

from graphrun.placement.oes import Policy
from graphrun.placement.simgrid_check import (
    crosscheck,
    oes_finish,
    random_flowsets,
    simgrid_available,
    simgrid_finish,
)

needs_simgrid = pytest.mark.skipif(
    not simgrid_available(), reason="SimGrid not installed (apt-get install python3-simgrid)"
)


@needs_simgrid
def test_fair_sharing_agrees_with_simgrid():
    result = crosscheck(random_flowsets(seed=0, count=25, machines=4, flows=10))
    assert result.flows == 250
    assert result.max_rel_error <= 1e-6
    assert result.max_rel_error_flows <= 1e-6


@needs_simgrid
def test_priority_scheduling_differs_from_simgrid():
    """The comparison can fail: OES's priority policy is not max-min fairness."""
    sets = random_flowsets(seed=1, count=5, machines=3, flows=8)
    theirs = simgrid_finish(sets)
    worst = max(
        abs(a - b) / b
        for fs, sg in zip(sets, theirs, strict=True)
        for a, b in zip(oes_finish(fs, Policy.PRIORITY), sg, strict=True)
    )
    assert worst > 1e-3
