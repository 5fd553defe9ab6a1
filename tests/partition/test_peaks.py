"""Per-phase peaks: each phase reports what it held at its fullest, not the run's peak."""

from __future__ import annotations

import numpy as np

from graphrun.partition.peaks import Phases


def test_a_phase_after_a_large_one_reports_its_own_peak() -> None:
    clock = Phases()
    clock.start("big")
    big = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, touched
    assert big.sum() == 64 << 20
    del big
    clock.start("small")
    small = np.ones(1 << 20, dtype=np.uint8)
    assert small.sum() == 1 << 20
    clock.start("")
    peaks = clock.peaks()
    assert list(peaks) == ["big", "small"] and clock.per_phase
    assert peaks["big"] - peaks["small"] > 48  # MiB: the 64 MiB were freed before "small"
    assert clock.peak_mb >= peaks["big"]
    assert set(clock.seconds()) == {"big", "small"}
