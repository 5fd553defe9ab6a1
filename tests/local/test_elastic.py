"""Elastic trainers (``runtime.elastic``): a job goes on without a lost machine.

A 3-machine local job with ``replicas: 2``; every process of machine ``m1`` is killed
(SIGSTOP, then SIGKILL) at a seeded moment of an epoch after the first. The survivors
re-form and finish the job without a restart; known rows written to a DistEmbedding
before the kill read back the same after it; the metrics say 3 trainers, then 2. The
same for a machine that goes silent instead (every process stopped; its link cut on
netns hosts): the launcher fences it once the others re-formed.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from graphrun.errors import JobFailed
from graphrun.job.hosts import Hosts
from graphrun.job.spec import load_job
from graphrun.local.elastic import kill_machine, worker_pids
from graphrun.local.netns import unavailable_reason
from graphrun.local.runner import LocalJob, RunOptions
from graphrun.testing.jobs import nothing_left, small_job, wait_for
from graphrun.train.checkpoint import load_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 31


def events(text: str, name: str) -> list[dict[str, Any]]:
    """The console's ``{"event": name, ...}`` lines (after their ``[role@machine]``)."""
    found = []
    for line in text.splitlines():
        if line.partition("] ")[2].startswith(f'{{"event": "{name}"') or line.startswith(
            f'{{"event": "{name}"'
        ):
            found.append(json.loads(line[line.index("{") :]))
    return found


class Chaos:
    """Writes known DistEmbedding rows, kills ``machine`` in epoch ``epoch`` after a seeded
    delay, and reads the rows back once the trainers re-formed."""

    def __init__(self, run_dir: Path, sink: io.StringIO, machine: str, rows: bool = True) -> None:
        self.run_dir, self.sink, self.machine, self.rows = run_dir, sink, machine, rows
        self.killed: list[int] = []
        self.written: np.ndarray | None = None
        self.read: np.ndarray | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self._chaos()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _client(self) -> Any:
        from graphrun.rpc.auth import load_keys
        from graphrun.store.client import ClientConfig, KVClient

        hosts = Hosts.read(self.run_dir / "hosts.json")
        parts = sorted(hosts.store_endpoints().items())
        copies = hosts.replica_endpoints()
        return KVClient(
            ClientConfig(
                [f"tcp://{eps[0]}" for _, eps in parts], job="chaos", timeout=10,
                keys=load_keys(self.run_dir / "keys" / "job.key"), name="chaos",
                replicas=tuple(tuple(f"tcp://{e}" for e in copies.get(p, ())) for p, _ in parts),
            )
        )  # fmt: skip

    def _chaos(self) -> None:
        from graphrun.store.embedding import DistEmbedding

        metrics = self.run_dir / "metrics.jsonl"
        assert wait_for(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 1)
        if not self.rows:  # after the first checkpoint: a restart resumes from it
            ckpts = self.run_dir / "checkpoints"
            assert wait_for(lambda: load_checkpoint(ckpts) is not None)
            self.killed = kill_machine(self.machine)
            return
        client = self._client()
        try:
            emb = DistEmbedding(client, 4000, 4, "known", init="zeros")
            rng = np.random.default_rng(SEED)
            ids = np.arange(4000, dtype=np.int64)
            self.written = rng.standard_normal((4000, 4)).astype(np.float32)
            emb.weight[ids] = self.written  # acknowledged once it returns: on both copies
            # at a seeded step of the epoch after the one just written (a line per step)
            steps = json.loads(metrics.read_text().splitlines()[0])["steps"]
            at = steps + random.Random(SEED).randint(8, 16)
            prof = self.run_dir.parent.parent / "profile" / "trainer-0.jsonl"
            assert wait_for(lambda: len(prof.read_text().splitlines()) >= at)
            self.killed = kill_machine(self.machine)
            assert wait_for(lambda: '"event": "reformed"' in self.sink.getvalue())
            self.read = emb.weight[ids].numpy()
        finally:
            client.close()


