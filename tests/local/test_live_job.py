"""``graphrun run`` of a job that follows a live graph on its own store servers: each
server logs to its partition's directory (spec.live, docs/live.md)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from graphrun.distributed.writer import GraphWriter
from graphrun.job.hosts import Hosts
from graphrun.local.runner import JobReport
from graphrun.names import RoleName
from graphrun.partition import load_id_mapping
from graphrun.rpc.auth import load_keys
from graphrun.store.client import ClientConfig, KVClient
from graphrun.testing.jobs import job_metrics, local_job, nothing_left, small_job, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def following(path: Path) -> Path:
    """The job file ``path`` made to follow its live graph (``spec.live``: its own stores
    log, its trainers follow the head at each epoch)."""
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["live"] = {"follow": "epoch"}
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_live_job_s_store_servers_keep_their_logs_in_the_run_dir(tmp_path):
    path = small_job(tmp_path, runtime={"replicas": 2})
    following(path)
    job, _ = local_job(path)
    job.run()
    live = tmp_path / "runs" / "small" / "live"
    logs = sorted(str(p.relative_to(live)) for p in live.glob("*/*.wal"))
    assert logs == ["0/part-0-replica-1.wal", "0/part-0.wal",
                    "1/part-1-replica-1.wal", "1/part-1.wal"]  # fmt: skip
    assert all((live / p).stat().st_mode & 0o777 == 0o700 for p in ("0", "1"))
    nothing_left(job)


def test_a_live_hetero_job_follows_its_graph_and_trains(tmp_path):
    """hetero-node-classification with spec.live (refused before issue 42's hetero42):
    the trainers follow the graph's head at each epoch and train the target type."""
    path = small_job(tmp_path, hetero=True, nodes=3000, task="hetero-node-classification",
                     targetNodeType="paper", fanouts=[4, 3], epochs=2, lr=0.03)  # fmt: skip
    following(path)
    job, sink = local_job(path)
    report = job.run()
    assert all(report.exits[RoleName.trainer(r)] == 0 for r in range(2))
    assert '"model": "HeteroGNN"' in sink.getvalue()
    assert job_metrics(path)[-1]["test_acc"] > 0.5  # 4 classes: chance is 0.25
    nothing_left(job)


NEW_PAPERS = 400  # with train_mask: 200 more seeds for each of the two trainers
EPOCHS = 24  # of a few tenths of a second each: the write lands during them
BATCH = 20


def job_client(base: Path) -> KVClient:
    """A client of the local job's own stores under ``base``, with its key (the store's
    own, which may write)."""
    run_dir = base / "runs" / "small"
    hosts = Hosts.read(run_dir / "hosts.json")
    addresses = [f"tcp://{eps[0].host}:{eps[0].port}" for eps in hosts.store_endpoints().values()]
    keys = load_keys(run_dir / "keys" / "job.key")
    return KVClient(ClientConfig(addresses, job="writer", keys=keys, timeout=30))


def run_acting_after_epoch_0(
    base: Path, path: Path, act: Callable[[], object]
) -> tuple[JobReport, str, list[object]]:
    """Run the live job ``path`` (under ``base``) while ``act()`` runs once its first
    epoch ended (a thread of this test's); the job's report, its console, and
    ``[act's result]`` (or ``[its exception]``, or ``[]``: the epoch never ended).
    Nothing of the job is left."""
    job, sink = local_job(following(path))
    metrics = base / "runs" / "small" / "metrics.jsonl"
    done: list[object] = []

    def actor() -> None:
        try:
            if wait_for(lambda: metrics.is_file() and '"epoch": 0' in metrics.read_text()):
                done.append(act())
        except BaseException as e:  # raised below, in the test's thread
            done.append(e)

    t = threading.Thread(target=actor, daemon=True)
    t.start()
    report = job.run()
    t.join(timeout=60)
    nothing_left(job)
    return report, sink.getvalue(), done


def run_writing_after_epoch_0(base: Path, path: Path, write: Callable[[Path], int]) -> list[int]:
    """Run the live job ``path`` (under ``base``) while ``write(base)`` writes into its
    own store once its first epoch ended; each epoch's steps. The write's version is 1,
    every trainer exits 0 and nothing is left."""
    report, _, written = run_acting_after_epoch_0(base, path, lambda: write(base))
    assert written == [1], written
    assert all(report.exits[RoleName.trainer(r)] == 0 for r in range(2))
    return [r["steps"] for r in job_metrics(path) if "epoch" in r]


def write_papers(base: Path) -> int:
    """Into the job's own store (with its key, the store's own, which may write): new
    papers with every feature of the type, train_mask true, each written by a base
    author. The version."""
    with job_client(base) as c:
        feats = {}
        for info in c.list_tensors():
            kind, _, rest = info.name.partition("/")
            ntype, _, name = rest.partition("/")
            if kind == "node" and ntype == "paper":
                feats[name] = np.zeros((NEW_PAPERS, *info.row_shape), info.dtype)
        feats["train_mask"][:] = True
        papers = 10**9 + np.arange(NEW_PAPERS)
        w = GraphWriter(c)
        w.add_nodes("paper", papers, feats, label=np.arange(NEW_PAPERS) % 4)
        orig = load_id_mapping(base / "parts").orig_nids
        authors = orig[c.book.to_homo("author", np.arange(NEW_PAPERS) % 50)]
        w.add_edges("writes", authors, papers, orig=True)
        return w.commit()


def test_a_live_hetero_job_trains_on_papers_written_to_its_own_store_while_it_trains(tmp_path):
    """A writer writes new papers into a live hetero job's own store once its first
    epoch ended: the epochs from the next one on take them as seeds (more steps each:
    every trainer 10 more), and the job ends well."""
    path = small_job(tmp_path, hetero=True, nodes=3000, task="hetero-node-classification",
                     targetNodeType="paper", fanouts=[4, 3], epochs=EPOCHS, lr=0.03,
                     batchSize=BATCH)  # fmt: skip
    steps = run_writing_after_epoch_0(tmp_path, path, write_papers)
    grown = [i for i, k in enumerate(steps) if k != steps[0]]
    assert len(steps) == EPOCHS and grown, steps  # the write landed before the last epoch
    # from the first epoch at the new version on: every new paper a seed, once
    assert all(steps[i] == steps[0] + NEW_PAPERS // 2 // BATCH for i in range(grown[0], EPOCHS))


NEW_EDGES = 4000  # about 0.9 of them training edges: 1800 more positives for each trainer
LINK_EPOCHS = 10
LINK_BATCH = 1000


def link_job(base: Path, **spec: object) -> Path:
    """A homogeneous link-prediction job file under ``base`` (``spec``: small_job's
    run_policy, runtime...)."""
    return small_job(base, task="link-prediction", embeddingDim=8, sparseLr=0.05,
                     epochs=LINK_EPOCHS, batchSize=LINK_BATCH, **spec)  # type: ignore[arg-type]  # fmt: skip


def kill_store(base: Path, machine: str, role: str) -> None:
    """SIGKILL store ``role`` of the local job under ``base`` (on ``machine``)."""
    from graphrun.record import read_status

    st = read_status(base / "runs" / "small" / "status" / f"{machine}.json")
    assert st is not None
    os.kill(st.pids()[RoleName.parse(role)], signal.SIGKILL)


def write_edges(base: Path) -> int:
    """Into a homogeneous job's own store: random new edges between base nodes, with
    every edge feature of the type. The version."""
    with job_client(base) as c:
        feats = {}
        for info in c.list_tensors():
            kind, _, rest = info.name.partition("/")
            if kind == "edge":
                name = rest.rpartition("/")[2]
                feats[name] = np.ones((NEW_EDGES, *info.row_shape), info.dtype)
        rng = np.random.default_rng(0)
        src, dst = rng.integers(0, c.book.num_nodes, (2, NEW_EDGES))
        w = GraphWriter(c)
        w.add_edges("_E", src, dst, feats)
        return w.commit()


def test_a_live_link_prediction_job_trains_on_edges_written_while_it_trains(tmp_path):
    """A writer writes new edges into a live link-prediction job's own store once its
    first epoch ended: the epochs from the next one on take those of the training split
    as positives (more steps each; the epochs were the base's before), and the job ends
    well."""
    path = link_job(tmp_path)
    steps = run_writing_after_epoch_0(tmp_path, path, write_edges)
    grown = [i for i, k in enumerate(steps) if k != steps[0]]
    assert len(steps) == LINK_EPOCHS and grown, steps  # the write landed before the last
    assert all(steps[i] > steps[0] for i in range(grown[0], LINK_EPOCHS))
    assert 0.0 <= job_metrics(path)[-1]["test_auc"] <= 1.0


def test_a_job_whose_primary_recorded_a_dropped_replica_fails_at_once_not_retried(tmp_path):
    """A live job restarted after its primary dropped a replica (its record in the
    partition's log directory, as a primary with ``--live-dir`` writes it): the replica
    reads it there at its start (since stop 65; before, its primary refused its
    registration) and exits 2 with one line, and the job fails at once without
    a restart (``NotRetriable``: every restart would be refused the same way), not
    after the stores' ready timeout."""
    import json

    from graphrun.errors import JobFailed

    path = small_job(tmp_path, runtime={"replicas": 2}, run_policy={"backoffLimit": 2})
    following(path)
    live = tmp_path / "runs" / "small" / "live" / "0"
    live.mkdir(parents=True, mode=0o700)
    record = {"format": "graphrun-dropped-replicas", "version": 1, "part": 0,
              "dropped": {"1": "partition 0's primary: silent (a test)"}}  # fmt: skip
    (live / "part-0.dropped.json").write_text(json.dumps(record))
    job, sink = local_job(path)
    with pytest.raises(JobFailed, match="exit code 2") as failed:
        job.run()
    assert "replica_index: dropped replica: replica 1 was dropped" in str(failed.value)
    assert "dropped replica: replica 1 was dropped" in str(failed.value)
    assert "phase Failed (NotRetriable)" in sink.getvalue()
    assert "Restarting" not in sink.getvalue()
    nothing_left(job)


def test_a_live_job_whose_store_is_killed_after_a_write_restarts_with_the_write(tmp_path):
    """``kill -9`` of a live link-prediction job's ``store:1`` once a write into it was
    acknowledged (replicas 1, its log in the run dir): the job restarts, the store
    replays its log, and the restarted attempt's epochs take the written edges as
    positives (more steps than the base's): the acknowledged write survived the kill."""
    path = link_job(tmp_path, run_policy={"backoffLimit": 1})
    base: list[int] = []  # the first attempt's steps an epoch, before the write

    def write_then_kill() -> int:
        base.append(job_metrics(path)[0]["steps"])
        version = write_edges(tmp_path)  # acknowledged: commit() returned
        kill_store(tmp_path, "m1", "store:1")
        return version

    report, console, done = run_acting_after_epoch_0(tmp_path, path, write_then_kill)
    assert done == [1], done
    assert report.state.phase == "Succeeded" and report.state.restarts == 1, console
    # every epoch after the first counts the written edges among its positives: the
    # restarted attempt's (from epoch 0 again, or from the checkpoint of epoch 0 when one
    # was written before the kill: then epoch 0's line is the first attempt's, without
    # them), whose store replayed them
    steps = [r["steps"] for r in job_metrics(path) if "epoch" in r]
    assert len(steps) == LINK_EPOCHS and all(k > base[0] for k in steps[1:]), (base, steps)


def test_a_live_job_whose_sequencer_is_killed_after_a_write_goes_on_through_its_replica(
    tmp_path,
):
    """``kill -9`` of a live link-prediction job's ``store:0`` (the sequencer) once a write
    was acknowledged, with ``replicas: 2``: partition 0's replica serves, the job goes on
    without a restart, and its epochs after the write take the written edges."""
    path = link_job(tmp_path, runtime={"replicas": 2})

    def write_then_kill() -> int:
        version = write_edges(tmp_path)
        kill_store(tmp_path, "m0", "store:0")
        return version

    report, console, done = run_acting_after_epoch_0(tmp_path, path, write_then_kill)
    assert done == [1], done
    assert report.state.phase == "Succeeded" and report.state.restarts == 0, console
    steps = [r["steps"] for r in job_metrics(path) if "epoch" in r]
    assert len(steps) == LINK_EPOCHS and steps[-1] > steps[0], steps


def test_a_live_run_killed_whole_after_a_write_resumes_from_its_checkpoint_with_the_write(
    tmp_path,
):
    """``kill -9`` of a live link-prediction run as a whole (the launcher, its stores and
    trainers: a machine's power lost) once a write was acknowledged and a checkpoint
    written after it; ``graphrun run --resume`` replays the stores' logs (on new ports)
    and continues from the checkpoint, every epoch after it taking the written edges."""
    import json
    import subprocess
    import sys
    import time

    from graphrun.testing.procs import child_env
    from graphrun.train.checkpoint import load_checkpoint

    path = following(link_job(tmp_path))
    run = tmp_path / "runs" / "small"
    cli = [sys.executable, "-m", "graphrun", "run", str(path), "--run-dir", str(run),
           "--grace", "1"]  # fmt: skip
    proc = subprocess.Popen(cli, env=child_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def epochs() -> list[dict[str, object]]:
        text = (run / "metrics.jsonl").read_text() if (run / "metrics.jsonl").is_file() else ""
        return [json.loads(x) for x in text.splitlines() if '"epoch"' in x]

    try:
        assert wait_for(lambda: len(epochs()) >= 1 or proc.poll() is not None)
        base = int(epochs()[0]["steps"])  # type: ignore[call-overload]
        assert write_edges(tmp_path) == 1  # acknowledged
        written = len(epochs())
        # a checkpoint of an epoch that took the write (the next epoch's start took it)
        assert wait_for(lambda: len(epochs()) >= written + 2 or proc.poll() is not None)
        assert proc.poll() is None, "the run ended before the kill: make it longer"
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every role
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert load_checkpoint(run / "checkpoints") is not None
    before = len(epochs())
    time.sleep(0.5)  # the killed roles' sockets closed
    resumed = subprocess.run([*cli, "--resume"], env=child_env(), capture_output=True,
                             timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = epochs()[before:]  # the resumed run's epochs, from its checkpoint on
    assert after and after[-1]["epoch"] == LINK_EPOCHS - 1, after
    steps = [int(r["steps"]) for r in after]  # type: ignore[call-overload]
    assert all(k > base for k in steps), (base, steps)
