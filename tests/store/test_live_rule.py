"""The delta's merge rule (issue 42, merge62): a geometric invariant, so the runs a read
looks at are bounded by the index's entries whatever the commits' sizes."""

from itertools import pairwise

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrun.store.live import LiveDelta
from graphrun.store.live_index import due, run_bound
from tests.store.test_live import E, N, _edge_piece, held


def _rest(sizes: list[int]) -> list[int]:
    """``sizes`` merged as the rule asks until it asks no more (the merging thread's loop)."""
    sizes = list(sizes)
    while (at := due(sizes)) is not None:
        i, k = at
        sizes[i : i + k] = [sum(sizes[i : i + k])]
    return sizes


def test_the_rule_merges_a_run_not_over_twice_the_next():
    assert due([20, 5, 1]) is None
    assert due([20, 9, 5]) == (1, 2)  # strictly decreasing: the rule before rested here
    assert due([5, 20, 1]) == (0, 2)  # before the last two (reads flushed the 1)
    assert due([7, 3, 0]) is None and due([7, 1, 0]) == (1, 2)  # an empty run counts as 1
    assert due([0, 0]) == (0, 2) and due([3]) is None and due([]) is None


def test_commits_of_falling_sizes_rest_at_the_bound():
    """Commits of 40, 39, ..., 1 entries: the rule before (a run not larger than the
    next) merged none of them, 40 runs for 820 entries; now at most log2(820) + 1."""
    sizes = _rest([])
    for m in range(40, 0, -1):
        sizes = _rest([*sizes, m])
    assert len(sizes) <= run_bound(820) == 10 and sum(sizes) == 820


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 5000), min_size=1, max_size=120),
    st.integers(1, 16),
)
def test_the_runs_at_rest_are_geometric_and_bounded(commits, lag):
    """Any commit sizes, runs flushed ``lag`` at a time before the thread merges (a thread
    behind the reads' flushes): at rest each run is over twice the next (an empty run as
    one) and there are at most ``floor(log2(entries)) + 1``, the entries all kept."""
    sizes: list[int] = []
    for at in range(0, len(commits), lag):
        sizes = _rest([*sizes, *commits[at : at + lag]])
        assert all(a > 2 * max(b, 1) for a, b in pairwise(sizes))
        assert len(sizes) <= run_bound(sum(sizes))
    assert sum(sizes) == sum(commits)


def test_a_delta_read_after_each_commit_keeps_its_runs_within_the_bound():
    """A delta without a thread merges at each read: with commits of falling and random
    sizes, a read after each sees at most ``run_bound`` runs, and every new edge."""
    rng = np.random.default_rng(5)
    sizes = [*range(40, 0, -1), *rng.integers(1, 200, 40).tolist()]
    d, total, eid = LiveDelta(), 0, E
    for v, m in enumerate(sizes, start=1):
        held(d, _edge_piece(v, rng.integers(0, N, m), rng.integers(0, 5, m), eid + np.arange(m)))
        eid, total = eid + m, total + m
        assert d.in_edges(np.arange(5), v)[0].sum() == total
        assert len(d.runs) <= run_bound(total)
