"""``graphrun bench elastic``: a machine lost under ``runtime.elastic``, JSON out.

The same 3-machine job (``--hosts netns`` by default: each machine a network namespace
with its own link) on the same partitions, three times:

1. ``replicas: 1``, undisturbed: the baseline epoch;
2. ``replicas: 2``, ``elastic: {minMachines: 2}``, undisturbed: ``replica_overhead``
   (its median epoch over run 1's, minus 1), ``replica_memory_mb`` (the replica servers'
   peak proportional set size, summed), ``test_acc_undisturbed``;
3. the same, and once epoch ``--kill-epoch`` started a client writes known rows to a
   DistEmbedding, then ``m1`` is hurt at a seeded step of that epoch (``--fault``:
   ``kill`` every process of it, ``stop`` them all (SIGSTOP), or ``cut`` its link, netns
   hosts only): ``resume_s`` (from the fault to the survivors' re-formed group, the
   ``reformed`` event), ``paused_s`` (from their last step before it), ``lost_updates``
   (rows read back different after the re-form from what was acknowledged: half of
   them written again right after the fault), ``test_acc``. A stopped or cut-off
   machine is fenced by the launcher once the others re-formed (docs/elastic.md).

Without ``--dataset`` a community graph of ``--nodes`` nodes is generated. Prints one
JSON object::

    {"bench": "elastic", "hosts": "netns", "nodes": .., "epochs": .., "kill_epoch": ..,
     "fault": "kill", "timeout_seconds": 60.0,
     "resume_s": .., "paused_s": .., "lost_updates": 0, "test_acc": ..,
     "test_acc_undisturbed": .., "replica_overhead": .., "replica_memory_mb": ..,
     "epoch_s": {"replicas1": .., "replicas2": .., "killed": [...]}, "world_sizes": [...]}
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from graphrun.arguments import integer, integers, number, output_dir
from graphrun.bench import MAX_BATCH_SIZE, MAX_EPOCHS, MAX_FANOUT, MAX_HIDDEN, MAX_LAYERS
from graphrun.errors import ArgumentError, GraphrunError
from graphrun.record import Event, FirstStep, Reformed, console_events

SEED = 31
MAX_NODES = 10_000_000  # of the generated graph
MACHINES = 3
FAULTS = ("kill", "stop", "cut")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "elastic",
        help="a machine lost under runtime.elastic: resume time, lost updates, accuracy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dataset", type=Path, help="dataset directory (default: generate one)")
    p.add_argument("--nodes", type=integer(1000, MAX_NODES), default=20_000,
                   help="without --dataset: its nodes")  # fmt: skip
    p.add_argument("--epochs", type=integer(2, MAX_EPOCHS), default=10)
    p.add_argument("--kill-epoch", type=integer(1, MAX_EPOCHS), default=4)
    p.add_argument(
        "--fault", choices=FAULTS, default="kill",
        help="what happens to m1: every process killed, stopped (SIGSTOP), or its link cut",
    )  # fmt: skip
    p.add_argument(
        "--timeout-seconds", type=number(0, 3600, above=True), default=60.0,
        help="runtime.elastic.timeoutSeconds: how soon a stopped or cut-off m1 counts as lost",
    )  # fmt: skip
    p.add_argument("--hosts", choices=("local", "netns"), default="netns")
    p.add_argument("--batch-size", type=integer(1, MAX_BATCH_SIZE), default=100)
    p.add_argument("--fanouts", type=integers(-1, MAX_FANOUT, MAX_LAYERS), default=[25, 10],
                   help="comma-separated, one per layer (-1: all)")  # fmt: skip
    p.add_argument("--hidden", type=integer(1, MAX_HIDDEN), default=128)
    p.add_argument("--workdir", type=output_dir,
                   help="keep the dataset, partitions and logs here")  # fmt: skip
    p.set_defaults(func=run)


def _job(workdir: Path, dataset: Path, args: argparse.Namespace, replicas: int) -> Path:
    import yaml

    runtime: dict[str, Any] = {"machines": MACHINES, "hosts": args.hosts, "replicas": replicas}
    if replicas > 1:
        runtime["elastic"] = {"minMachines": MACHINES - 1, "timeoutSeconds": args.timeout_seconds}
    spec = {
        "apiVersion": "graphrun.io/v1alpha1", "kind": "GraphJob",
        "metadata": {"name": "elastic"},
        "spec": {
            "graph": {"dataset": str(dataset.resolve())},
            "partition": {"parts": MACHINES, "output": str(workdir / "parts")},
            "runtime": runtime,
            "training": {"task": "node-classification", "epochs": args.epochs,
                         "batchSize": args.batch_size,
                         "fanouts": args.fanouts,
                         "hidden": args.hidden, "lr": 0.003, "evalEvery": args.epochs},
        },
    }  # fmt: skip
    path = workdir / f"job-r{replicas}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


class Chaos(threading.Thread):
    """Known DistEmbedding rows written once epoch ``epoch`` started, ``machine`` hurt
    (``fault``, one of :data:`FAULTS`) at a step of its first half that ``seed`` picks, the
    rows read back once the trainers re-formed (through a client in a surviving machine's
    network).

    Everything slow is done before the job gets there: the imports (torch: seconds on a
    loaded machine) at once, the store's join once the trainers train; a client that
    joined only when the epoch before the kill ended met stores already stopped on a
    short job (its join timed out and no machine was killed). A wait ends as soon as
    the job has (``job_done``), with an error saying what never happened."""

    def __init__(
        self, run_dir: Path, sink: Any, machine: str, epoch: int, fault: str = "kill",
        seed: int = SEED,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True)
        if fault not in FAULTS:
            raise ArgumentError(f"fault: {fault!r} is not one of {', '.join(FAULTS)}")
        self.run_dir, self.sink, self.machine, self.epoch = run_dir, sink, machine, epoch
        self.fault, self.seed = fault, seed
        self.job_done = threading.Event()
        self.killed_at: float | None = None
        self.killed_step: int | None = None
        self.lost_updates: int | None = None
        self.error: str | None = None

    def run(self) -> None:
        try:
            self._chaos()
        except Exception as exc:  # reported in the JSON, and the bench fails
            self.error = f"{type(exc).__name__}: {exc}"

    def _wait(self, cond: Any, what: str, timeout: float = 3600.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.job_done.is_set():
                raise RuntimeError(f"the job ended before {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:g} s")
            time.sleep(0.05)

    def _events(self, kind: type) -> list[Event]:
        return [e for e in console_events(self.sink.getvalue()) if isinstance(e, kind)]

    def _lines(self, path: Path) -> int:
        return len(path.read_text().splitlines()) if path.is_file() else 0

    def _chaos(self) -> None:
        from graphrun.local.elastic import cut_link, kill_machine, stop_machine, worker_pids
        from graphrun.store.embedding import DistEmbedding  # noqa: F401  (imports torch)

        hurt = {"kill": kill_machine, "stop": stop_machine, "cut": cut_link}[self.fault]
        metrics = self.run_dir / "metrics.jsonl"
        self._wait(lambda: bool(self._events(FirstStep)), "its first step")
        # the client's sockets live where the stores are reachable: a surviving machine's
        # network namespace (setns moves this thread only; the zmq and heartbeat threads
        # it starts follow)
        _enter_netns(worker_pids("m1" if self.machine == "m0" else "m0")[0])
        client = RowsClient(self.run_dir)
        try:
            # the rows are written once the epoch before the kill's ended
            self._wait(lambda: self._lines(metrics) >= self.epoch, f"epoch {self.epoch}")
            client.write()
            steps = json.loads(metrics.read_text().splitlines()[0])["steps"]
            # a step of the epoch's first half: one near its end may be past (the epoch
            # over) by the time a loaded box lets this thread see it
            at = steps * self.epoch + random.Random(self.seed).randint(1, max(1, steps // 2))
            prof = self.run_dir / "profile" / "trainer-0.jsonl"
            self._wait(lambda: self._lines(prof) >= at, f"step {at} (the {self.fault})")
            self.killed_step = self._lines(prof)
            if not hurt(self.machine):
                raise RuntimeError(f"no process of {self.machine} to {self.fault}")
            self.killed_at = time.time()
            client.write_again()
            self._wait(lambda: bool(self._events(Reformed)), "the re-form", 600)
            self.lost_updates = client.lost()
        finally:
            client.close()


def _enter_netns(pid: int) -> None:
    """Move the calling thread into process ``pid``'s network namespace (if not there)."""
    import ctypes
    import os

    mine, theirs = Path("/proc/thread-self/ns/net"), Path(f"/proc/{pid}/ns/net")
    if os.readlink(mine) == os.readlink(theirs):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(theirs, os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns into the network namespace of {pid}")
    finally:
        os.close(fd)


class RowsClient:
    """Known rows written to a DistEmbedding of the job's store (job ``chaos``)."""

    def __init__(self, run_dir: Path) -> None:
        from graphrun.job.hosts import Hosts
        from graphrun.rpc.auth import load_keys
        from graphrun.store.client import ClientConfig, KVClient
        from graphrun.store.embedding import DistEmbedding

        hosts = Hosts.read(run_dir / "hosts.json")
        parts = sorted(hosts.store_endpoints().items())
        copies = hosts.replica_endpoints()
        self.client = KVClient(
            ClientConfig(
                [f"tcp://{eps[0]}" for _, eps in parts], job="chaos", timeout=10,
                keys=load_keys(run_dir / "keys" / "job.key"), name="chaos",
                replicas=tuple(tuple(f"tcp://{e}" for e in copies.get(p, ())) for p, _ in parts),
            )
        )  # fmt: skip
        n = int(self.client.book.num_nodes)  # a node-policy tensor: a row per node
        self.emb = DistEmbedding(self.client, n, 4, "known", init="zeros")
        self.ids = np.arange(n, dtype=np.int64)
        self.known = np.random.default_rng(SEED).standard_normal((n, 4)).astype(np.float32)

    def write(self) -> None:
        """The known rows; acknowledged once it returns: on both copies."""
        self.emb.weight[self.ids] = self.known

    def write_again(self) -> None:
        """New known values for every other row, written while a machine is silent or
        gone: a write to a partition whose primary does not answer fails over to its
        replica; one whose replica does not answer is acknowledged by the primary alone."""
        ids = self.ids[::2]
        again = np.random.default_rng(SEED + 1).standard_normal((len(ids), 4)).astype(np.float32)
        self.emb.weight[ids] = again
        self.known[ids] = again

    def lost(self) -> int:
        """Rows that read back different from what was last acknowledged."""
        got = self.emb.weight[self.ids].numpy()
        return int((got != self.known).any(axis=1).sum())

    def close(self) -> None:
        self.client.close()


def _run(
    path: Path, run_dir: Path, hosts: str, workdir: Path, kill_epoch: int | None = None,
    fault: str = "kill",
) -> dict[str, Any]:  # fmt: skip
    """One run of the job file ``path``; with ``kill_epoch``, :class:`Chaos` in it."""
    import io

    from graphrun.bench.train import RssSampler
    from graphrun.job.spec import load_job
    from graphrun.local.runner import LocalJob, RunOptions

    shutil.rmtree(run_dir, ignore_errors=True)
    opts = RunOptions(run_dir=run_dir, hosts=hosts, profile_dir=run_dir / "profile")
    sink = io.StringIO()
    job = load_job(path)
    rss = RssSampler(run_dir / "status")
    if kill_epoch is None:  # memory is measured undisturbed
        rss.start()
    killer = None
    if kill_epoch is not None:
        killer = Chaos(run_dir, sink, "m1", kill_epoch, fault)
        killer.start()
    try:
        LocalJob(job, path, opts, sink=sink).run()
    finally:
        if killer is not None:
            killer.job_done.set()
        rss.stop.set()
        if rss.is_alive():
            rss.join()
        (workdir / f"{run_dir.name}.log").write_text(sink.getvalue())
    if killer is not None:
        killer.join(60)
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out: dict[str, Any] = {
        "epoch_s": [r["epoch_s"] for r in recs],
        "test_acc": recs[-1].get("test_acc"),
        "replica_memory_mb": round(
            sum(v for r, v in rss.role_peak.items() if r.kind == "store" and r.replica), 1
        ),
        "world_sizes": [r.get("world_sizes") for r in recs],
    }
    if killer is not None:
        reformed = [e for e in console_events(sink.getvalue()) if isinstance(e, Reformed)]
        out.update(lost_updates=killer.lost_updates, chaos_error=killer.error)
        out["kill_step"] = killer.killed_step
        if reformed and killer.killed_at is not None:
            out["resume_s"] = round(reformed[0].time - killer.killed_at, 3)
            out["paused_s"] = reformed[0].paused_s
    return out


def run(args: argparse.Namespace) -> int:
    if not 0 < args.kill_epoch < args.epochs:
        raise ArgumentError(f"--kill-epoch: {args.kill_epoch} is not in [1, {args.epochs})")
    if args.fault == "cut" and args.hosts != "netns":
        raise ArgumentError("--fault cut: needs --hosts netns (a machine's own link)")
    if args.dataset is not None and not args.dataset.is_dir():
        raise ArgumentError(f"--dataset: {args.dataset} is not a directory")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="graphrun-bench-elastic-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        dataset = args.dataset
        nodes = None
        if dataset is None:
            from graphrun.graph import save_dataset
            from graphrun.graph.generate import GenParams, community

            dataset = workdir / "data"
            nodes = args.nodes
            if not dataset.is_dir():
                params = GenParams(nodes=args.nodes, avg_degree=20, feat_dim=32, classes=8)
                save_dataset(community(params), dataset)
        base = _run(_job(workdir, dataset, args, 1), workdir / "run-r1", args.hosts, workdir)
        rep = _job(workdir, dataset, args, 2)
        calm = _run(rep, workdir / "run-r2", args.hosts, workdir)
        hit = _run(rep, workdir / "run-killed", args.hosts, workdir, args.kill_epoch, args.fault)
        e1, e2 = statistics.median(base["epoch_s"]), statistics.median(calm["epoch_s"])
        result = {
            "bench": "elastic", "hosts": args.hosts, "dataset": str(args.dataset or ""),
            "nodes": nodes, "epochs": args.epochs, "kill_epoch": args.kill_epoch,
            "fault": args.fault, "timeout_seconds": args.timeout_seconds,
            "resume_s": hit.get("resume_s"), "paused_s": hit.get("paused_s"),
            "lost_updates": hit.get("lost_updates"), "test_acc": hit["test_acc"],
            "test_acc_undisturbed": calm["test_acc"], "test_acc_replicas1": base["test_acc"],
            "replica_overhead": round(e2 / e1 - 1.0, 4),
            "replica_memory_mb": calm["replica_memory_mb"],
            "epoch_s": {"replicas1": round(e1, 4), "replicas2": round(e2, 4),
                        "killed": hit["epoch_s"]},
            "kill_step": hit.get("kill_step"), "world_sizes": hit["world_sizes"],
            "chaos_error": hit.get("chaos_error"),
        }  # fmt: skip
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result), flush=True)
    if result["chaos_error"] is not None:  # the numbers of the kill are missing: say why
        raise GraphrunError(f"bench elastic: the kill run failed: {result['chaos_error']}")
    return 0