def run_with_chaos(
    path: Path, opts: RunOptions, machine: str, rows: bool = True
) -> tuple[LocalJob, Any, Chaos, str]:
    """Runs the job while ``Chaos`` kills ``machine``: the job, its report, the chaos
    (checked: no error, the kill done) and the console."""
    sink = io.StringIO()
    job = LocalJob(load_job(path), path, opts, sink=sink)
    chaos = Chaos(path.parent / "runs" / "small", sink, machine, rows=rows)
    chaos.thread.start()
    report = job.run()
    chaos.thread.join(30)
    assert chaos.error is None, chaos.error
    assert chaos.killed, "the job ended before the kill: make it longer"
    return job, report, chaos, sink.getvalue()


@pytest.mark.timeout(400)
def test_the_survivors_of_a_lost_machine_go_on_without_a_restart(tmp_path):
    path = small_job(
        tmp_path, nodes=4000, machines=3, epochs=6, batchSize=5, evalEvery=100,
        # m1 is not started again (it would join at an epoch boundary: the next test)
        runtime={"replicas": 2, "elastic": {"minMachines": 2, "maxRejoins": 0}},
    )  # fmt: skip
    opts = RunOptions(grace_s=2.0, profile_dir=tmp_path / "profile")
    job, report, chaos, out = run_with_chaos(path, opts, "m1")
    assert report.state.phase == "Succeeded" and report.state.restarts == 0, out[-3000:]
    assert events(out, "resumed") == []  # no restart from a checkpoint
    [lost] = events(out, "machine_lost")
    assert lost["machine"] == "m1" and lost["took_over"]["trainers"] == ["m0", "m2"]
    assert lost["took_over"]["partitions"] == {"partition 1": "store:1:r on m2"}
    [reformed] = events(out, "reformed")
    assert reformed["lost_machines"] == ["m1"] and reformed["world_size"] == 2
    assert reformed["lost_trainers"] == [1] and reformed["generation"] == 1
    assert reformed["epoch"] == 1 and reformed["step"] > 0  # mid-epoch: no restart of it
    # the rest of the epoch: every trainer's batches from that step on, the lost one's too
    assert reformed["rest_seeds"] > 0
    # no acknowledged update is lost
    assert chaos.read is not None and np.array_equal(chaos.read, chaos.written)
    # the world size per step: 3, then 2 from the step where the group re-formed
    records = [
        json.loads(x) for x in (tmp_path / "runs/small/metrics.jsonl").read_text().splitlines()
    ]
    assert [r["epoch"] for r in records] == [0, 1, 2, 3, 4, 5]
    sizes = [r["world_sizes"] for r in records]
    assert sizes[0] == [[0, 3]] and sizes[-1] == [[0, 2]]
    flat = [w for s in sizes for _, w in s]
    assert flat == sorted(flat, reverse=True) and set(flat) == {2, 3}, sizes
    assert records[-1]["world_size"] == 2 and records[-1]["test_acc"] > 0.5
    nothing_left(job)


