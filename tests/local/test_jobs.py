"""Real jobs: real store servers, real trainers (DDP over gloo), a small generated graph."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from graphrun.errors import CheckpointError, JobFailed
from graphrun.job.spec import load_job
from graphrun.local.netns import unavailable_reason
from graphrun.local.runner import LocalJob, RunOptions
from graphrun.names import RoleName
from graphrun.placement.profile import read_records
from graphrun.record import read_status
from graphrun.testing.jobs import job_metrics as metrics
from graphrun.testing.jobs import kill_when_training, no_children, nothing_left, small_job, wait_for
from graphrun.testing.jobs import local_job as run
from graphrun.testing.procs import child_env
from graphrun.train.checkpoint import load_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class _Tee:
    """A launcher's sink that writes the raw lines to ``raw`` and to ``console``."""

    def __init__(self, raw: io.StringIO, console: Any) -> None:
        self.raw, self.console = raw, console

    def write(self, text: str) -> int:
        self.console.write(text)
        return self.raw.write(text)

    def flush(self) -> None:
        self.console.flush()


def test_two_machines_train_to_accuracy(tmp_path):
    """Also what a person sees of it: sampler workers take seconds to start before the
    first epoch's first step (9-15 s on a loaded box), so the console says so when they
    start and when they are ready (one job for both: each is a whole job's processes)."""
    from graphrun.local.console import Console

    # one sampler worker process per trainer (spawned by its loader, stopped with it)
    path = small_job(tmp_path, epochs=3, lr=0.03, runtime={"samplerWorkersPerTrainer": 1})
    sink, shown = io.StringIO(), io.StringIO()
    job = LocalJob(load_job(path), path, RunOptions(grace_s=3.0), sink=_Tee(sink, Console(shown)))
    report = job.run()
    assert report.exits[RoleName.trainer(0)] == 0 and report.exits[RoleName.trainer(1)] == 0
    last = metrics(path)[-1]
    # 4 classes: chance is 0.25; this setting reaches 0.66-0.77 in one process (seeds 0-4)
    assert last["epoch"] == 2 and last["test_acc"] > 0.5
    assert "[store:1@m1]" in sink.getvalue() and "[trainer:0@m0]" in sink.getvalue()
    assert '"rank": 0, "local_parts": [0, 1]' in sink.getvalue()  # one host: both co-located
    # both machines on this host: their trainers forked from its warm server
    roles = {}
    for m in ("m0", "m1"):
        roles.update(read_status(path.parent / "runs" / "small" / "status" / f"{m}.json").roles)
    assert {str(r): v.warm for r, v in roles.items()} == {
        "trainer:0": True, "trainer:1": True, "store:0": False, "store:1": False
    }  # fmt: skip
    lines = [x for x in shown.getvalue().splitlines() if x.startswith("[trainer:0@m0] ")]
    starting = lines.index(
        "[trainer:0@m0] starting 1 sampler worker(s) per trainer "
        "(runtime.samplerWorkersPerTrainer): the first epoch waits for them"
    )
    ready = next(i for i, x in enumerate(lines) if x.startswith("[trainer:0@m0] sampler workers"))
    assert re.fullmatch(r"\[trainer:0@m0\] sampler workers ready in \d+\.\d s", lines[ready])
    first_epoch = next(i for i, x in enumerate(lines) if x.startswith("[trainer:0@m0] epoch 0"))
    assert starting < ready < first_epoch, lines  # their start is off the epoch's clock:
    # tests/train/test_loop.py (here it is too short to tell: the fork server is forked)
    nothing_left(job)


