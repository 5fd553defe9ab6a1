"""``graphrun ingest`` losing the sequencer mid-stream (issue 42): its line says what is
known. A chunk whose commit was sent and whose answer was lost may be committed (the
sequencer took and synced its decision, then went silent): the command asks again once
the store answers (``GraphWriter.settle``) and says the true fate; before, it called such
a chunk "not committed" while the store held it. On real store processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from graphrun.distributed.writer import GraphWriter
from graphrun.rpc.auth import load_keys
from graphrun.testing.procs import child_env
from tests.cli.test_ingest_live import write_npy
from tests.store.test_live_durable import Cluster, running

pytestmark = pytest.mark.integration
CHUNK = 5  # nodes a chunk
TIMEOUT_S = 2  # the writer's: a sequencer silent this long is lost to it


@pytest.fixture
def cluster(tmp_path):
    with running(tmp_path) as c:  # a key of its own
        yield c


def rows_committed(line: str, name: str, first: int) -> set[int]:
    """The rows of ``name`` the one line says are committed: every row before ``first``
    and the spans after it (in flight then)."""
    rows = set(range(first))
    for part in line.split("; "):
        if part.startswith("and after it (in flight then)") or ", and after it" in part:
            spans = re.findall(rf"{name}: rows (\d+)\.\.(\d+)", part.split("after it")[1])
            rows |= {r for lo, hi in spans for r in range(int(lo), int(hi) + 1)}
    return rows


def test_a_sequencer_silent_mid_ingest_leaves_no_chunk_called_uncommitted_that_is_in(
    cluster, tmp_path
):
    """The sequencer stopped (SIGSTOP) while 8 chunks are in flight, past the writer's
    timeout, then let go: the decisions it had queued are taken then. The command stops
    with one line, and every row it calls committed is in the store, every row of the
    chunk it names as not committed is not, and a chunk of unknown fate is as the
    sequencer says."""
    n = 1000 * CHUNK  # far more than it sends before the stop
    ids = np.arange(10**9, 10**9 + n)
    proc = start_ingest(cluster, tmp_path, ids)
    seq = cluster.procs[0]
    assert seq is not None and proc.stderr is not None
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if " in 40 chunks" in line:  # streaming: 8 in flight
                break
        os.kill(seq.pid, signal.SIGSTOP)
        time.sleep(2.75 * TIMEOUT_S)  # a wait of the writer timed out, its settle not yet
        os.kill(seq.pid, signal.SIGCONT)
        lines += proc.stderr.readlines()
        assert proc.wait(60) == 1, "".join(lines)
    finally:
        os.kill(seq.pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
    check_line(cluster, lines[-1], ids)


def start_ingest(cluster: Cluster, tmp_path: Path, ids: np.ndarray) -> subprocess.Popen[str]:
    """``graphrun ingest`` of new nodes ``ids``, CHUNK a chunk, 8 in flight, a line a
    chunk acknowledged on its stderr."""
    with cluster.client(load_keys(cluster.key_file)) as c:
        rows = {
            t.name.rsplit("/", 1)[1]: np.ones((len(ids), *t.row_shape), t.dtype)
            for t in c.list_tensors()
            if t.name.startswith("node/_N/")
        }
    write_npy(tmp_path / "new", ids, rows)
    store = [x for a in cluster.addresses for x in ("--store", a)]
    cmd = [sys.executable, "-m", "graphrun", "ingest", str(tmp_path / "new"), *store,
           "--key-file", str(cluster.key_file), "--chunk-rows", str(CHUNK), "--window", "8",
           "--timeout", str(TIMEOUT_S), "--progress-s", "0"]  # fmt: skip
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=child_env())


def check_line(cluster: Cluster, err: str, ids: np.ndarray) -> None:
    """The line is true: the rows it calls committed are exactly those in the store, but
    for the chunks of unknown fate, each of which is as the sequencer says; the chunk it
    names as not committed is not in."""
    assert err.startswith("graphrun: error: "), err
    with cluster.client(load_keys(cluster.key_file)) as c:
        w = GraphWriter(c)
        got = w.lookup(ids) >= 600
        first = int(re.search(r"id\.npy: rows (\d+)\.\.", err).group(1))  # type: ignore[union-attr]
        said = rows_committed(err, "id.npy", first)
        counted = len(said)
        unknown = "".join(err.split("; fate unknown (")[1:])
        spans = re.findall(r"rows (\d+)\.\.(\d+)", unknown)
        chunks = [k for lo, hi in spans for k in range(int(lo), int(hi) + 1, CHUNK)]
        versions = re.findall(r"\d+", unknown.split("versions ")[1].split(";")[0]) if spans else []
        assert len(versions) == len(chunks), err
        for k, v in zip(chunks, versions, strict=True):
            if w.fate(int(v)) == "committed":
                said |= set(range(k, k + CHUNK))
    assert set(np.flatnonzero(got).tolist()) == said, err
    if f"rows {first}..{first + CHUNK - 1}: not committed" in err:
        assert not got[first : first + CHUNK].any(), err
    assert f"committed: {counted} rows ({counted} nodes, 0 edges)" in err


def test_a_sequencer_killed_mid_ingest_and_restarted_leaves_a_true_line(cluster, tmp_path):
    """``kill -9`` of the sequencer while 8 chunks are in flight, restarted on its log at
    once: the command stops with one line, and every row it calls committed is in the
    store, every other row is not, but for the chunks it lists as of unknown fate, each
    of which is as the sequencer says. (The old code passed it too: a kill lands
    between a decision's sync and its answer rarely; the SIGSTOP above makes that
    window seconds long.)"""
    n = 1000 * CHUNK
    ids = np.arange(2 * 10**9, 2 * 10**9 + n)
    proc = start_ingest(cluster, tmp_path, ids)
    assert proc.stderr is not None
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if " in 40 chunks" in line:
                break
        cluster.kill(0)
        cluster.start(0)  # the same address and log: every acknowledged batch replayed
        lines += proc.stderr.readlines()
        assert proc.wait(60) == 1, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    check_line(cluster, lines[-1], ids)
