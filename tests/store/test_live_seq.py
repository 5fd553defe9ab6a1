"""The sequencer's refusals of a ``live_begin``'s new nodes (store/live_seq.py): an
original id that repeats, is a base node's, or a new node's already (committed, or of a
version still undecided) is refused; one freed by an abort is taken again."""

from __future__ import annotations

import numpy as np
import pytest

from graphrun.errors import ArgumentError
from graphrun.store.live_seq import Blocks, Sequencer, check_new_orig

BASE = np.asarray([100, 7, 50], np.int64)  # the base nodes' original ids


def ids(*o: int) -> np.ndarray:
    return np.asarray(o, np.int64)


def begun(seq: Sequencer, orig: np.ndarray) -> int:
    return seq.begin([len(orig), 0], [0, 0], orig, 0.0)[0]


def test_new_original_ids_are_refused_when_taken_and_taken_again_once_freed():
    seq = Sequencer(Blocks(3, 2), Blocks(10, 2))
    check_new_orig(seq, lambda: BASE, ids(), "live_begin")  # none: nothing to look up
    check_new_orig(seq, lambda: BASE, ids(1, 2), "live_begin")
    committed, pending, aborted = begun(seq, ids(1, 2)), begun(seq, ids(3)), begun(seq, ids(4))
    seq.decide(committed, True)
    seq.decide(aborted, False)
    for orig, why in (
        (ids(5, 5), "original ids repeat"),
        (ids(9, 7), "original id 7 is a node of the graph already"),  # a base node
        (ids(2), "original id 2 is a node of the graph already"),  # committed
        (ids(6, 3), "original id 3 is a node of the graph already"),  # undecided
    ):
        with pytest.raises(ArgumentError, match=why):
            check_new_orig(seq, lambda: BASE, orig, "live_begin")
    check_new_orig(seq, lambda: BASE, ids(4, 6), "live_begin")  # 4's version was aborted
    seq.decide(pending, False)
    check_new_orig(seq, lambda: BASE, ids(3), "live_begin")