def test_the_gpu_feature_path_in_a_real_job_with_its_cpu_transfer(tmp_path):
    """Store loaders, sampler workers, the whole table read from the store into the
    device cache, loaders that then gather no features, the feed thread: as a GPU
    trainer runs them, with the CPU transfer (``--device-feed cpu``)."""
    runtime = {"samplerWorkersPerTrainer": 1, "gpuFeatureCacheMb": 1}  # 2000 x 64 B: all
    path = small_job(tmp_path, epochs=3, lr=0.03, runtime=runtime)
    job, _ = run(path, trainer_args=("--device-feed", "cpu"))
    report = job.run()
    assert report.exits[RoleName.trainer(0)] == 0 and report.exits[RoleName.trainer(1)] == 0
    got = metrics(path)
    assert got[-1]["test_acc"] > 0.5  # as test_two_machines_train_to_accuracy
    assert [m["gpu_cache_hit_rate"] for m in got] == [1.0, 1.0, 1.0]
    assert all(0.0 <= m["gpu_idle_share"] <= 1.0 for m in got)
    nothing_left(job)


def test_raising_trainer_fails_the_job_and_leaves_nothing(tmp_path):
    path = small_job(tmp_path, entryPoint="graphrun.testing.jobs:raise_on_rank_1")
    job, _ = run(path)
    with pytest.raises(JobFailed) as info:
        job.run()
    blamed = (info.value.role, info.value.host, info.value.exit_code)
    assert blamed == (RoleName.trainer(1), "m1", 1), str(info.value)
    assert "boom on purpose" in str(info.value)
    # what the failed entry point left open was closed before its process ended
    unclosed = tmp_path / "runs" / "small" / "unclosed.txt"
    assert unclosed.read_text() == "written before the error\n"
    nothing_left(job)


def test_killed_store_fails_the_job(tmp_path):
    path = small_job(tmp_path, entryPoint="graphrun.testing.jobs:wait")
    job, _ = run(path)
    kill_when_training(tmp_path / "runs" / "small" / "status" / "m1.json", RoleName.store(1))
    with pytest.raises(JobFailed) as info:
        job.run()
    assert (info.value.role, info.value.host, info.value.exit_code) == (RoleName.store(1), "m1", -9)
    nothing_left(job)


def test_link_prediction_job_with_dist_embedding(tmp_path):
    path = small_job(tmp_path, task="link-prediction", embeddingDim=8, batchSize=200, sparseLr=0.05)
    run(path)[0].run()
    assert 0.0 <= metrics(path)[-1]["test_auc"] <= 1.0
    # the checkpoint carries the embedding rows and the store's SparseAdam state
    ckpt = load_checkpoint(path.parent / "runs" / "small" / "checkpoints")
    assert ckpt is not None
    emb = ckpt.sparse["embedding"]
    assert emb["weight"].shape[1] == 8
    assert {n.split(".")[-2] for n in emb["optimizer"]} == {"adam"}  # <name>.adam.m|v|step
    assert any(float(v.abs().sum()) > 0 for v in emb["optimizer"].values())


def test_hetero_job_on_2_machines_with_2_trainers_each(tmp_path):
    # DDP over 4 trainers: every parameter must take part in every step (the last layer's
    # convs into non-target types used to get no gradient: "Expected to have finished
    # reduction in the prior iteration" after one step)
    path = small_job(
        tmp_path,
        hetero=True,
        nodes=3000,
        task="hetero-node-classification",
        targetNodeType="paper",
        fanouts=[4, 3],
        epochs=3,
        lr=0.03,
        runtime={"trainersPerMachine": 2},
    )
    job, sink = run(path)
    report = job.run()
    assert all(report.exits[RoleName.trainer(r)] == 0 for r in range(4))
    assert '"model": "HeteroGNN"' in sink.getvalue()
    assert metrics(path)[-1]["test_acc"] > 0.5  # 4 classes: chance is 0.25


def waiting_run(tmp_path: Path) -> tuple[Path, subprocess.Popen[str]]:
    """`graphrun run` of a job whose trainers only wait, started and read until they wait:
    its job file and its process (stdout and stderr in one pipe)."""
    path = small_job(tmp_path, entryPoint="graphrun.testing.jobs:wait")
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphrun", "run", str(path), "--grace", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(),
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "waiting" in line:
            break
    return path, proc


