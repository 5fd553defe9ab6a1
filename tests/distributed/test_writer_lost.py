"""A pipelined ``GraphWriter`` that loses the sequencer with commits in flight: the
batches whose commit was sent and whose answer was lost are answered ``unknown`` (they
may be committed), and ``settle`` learns each one's fate once the sequencer answers
again, aborting those whose commit never reached its log. On real store processes."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from graphrun.distributed.writer import GraphWriter
from graphrun.errors import GraphrunError
from graphrun.rpc.auth import load_keys
from graphrun.store.client import ClientConfig, KVClient
from tests.distributed.test_writer_answers import node_rows
from tests.store.test_live_durable import running

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path):
    with running(tmp_path) as c:  # a key of its own
        yield c


def test_a_writer_settles_what_it_lost_with_the_sequencer(cluster):
    """Batches streamed 8 in flight; the sequencer stopped (SIGSTOP) past the writer's
    timeout, so the begins carrying commits go unanswered, then killed (``kill -9``: the
    requests queued in it never read) and restarted on its log. The batches whose
    commit was sent are answered unknown with their versions; ``settle`` then answers
    each (those the sequencer logged committed, the rest, pending after its restart,
    aborted), and the store holds exactly the nodes of the batches answered committed."""
    keys = load_keys(cluster.key_file)
    c = KVClient(ClientConfig(cluster.addresses, keys=keys, timeout=2))
    try:
        w = GraphWriter(c, window=8)
        rows = node_rows(c, 3)
        ids = {k: np.arange(10**9 + 10 * k, 10**9 + 10 * k + 3) for k in range(40)}
        seq = cluster.procs[0]
        assert seq is not None
        for k in range(12):
            w.add_nodes("_N", ids[k], rows)
            w.submit(tag=k)
        os.kill(seq.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        for k in range(12, 40):  # until a wait times out on the stopped sequencer
            try:
                w.add_nodes("_N", ids[k], rows)
                w.submit(tag=k)
            except GraphrunError:
                break
        with pytest.raises(GraphrunError):
            w.flush()
        assert time.monotonic() - t0 < 60
        cluster.kill(0)
        cluster.start(0)  # its log replayed: the versions it logged, decided or not
        answers = {a.tag: a for a in w.answered()}
        unknown = {k: a.version for k, a in answers.items() if a.unknown}
        assert unknown, answers  # commits were carried by the begins it never answered
        settled = {a.tag: a for a in w.settle(timeout=20)}
        assert set(settled) == set(unknown)
        assert all(a.version == unknown[k] for k, a in settled.items())
        committed = {k for k, a in answers.items() if a.error is None}
        committed |= {k for k, a in settled.items() if a.error is None}
        got = w.lookup(np.concatenate([ids[k] for k in answers]))
        found = {k for i, k in enumerate(answers) if (got[3 * i : 3 * i + 3] >= 600).all()}
        assert found == committed
        for k in unknown:
            want = "committed" if k in committed else "aborted"
            assert w.fate(unknown[k]) == want
    finally:
        c.close()