@pytest.mark.timeout(400)
def test_below_min_machines_the_job_restarts_from_its_checkpoint(tmp_path):
    path = small_job(
        tmp_path, nodes=4000, machines=2, epochs=3, batchSize=5, evalEvery=100,
        # the lone survivor waits timeoutSeconds for a late one before it gives up
        runtime={"replicas": 2, "elastic": {"minMachines": 2, "timeoutSeconds": 5}},
        run_policy={"backoffLimit": 1},
    )  # fmt: skip
    job, report, _, out = run_with_chaos(path, RunOptions(grace_s=2.0), "m1", rows=False)
    assert report.state.phase == "Succeeded" and report.state.restarts == 1, out[-3000:]
    assert events(out, "machine_lost") == [] and events(out, "reformed") == []
    [resumed] = events(out, "resumed")
    assert resumed["from_epoch"] >= 0
    # one record an epoch: those of the epochs run again are dropped at the resume
    records = (tmp_path / "runs/small/metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["epoch"] for r in records] == [0, 1, 2]
    nothing_left(job)


# ---- a machine that goes silent: stopped, or its link cut ------------------------------


def _silent_machine(tmp_path: Path, fault: str, seed: int, hosts: str) -> None:
    """A 3-machine job (``replicas: 2``, ``minMachines: 2``, ``timeoutSeconds: 10``) whose
    machine picked by ``seed`` goes silent (``fault``: every process stopped, or its link
    cut) at a step of epoch 1 picked by ``seed``, after a client wrote known rows: the
    survivors re-form after the timeout, the launcher fences the silent machine (kills
    what is left of it) instead of waiting for it, and the job ends Succeeded without a
    restart, the rows read back equal."""
    from graphrun.bench.elastic import Chaos

    machine = random.Random(seed).choice(["m0", "m1", "m2"])
    path = small_job(
        tmp_path, nodes=4000, machines=3, epochs=3, batchSize=5, evalEvery=100,
        # the machine is not started again (it would re-join: its own test, below)
        runtime={
            "replicas": 2, "elastic": {"minMachines": 2, "timeoutSeconds": 10, "maxRejoins": 0}
        },
    )  # fmt: skip
    run_dir = tmp_path / "runs" / "small"
    sink = io.StringIO()
    opts = RunOptions(grace_s=2.0, profile_dir=run_dir / "profile", hosts=hosts)
    job = LocalJob(load_job(path), path, opts, sink=sink)
    chaos = Chaos(run_dir, sink, machine, 1, fault, seed)
    chaos.start()
    try:
        report = job.run()
    finally:
        chaos.job_done.set()
        chaos.join(60)
    out = sink.getvalue()
    (run_dir / "console.log").write_text(out)  # for a look after a failure
    assert chaos.error is None, (chaos.error, out[-3000:])
    assert report.state.phase == "Succeeded" and report.state.restarts == 0, out[-3000:]
    assert events(out, "resumed") == []  # no restart from a checkpoint
    others = [m for m in ("m0", "m1", "m2") if m != machine]
    [lost] = events(out, "machine_lost")
    assert lost["machine"] == machine and lost["took_over"]["trainers"] == others
    assert "fenced" in lost, lost  # its processes ran on: the launcher killed them
    [reformed] = events(out, "reformed")
    assert reformed["lost_machines"] == [machine] and reformed["world_size"] == 2
    assert reformed["epoch"] == 1 and reformed["machines"] == others
    assert chaos.lost_updates == 0  # nothing acknowledged is lost
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1, 2]
    sizes = [r["world_sizes"] for r in records]
    assert sizes[0] == [[0, 3]] and sizes[-1] == [[0, 2]], sizes
    flat = [w for s in sizes for _, w in s]
    assert flat == sorted(flat, reverse=True) and set(flat) == {2, 3}, sizes
    nothing_left(job)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [5])
def test_a_stopped_machine_is_fenced_and_the_survivors_go_on(tmp_path, seed):
    _silent_machine(tmp_path, "stop", seed, "local")


NETNS = unavailable_reason()


@pytest.mark.netns
@pytest.mark.skipif(NETNS is not None, reason=f"no network namespaces: {NETNS}")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [0])
def test_a_machine_cut_off_is_fenced_and_the_survivors_go_on(tmp_path, seed):
    _silent_machine(tmp_path, "cut", seed, "netns")


# ---- a machine told to stop alone (a deleted pod) or with the whole job ---------------


def sigterm_worker_when(run_dir: Path, machine: str, epochs: int, out: list[int]) -> None:
    """SIGTERM ``machine``'s ``graphrun worker`` alone (as the kubelet does to a deleted
    pod) once ``epochs`` epochs are done."""
    metrics = run_dir / "metrics.jsonl"
    assert wait_for(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= epochs)
    for pid in worker_pids(machine):
        os.kill(pid, signal.SIGTERM)
        out.append(pid)