def test_a_local_job_listens_on_loopback_only_and_sigterm_stops_everything(tmp_path):
    """One run for two things (each was its own run).

    Loopback: the trainers' TCP rendezvous store listened on every interface,
    unauthenticated; local jobs meet in a file of the run directory and gloo uses loopback.

    SIGTERM to `graphrun run` stops every process of the job and says so in one line (it
    said "job on - failed (no exit code): Cancelled")."""
    _, proc = waiting_run(tmp_path)
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
        hosts = json.loads((tmp_path / "runs" / "small" / "hosts.json").read_text())
        assert hosts["rendezvous"].startswith(f"file://{tmp_path / 'runs' / 'small'}")
        listening = [
            (ch.pid, c.laddr)
            for ch in descendants
            for c in ch.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening, "loopback: no listening sockets at all?"
        assert all(addr.ip in ("127.0.0.1", "::1") for _, addr in listening), listening
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 1, f"sigterm: exit {proc.returncode}: {out}"
    assert "graphrun: job failed: the job ended: Cancelled: stopped by a signal" in out, out
    assert "job on -" not in out, out
    _, alive = psutil.wait_procs(descendants, timeout=5)
    assert alive == [], f"sigterm: left {alive}"


CLUSTER = """
machines:
  - {name: m0, cpu: 1.0, memory_gb: 4, bandwidth_gbps: 1}
  - {name: m1, cpu: 0.5, memory_gb: %s, bandwidth_gbps: 0.3}
"""


@pytest.mark.netns
@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_a_profiled_job_on_heterogeneous_netns_hosts(tmp_path):
    """One run for three things a netns job does (each was its own run): its hosts are
    namespaces shaped by a cluster file, each trainer reads only its machine's partition
    from shared memory, and its profile records what crossed the network."""
    # no feature cache: this small graph's remote rows would all be cached (no feature
    # would cross the network), and what crosses it is what the profile must record
    path = small_job(tmp_path, epochs=2, lr=0.03, runtime={"featureCacheMb": 0})
    (tmp_path / "cluster.yaml").write_text(CLUSTER % 4)
    job, sink = run(
        path, hosts="netns", cluster=tmp_path / "cluster.yaml", profile_dir=tmp_path / "profile"
    )
    job.run()
    out = sink.getvalue()
    assert "10.77.0." in out  # the stores served on namespace addresses
    assert '"rank": 1, "local_parts": [1]' in out and '"rank": 0, "local_parts": [0]' in out
    assert metrics(path)[-1]["test_acc"] > 0.3
    sent = {  # tensor bytes each store sent, by op (its last log line)
        int(m[1]): json.loads(m[2])["reply_bytes"]
        for m in re.finditer(r"store:(\d) stopping; served (\{.*\})", out)
    }
    got: dict[int, Counter[str]] = {0: Counter(), 1: Counter()}  # what the trainers received
    for line in out.splitlines():
        if '"event": "traffic"' in line:
            for part, ops in json.loads(line[line.index("{") :])["received"].items():
                got[int(part)].update(ops)
    for part in (0, 1):
        for op in ("pull", "sample_neighbors"):
            assert got[part][op] == sent[part][op] > 0, (part, op)
    for rank in (0, 1):  # trainer r trains on partition r; the other one is remote
        records = read_records(tmp_path / "profile" / f"trainer-{rank}.jsonl")
        remote = 1 - rank
        assert all(r.fetch_s > 0 and r.sample_s > 0 for r in records)
        assert all(r.feature_bytes.get(rank, 0) > 0 for r in records)  # from shared memory
        features = sum(r.feature_bytes.get(remote, 0) for r in records)
        structure = sum(r.structure_bytes.get(remote, 0) for r in records)
        assert 0 < features <= got[remote]["pull"]  # the rest: evaluation, labels, masks
        assert 0 < structure <= got[remote]["sample_neighbors"]
    nothing_left(job)


@pytest.mark.netns
@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_a_host_that_overfills_its_memory_fails_there(tmp_path):
    # 0.2 GB cannot hold a trainer (torch + PyG): it is OOM-killed on m1, as on a real host
    path = small_job(tmp_path, epochs=2, lr=0.03)
    (tmp_path / "cluster.yaml").write_text(CLUSTER % 0.2)
    job, _ = run(path, hosts="netns", cluster=tmp_path / "cluster.yaml")
    with pytest.raises(JobFailed) as info:
        job.run()
    assert info.value.host == "m1" and info.value.exit_code == -9, info.value
    nothing_left(job)


def test_cluster_file_needs_netns_hosts(tmp_path):
    from graphrun.errors import SpecError

    path = small_job(tmp_path)
    (tmp_path / "cluster.yaml").write_text(CLUSTER % 4)
    job, _ = run(path, hosts="local", cluster=tmp_path / "cluster.yaml")
    with pytest.raises(SpecError, match=r"--cluster .*: needs --hosts netns"):
        job.check_inputs()


INLINE_PLAN = {
    "machines": ["node-a", "node-b"],
    "assignments": {
        "store:0": "node-a",
        "store:1": "node-a",
        "trainer:0": "node-b",
        "trainer:1": "node-b",
    },
}


@pytest.mark.parametrize("placement", [None, {"plan": INLINE_PLAN}], ids=["co-located", "plan"])
def test_workers_alone_finish_the_job_and_exit_0(tmp_path, placement):
    """As on Kubernetes: one `graphrun worker --job` per machine, no launcher; when the
    trainers finish, trainer 0 stops the stores and every worker exits 0 by itself —
    also when an inline plan leaves one machine only stores and the other only trainers
    (and the rendezvous)."""
    from graphrun.machine.roles import job_paths, job_placement, plan_hosts
    from graphrun.rpc.auth import generate_keys

    path = small_job(tmp_path, epochs=1, placement=placement)
    job = load_job(path)
    paths = job_paths(job, path)
    hosts = plan_hosts(job, job_placement(job, paths))
    hosts_file = hosts.write(tmp_path / "hosts.json")
    (tmp_path / "keys").mkdir()
    generate_keys(tmp_path / "keys" / "job.key")
    env = child_env()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "graphrun",
                "worker",
                "--job",
                str(path),
                "--machine",
                str(i),
                "--hosts-file",
                str(hosts_file),
                "--keys",
                str(tmp_path / "keys"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=110)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert metrics(path)[-1]["epoch"] == 0


@pytest.mark.parametrize(("name", "cls"), [("gcn", "GCN"), ("gat", "GAT")])
def test_the_named_model_is_trained_where_the_placement_plan_says(tmp_path, name, cls):
    """One run for two things (each was its own run): the model the job names is the one
    trained, and a placement plan is applied — trainer:0 moved off its partition's
    machine: m0 runs only store:0, m1 both trainers."""
    path = small_job(
        tmp_path, model=name, epochs=5, lr=0.03, placement={"assignments": {"trainer:0": "m1"}}
    )
    job, sink = run(path)
    job.run()
    assert f'"model": "{cls}"' in sink.getvalue(), "model: not the one named"
    assert metrics(path)[-1]["test_acc"] > 0.4, f"model: {metrics(path)[-1]}"
    launch = json.loads((tmp_path / "runs" / "small" / "launch" / "m0.json").read_text())
    assert [r["role"] for r in launch["roles"]] == ["store:0"], f"plan: {launch}"
    assert "[trainer:0@m1]" in sink.getvalue(), "plan: trainer:0 not on m1"
    assert metrics(path)[-1]["epoch"] == 4, "plan: the job did not train to its end"


def test_failed_trainer_restarts_within_the_backoff_limit(tmp_path):
    path = small_job(
        tmp_path, entryPoint="graphrun.testing.jobs:fail_unless_resumed",
        run_policy={"backoffLimit": 1},
    )  # fmt: skip
    job, sink = run(path)
    report = job.run()
    assert report.state.restarts == 1 and report.exits[RoleName.trainer(1)] == 0
    assert "phase Restarting" in sink.getvalue()
    assert "first attempt fails on purpose" in sink.getvalue()
    nothing_left(job)


def test_corrupt_checkpoint_fails_at_once_without_restarts(tmp_path):
    path = small_job(tmp_path, run_policy={"backoffLimit": 2})
    ckpt = tmp_path / "runs" / "small" / "checkpoints"
    ckpt.mkdir(parents=True)
    (ckpt / "checkpoint.pt").write_bytes(b"not a checkpoint")
    job, sink = run(path, resume=True)
    # checked whole in the launcher before any role starts (it was a trainer's exit 2)
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt: not a readable checkpoint"):
        job.run()
    assert job.state.restarts == 0 and "phase Restarting" not in sink.getvalue()
    assert "phase Serving" not in sink.getvalue() and not job.pids  # no role started
    no_children()


def _losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["epoch"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def test_kill_and_resume_reproduces_an_uninterrupted_run(tmp_path):
    # the seed used to be re-applied at resume: dropout masks of the resumed epochs then
    # differed from the uninterrupted run's (epoch 4 loss 0.0854 against 0.0944)
    path = small_job(tmp_path, epochs=4, lr=0.03, dropout=0.5)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    cli = [sys.executable, "-m", "graphrun", "run", str(path), "--grace", "1"]
    env = child_env()
    # the uninterrupted run's trainers are new interpreters, the cut one's are forked
    # warm: the same losses (a warm trainer's random generators are a new interpreter's)
    done = subprocess.run([*cli, "--run-dir", str(whole), "--no-warm-start"], env=env,
                          capture_output=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert not read_status(whole / "status" / "m0.json").roles[RoleName.parse("trainer:0")].warm
    proc = subprocess.Popen([*cli, "--run-dir", str(cut)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    ckpt = cut / "checkpoints" / "checkpoint.pt"
    deadline = time.monotonic() + 240
    while not (ckpt.exists() and 1 in _losses(cut)) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every role, mid-epoch 2
    proc.wait()
    assert load_checkpoint(cut / "checkpoints") is not None
    assert read_status(cut / "status" / "m0.json").roles[RoleName.parse("trainer:0")].warm
    resumed = subprocess.run([*cli, "--run-dir", str(cut), "--resume"], env=env,
                             capture_output=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    want, got = _losses(whole), _losses(cut)
    assert sorted(got) == [0, 1, 2, 3]
    for epoch in range(4):
        assert got[epoch] == pytest.approx(want[epoch], rel=1e-6, abs=1e-7), (epoch, got, want)


def test_two_jobs_train_on_one_running_store_and_leave_it_serving(tmp_path):
    """`graph.store` names a running `graphrun serve`: nothing is partitioned or served,
    trainers join it, and the store keeps serving the next job (it used to be reachable
    only through the Python API)."""
    import yaml

    from graphrun.cli import main
    from graphrun.errors import SpecError
    from graphrun.local.stores import start_stores
    from graphrun.rpc.auth import generate_keys

    path = small_job(tmp_path, epochs=2, lr=0.03)
    generate_keys(tmp_path / "store.key")
    clients = tmp_path / "clients"
    clients.mkdir()  # the second job has a key of its own: it acts as that job only
    assert (
        main(["keygen", str(clients / "second.key"), "--store", str(tmp_path / "store.key")]) == 0
    )
    extra = ["--clients", str(clients)]
    with start_stores(
        tmp_path / "parts", 2, key_file=tmp_path / "store.key", extra_args=extra
    ) as stores:
        spec = yaml.safe_load(path.read_text())
        spec["spec"]["graph"] = {"store": {"addresses": [s.address for s in stores]}}
        del spec["spec"]["partition"]
        for name, key in (("first", "store.key"), ("second", "clients/second.key")):
            spec["spec"]["graph"]["store"]["keyFile"] = key
            spec["metadata"]["name"] = name
            job_file = tmp_path / f"{name}.yaml"
            job_file.write_text(yaml.safe_dump(spec))
            job, sink = run(job_file)
            report = job.run()
            assert report.exits == {
                RoleName.trainer(0): 0,
                RoleName.trainer(1): 0,
            }  # no store roles
            assert "using the running store" in sink.getvalue()
            # nothing was partitioned or distributed: those phases are not shown
            assert "phase Partitioning" not in sink.getvalue()
            assert "phase Distributing" not in sink.getvalue()
            assert "phase Serving" in sink.getvalue()
            last = json.loads((tmp_path / "runs" / name / "metrics.jsonl").read_text()
                              .splitlines()[-1])  # fmt: skip
            assert last["test_acc"] > 0.5
            for s in stores:
                s.check()  # still serving
        # a wrong key is refused before any process starts, naming the field
        generate_keys(tmp_path / "other.key")
        spec["spec"]["graph"]["store"]["keyFile"] = "other.key"
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec))
        with pytest.raises(SpecError, match=r"spec\.graph\.store\.addresses: cannot join"):
            run(tmp_path / "bad.yaml")[0].run()
        # a feature the store does not hold, likewise
        spec["spec"]["graph"]["store"]["keyFile"] = "store.key"
        spec["spec"]["training"]["feature"] = "nope"
        (tmp_path / "nofeat.yaml").write_text(yaml.safe_dump(spec))
        with pytest.raises(SpecError, match=r"store has no feature node/_N/nope \(spec\.train"):
            run(tmp_path / "nofeat.yaml")[0].run()


@pytest.mark.timeout(240)  # three runs in a row
def test_a_run_killed_with_sigkill_is_reported_lost_by_the_next_which_resume_continues(tmp_path):
    """Three runs of one job for two things (the last two were a test of their own).

    After kill -9 of `graphrun run`, state.json said "Training" forever and the stores'
    shared memory stayed until some other store started on the host.

    Resume: the next run, which completed its one epoch, resumed with two epochs goes on
    from its checkpoint."""
    import yaml

    path, proc = waiting_run(tmp_path)
    state_file = tmp_path / "runs" / "small" / "state.json"
    phase = lambda: json.loads(state_file.read_text())["phase"]  # noqa: E731
    # the launcher moves to Training at its next poll of the machines: the trainer's
    # "waiting" line can come first (a CI run killed it still Serving)
    assert wait_for(lambda: phase() == "Training", 30), phase()
    roles = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.wait(10)
    psutil.wait_procs(roles, timeout=30)
    assert phase() == "Training"
    # the stores unlinked their segments themselves (SIGTERM when their worker died)
    dead = tuple(f"graphrun-{r.pid}-" for r in roles)
    assert [p for p in os.listdir("/dev/shm") if p.startswith(dead)] == []
    spec = yaml.safe_load(path.read_text())  # the next run of the same job
    del spec["spec"]["training"]["entryPoint"]
    spec["spec"]["training"]["task"] = "node-classification"
    path.write_text(yaml.safe_dump(spec))
    job, sink = run(path)
    job.run()
    assert "was lost in phase Training" in sink.getvalue()
    created = json.loads(state_file.read_text())["conditions"][0]
    assert "the previous run (graphrun run, pid" in created["message"]
    assert [p for p in os.listdir("/dev/shm") if p.startswith(dead)] == []
    text = path.read_text()
    assert "epochs: 1\n" in text
    path.write_text(text.replace("epochs: 1\n", "epochs: 2\n"))
    job, sink = run(path, resume=True)
    job.run()
    assert [m["epoch"] for m in metrics(path)] == [0, 1], f"resume: {metrics(path)}"
    assert '"event": "resumed", "from_epoch": 0' in sink.getvalue(), "resume: not resumed"


def distributed_job(
    tmp_path: Path, chunks: int = 4, hetero: bool = False, **training: object
) -> tuple[Path, Any]:
    """small_job's graph as a ``chunks``-chunk dataset, partitioned by the job's 2
    machines: the job file and the graph."""
    import shutil

    import yaml

    from graphrun.graph.chunked import save_chunked
    from graphrun.graph.generate import GenParams, academic, community

    path = small_job(tmp_path, hetero=hetero, **training)
    shutil.rmtree(tmp_path / "parts")
    shutil.rmtree(tmp_path / "data")
    params = GenParams(nodes=2000, avg_degree=8, feat_dim=16, classes=4, seed=0)
    graph = academic(params) if hetero else community(params)
    save_chunked(graph, tmp_path / "data", chunks)
    spec = yaml.safe_load(path.read_text())
    spec["spec"]["partition"].update(mode="distributed", balanceTrain=True)
    path.write_text(yaml.safe_dump(spec))
    return path, graph


def test_distributed_partitioning_on_the_jobs_machines(tmp_path):
    path, _ = distributed_job(tmp_path, epochs=3, lr=0.03)
    job, sink = run(path)
    report = job.run()
    log = sink.getvalue()
    # one rank per machine, each a role of its own, before the stores serve
    assert "[partitioner:0@m0]" in log and "[partitioner:1@m1]" in log
    meta = json.loads((tmp_path / "parts" / "partition.json").read_text())
    assert meta["method"] == "xtrapulp" and meta["num_parts"] == 2
    assert not list(tmp_path.glob("parts.*"))  # no staging directory left
    assert all(report.exits[RoleName.trainer(r)] == 0 for r in range(2))
    assert metrics(path)[-1]["test_acc"] > 0.5  # 4 classes: chance is 0.25


def test_distributed_partitioning_of_a_heterograph_whose_loader_workers_end_quietly(tmp_path):
    """One run for two things (each was its own run).

    partition.mode distributed on a heterograph whose second chunk holds no paper (the
    labelled type) crashed in every job.

    The sampler workers' sessions heartbeated until their trainer closed them, after
    trainer 0 had stopped the stores: "heartbeat to tcp://... failed: connection lost" at
    the end of every successful hetero job with sampler workers."""
    path, graph = distributed_job(
        tmp_path, chunks=2, hetero=True, task="hetero-node-classification",
        targetNodeType="paper", fanouts=[4, 3], runtime={"samplerWorkersPerTrainer": 1},
    )  # fmt: skip
    assert graph.node_type_offsets[1] <= 1000  # papers first, all in chunk 0
    job, sink = run(path)
    report = job.run()
    meta = json.loads((tmp_path / "parts" / "partition.json").read_text())
    assert meta["method"] == "xtrapulp" and meta["node_types"] == list(graph.node_types)
    assert all(report.exits[RoleName.trainer(r)] == 0 for r in range(2))
    out = sink.getvalue()
    assert "heartbeat to" not in out and "connection lost" not in out, f"heartbeats: {out}"
    # deterministic: every session but trainer 0's (it stops them) left every store before
    # it stopped — 2 loader workers and trainer 1; before, none had
    served = [json.loads(x.split(" served ", 1)[1]) for x in out.splitlines() if " served {" in x]
    assert len(served) == 2 and all(s["requests"].get("leave") == 3 for s in served), served
    nothing_left(job)


def test_distributed_partitioning_fails_naming_the_rank(tmp_path):
    path, _ = distributed_job(tmp_path)
    (tmp_path / "data" / "chunk-3" / "src.npy").unlink()  # rank 1 reads chunks 2 and 3
    job, _ = run(path)
    with pytest.raises(JobFailed) as err:
        job.run()
    assert err.value.role == RoleName.partitioner(1) and err.value.host == "m1"
    assert not (tmp_path / "parts").exists() and not list(tmp_path.glob("parts*"))


def test_distributed_partitioning_refuses_a_missing_chunk_before_starting(tmp_path):
    from graphrun.errors import UserError

    path, _ = distributed_job(tmp_path)
    (tmp_path / "data" / "chunk-2" / "chunk.json").unlink()
    job, sink = run(path)
    with pytest.raises(UserError, match=r"chunk-2/chunk\.json"):
        job.run()
    assert "partitioner" not in sink.getvalue()


@pytest.mark.netns
@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_distributed_partitioning_on_netns_hosts(tmp_path):
    # each rank in its machine's network namespace, gloo over the namespaces' links
    path, _ = distributed_job(tmp_path, epochs=1)
    job, sink = run(path, hosts="netns")
    report = job.run()
    assert "[partitioner:1@m1]" in sink.getvalue()
    assert json.loads((tmp_path / "parts" / "partition.json").read_text())["num_parts"] == 2
    assert all(report.exits[RoleName.trainer(r)] == 0 for r in range(2))


@pytest.mark.timeout(240)
def test_a_killed_trainer_is_named_on_the_console_not_the_survivors_traceback(tmp_path):
    # the console showed trainer 0's gloo "Connection reset by peer" traceback; that
    # trainer 1 had been killed (SIGKILL) was only in a log file
    from graphrun.local.console import Console

    path = small_job(tmp_path, epochs=200)
    out = io.StringIO()
    job = LocalJob(load_job(path), path, RunOptions(grace_s=3.0), sink=Console(out))
    hit: list[int] = []

    def kill_trainer_1() -> None:
        m = path.parent / "runs" / "small" / "metrics.jsonl"
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            st = read_status(path.parent / "runs" / "small" / "status" / "m1.json")
            if m.is_file() and m.read_text().count("\n") >= 2 and st:
                pid = st.pids()[RoleName.parse("trainer:1")]
                os.kill(pid, signal.SIGKILL)  # a trainer of this test's job
                hit.append(pid)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_trainer_1)
    killer.start()
    with pytest.raises(JobFailed) as info:
        job.run()
    killer.join()
    assert hit
    assert (info.value.role, info.value.host, info.value.exit_code) == (
        RoleName.trainer(1),
        "m1",
        -9,
    )
    console = out.getvalue()
    assert "Traceback" not in console and "[rank0]" not in console, console
    assert "Connection reset" not in console, console
    log = tmp_path / "runs" / "small" / "logs" / "m1" / "trainer-1.log"
    assert f"trainer:1 on m1 failed first (killed by SIGKILL); its log: {log}" in console
    assert log.is_file()
    nothing_left(job)


def test_disk_features_train_to_the_losses_of_shared_memory(tmp_path):
    """``runtime.storeFeatures.storage: disk``: the stores read node features from the
    partition files through a cache of about a quarter of them; the losses are those of
    the job with features in shared memory, and the epoch records the cache's hit rate
    and the bytes read from the files."""
    runs = {}
    for storage, workers in (("memory", 0), ("disk", 0), ("disk", 1)):
        feats = {"storage": storage, "cacheMb": 0.02}
        d = tmp_path / f"{storage}-{workers}"
        d.mkdir()
        runtime = {"storeFeatures": feats, "samplerWorkersPerTrainer": workers}
        path = small_job(d, epochs=2, lr=0.03, runtime=runtime)
        job, _ = run(path)
        report = job.run()
        assert report.exits[RoleName.trainer(0)] == 0 and report.exits[RoleName.trainer(1)] == 0
        runs[storage, workers] = metrics(path)
        nothing_left(job)
    mem, disk, workers = runs["memory", 0], runs["disk", 0], runs["disk", 1]
    assert [r["loss"] for r in disk] == pytest.approx([r["loss"] for r in mem], rel=1e-6)
    assert all("disk_hit_rate" not in r for r in mem)
    for r in disk:
        assert 0 < r["disk_hit_rate"] < 1 and r["disk_bytes"] > 0
    # co-located trainers read the files themselves and count with their batches: sampler
    # workers build the same batches, so they read (and count) the same bytes
    assert [r["loss"] for r in workers] == pytest.approx([r["loss"] for r in mem], rel=1e-6)
    fields = [(r["disk_hit_rate"], r["disk_bytes"]) for r in disk]
    assert [(r["disk_hit_rate"], r["disk_bytes"]) for r in workers] == fields