@pytest.mark.timeout(400)
def test_a_worker_told_to_stop_alone_leaves_and_the_others_go_on(tmp_path):
    """``kubectl delete pod`` of one machine, played locally: its worker gets SIGTERM
    without the job-wide stop mark, kills its roles (no stop agreement), and the other
    machines re-form and finish without a checkpoint or a restart."""
    path = small_job(
        tmp_path, nodes=4000, machines=3, epochs=10, batchSize=5, evalEvery=100,
        # m1 is not started again (it would re-join: a test of its own, below)
        runtime={"replicas": 2, "elastic": {"minMachines": 2, "maxRejoins": 0}},
    )  # fmt: skip
    sink = io.StringIO()
    opts = RunOptions(grace_s=2.0)
    job = LocalJob(load_job(path), path, opts, sink=sink)
    run_dir, signalled = tmp_path / "runs" / "small", []
    errors: list[BaseException] = []

    def chaos() -> None:
        try:
            sigterm_worker_when(run_dir, "m1", 2, signalled)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    report = job.run()
    thread.join(30)
    assert not errors, errors
    assert signalled, "the job ended before the SIGTERM: make it longer"
    out = sink.getvalue()
    assert report.state.phase == "Succeeded" and report.state.restarts == 0, out[-3000:]
    assert events(out, "resumed") == []  # no restart from a checkpoint
    [leaving] = events(out, "machine_leaving")
    assert leaving["machine"] == "m1"
    [lost] = events(out, "machine_lost")
    assert lost["machine"] == "m1" and lost["took_over"]["trainers"] == ["m0", "m2"]
    [reformed] = events(out, "reformed")
    assert reformed["lost_machines"] == ["m1"] and reformed["world_size"] == 2
    ckpt = load_checkpoint(run_dir / "checkpoints")
    assert ckpt is None or ckpt.position is None  # no one stopped mid-epoch to checkpoint
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == list(range(10))
    assert records[-1]["world_size"] == 2
    nothing_left(job)


@pytest.mark.timeout(400)
def test_an_elastic_job_stopped_as_a_whole_still_writes_an_exact_checkpoint(tmp_path):
    """``graphrun run`` stopped (SIGTERM / Ctrl-C): the launcher writes the job-wide stop
    mark before it signals the workers, so every trainer agrees on a step and trainer 0
    writes an exact checkpoint, as without elastic (tests/local/test_suspend.py)."""
    path = small_job(
        tmp_path, nodes=4000, machines=3, epochs=4, batchSize=5, evalEvery=100,
        runtime={"replicas": 2, "elastic": {"minMachines": 2}},
    )  # fmt: skip
    sink = io.StringIO()
    stop = threading.Event()
    opts = RunOptions(grace_s=30.0, profile_dir=tmp_path / "profile")
    job = LocalJob(load_job(path), path, opts, sink=sink, stop=stop)
    run_dir = tmp_path / "runs" / "small"

    def stop_mid_epoch_1() -> None:
        metrics = run_dir / "metrics.jsonl"
        if not wait_for(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 1):
            return
        steps = json.loads(metrics.read_text().splitlines()[0])["steps"]
        prof = tmp_path / "profile" / "trainer-0.jsonl"
        wait_for(lambda: len(prof.read_text().splitlines()) >= steps + steps // 3)
        stop.set()

    thread = threading.Thread(target=stop_mid_epoch_1, daemon=True)
    thread.start()
    with pytest.raises(JobFailed, match="Cancelled: stopped by a signal"):
        job.run()
    thread.join(30)
    out = sink.getvalue()
    assert events(out, "machine_leaving") == [] and events(out, "machine_lost") == []
    ckpt = load_checkpoint(run_dir / "checkpoints")
    assert ckpt is not None and ckpt.position is not None, out[-3000:]
    assert len(ckpt.position["rng"]) == 3  # every trainer stopped at the same step
    assert ckpt.position["step"] > 0


@pytest.mark.timeout(400)
def test_a_job_stopped_after_losing_trainer_0_mid_epoch_writes_its_checkpoint(tmp_path):
    """m0 (trainer 0) is lost early in epoch 1 and the job is stopped once the survivors
    re-formed, in the same epoch: the new group's rank 0 (trainer 1) writes the exact
    checkpoint. (The loop used to suspend with the group it began the epoch in, where
    trainer 1 was not rank 0: no checkpoint was written, and "checkpoint written" said.)"""
    path = small_job(
        tmp_path, nodes=4000, machines=3, epochs=4, batchSize=2, evalEvery=100,
        runtime={"replicas": 2, "elastic": {"minMachines": 2, "maxRejoins": 0}},
    )  # fmt: skip
    sink = io.StringIO()
    stop = threading.Event()
    opts = RunOptions(grace_s=30.0, profile_dir=tmp_path / "profile")
    job = LocalJob(load_job(path), path, opts, sink=sink, stop=stop)
    run_dir = tmp_path / "runs" / "small"
    killed: list[int] = []

    def lose_m0_then_stop() -> None:
        metrics = run_dir / "metrics.jsonl"
        if not wait_for(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 1):
            return
        steps = json.loads(metrics.read_text().splitlines()[0])["steps"]
        prof = tmp_path / "profile" / "trainer-1.jsonl"
        wait_for(lambda: len(prof.read_text().splitlines()) >= steps + steps // 10)
        killed.extend(kill_machine("m0"))
        wait_for(lambda: '"event": "reformed"' in sink.getvalue())
        stop.set()

    thread = threading.Thread(target=lose_m0_then_stop, daemon=True)
    thread.start()
    with pytest.raises(JobFailed):
        job.run()
    thread.join(30)
    out = sink.getvalue()
    assert killed, out[-3000:]
    [reformed] = events(out, "reformed")
    assert reformed["epoch"] == 1 and reformed["lost_trainers"] == [0], reformed
    ckpt = load_checkpoint(run_dir / "checkpoints")
    assert ckpt is not None and ckpt.position is not None, out[-3000:]
    assert ckpt.position["epoch"] == 1 and len(ckpt.position["rng"]) == 2
    [suspended] = events(out, "suspended")
    assert suspended["epoch"] == 1


# long enough for m1's trainer to start again before the end: the survivors' epochs of
# this small graph take about 1.2-2.5 s; m1's new trainer forks from the host's warm
# server (graphrun.machine.warm) and joined at epoch 2 (at 7-10 when it imported torch
# and PyG again, 15 when the store's join waited for its dead servers): the rest is
# margin for a busy machine
EPOCHS = 10


@pytest.mark.timeout(500)
def test_a_lost_machine_comes_back_and_joins_at_an_epoch_boundary(tmp_path):
    path = small_job(
        tmp_path, nodes=4000, machines=3, epochs=EPOCHS, batchSize=2, evalEvery=100,
        runtime={"replicas": 2, "elastic": {"minMachines": 2}},
    )  # fmt: skip
    opts = RunOptions(grace_s=2.0, profile_dir=tmp_path / "profile")
    job, report, chaos, out = run_with_chaos(path, opts, "m1")
    assert report.state.phase == "Succeeded" and report.state.restarts == 0, out[-3000:]
    assert events(out, "resumed") == []
    [lost] = events(out, "machine_lost")
    assert lost["machine"] == "m1"
    [relaunched] = events(out, "relaunched")
    assert relaunched["machine"] == "m1" and relaunched["rejoin"] == 1
    [reformed] = events(out, "reformed")
    assert reformed["epoch"] == 1 and reformed["world_size"] == 2
    [rejoined] = events(out, "rejoined")
    assert events(out, "join_closed") == [], "m1 came back after the last epoch: make it longer"
    assert rejoined["machine"] == "m1" and rejoined["trainers"] == [1]
    assert rejoined["epoch"] >= 2 and rejoined["world_size"] == 3
    assert rejoined["generation"] == 2 and rejoined["machines"] == ["m0", "m1", "m2"]
    assert chaos.read is not None and np.array_equal(chaos.read, chaos.written)
    records = [
        json.loads(x) for x in (tmp_path / "runs/small/metrics.jsonl").read_text().splitlines()
    ]
    assert [r["epoch"] for r in records] == list(range(EPOCHS))
    sizes = [w for r in records for _, w in r["world_sizes"]]
    # 3, then 2 from the step the group re-formed, then 3 from the epoch m1 came in at
    came = rejoined["epoch"]
    assert sizes == [3, 3, 2] + [2] * (came - 2) + [3] * (EPOCHS - came), sizes
    assert records[came]["rejoins"][0]["machine"] == "m1"
    assert records[-1]["world_size"] == 3 and records[-1]["test_acc"] > 0.5
    assert [t["machine"] for t in records[-1]["trainers"]] == ["m0", "m2", "m1"]
    nothing_left(job)
