"""``graphrun bench placement --real``: the closed loop on emulated heterogeneous hosts.

Everything runs for real on network-namespace hosts with their own CPU share, memory
limit and link rate (``--cluster``; by default :data:`DEFAULT_CLUSTER`: two fast hosts
of 0.6 CPU and 1 Gbit/s, two slow ones of 0.2 CPU and 0.3 Gbit/s):

1. ``graphrun probe`` measures the hosts; the probed cluster is what the planner sees.
2. The job runs co-located (one store server and one trainer on every host) with
   ``--profile``: its trainers' batch records and its store servers' serving CPU become
   the profile (the CPU seconds the simulator shares out among each host's cores; the
   first epoch's batches left out, as from the measured epochs), its roles' peak memory
   their demands.
3. ``graphrun plan``'s search places the job on the probed cluster; the simulator
   predicts the epoch of co-location, of the plan and of ``--random`` random placements.
4. The plan and the random placements run, profiled too; each epoch is measured, and
   the trainers' mean CPU seconds a step in the measured epochs are reported beside it
   (``trainer_cpu_s_per_step``: the machine's speed drifts between runs, and this tells a
   run that got faster CPU from a model that is wrong).

``--seconds`` is the plan's search budget, as without ``--real``. ``--sync ps`` runs the
job with parameter servers (``--parameter-servers``; ``--staleness K`` for the
asynchronous mode): the model's ``ps:J`` tasks are placed and their gradient and
parameter flows predicted, and their updates charged to their machines' cores with the
CPU seconds a step the co-located run's parameter servers measured.

Prints one JSON object::

    {"bench": "placement-real", "dataset": .., "cluster": {machine: {cpu, memory_gb,
     gbps}}, "probe": {machine: {"set_gbps", "probed_gbps", "error"}},
     "runs": [{"placement": "co-location" | "plan" | "random-<i>",
               "assignments": {role: machine}, "predicted_epoch_s": ..,
               "measured_epoch_s": .., "epoch_s_all": [..], "error": predicted /
               measured - 1, "trainer_cpu_s_per_step": ..}, ...],
     "speedup_vs_colocation": co-location measured / plan measured,
     "speedup_vs_best_random": best random measured / plan measured,
     "max_abs_error": over every run, "steps_per_epoch": .., "load_avg": [..]}

A measured epoch is the median over the epochs after the first (the first warms up).
Predicted epochs are the simulated time of ``--iterations`` iterations scaled to the
epoch's steps. Needs root (network namespaces and cgroups).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphrun.errors import ArgumentError
from graphrun.names import RoleName

# the heterogeneous cluster: two fast hosts and two slow ones
DEFAULT_CLUSTER: dict[str, Any] = {
    "apiVersion": "graphrun.io/v1alpha1",
    "kind": "Cluster",
    "machines": [
        {"name": "m0", "cpu": 0.6, "memory_gb": 4, "bandwidth_gbps": 1.0},
        {"name": "m1", "cpu": 0.6, "memory_gb": 4, "bandwidth_gbps": 1.0},
        {"name": "m2", "cpu": 0.2, "memory_gb": 2, "bandwidth_gbps": 0.3},
        {"name": "m3", "cpu": 0.2, "memory_gb": 2, "bandwidth_gbps": 0.3},
    ],
}
MEMORY_MARGIN = 1.25  # a role's demand over the peak it reached in the profiled run
# seconds of each probe measurement: a host's CPU is read over a window that does not
# start at a quota period's start, off by up to one period's quota (60 ms of a 0.6-CPU
# host's): a 1 s window read a 0.6 host 0.597-0.628, 3 s keep that within ~3%
PROBE_SECONDS = 3.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--real: the closed loop on netns hosts")
    g.add_argument("--real", action="store_true", help="run the closed loop (needs root)")
    g.add_argument("--dataset", type=Path, help="--real: dataset directory")
    g.add_argument(
        "--cluster", type=Path, help="--real: hosts to emulate (default: 2 fast, 2 slow)"
    )
    g.add_argument("--epochs", type=int, default=4, help="--real: epochs per run (default 4)")
    g.add_argument("--random", type=int, default=2, help="--real: random placements run")
    g.add_argument("--iterations", type=int, default=16, help="--real: iterations simulated")
    g.add_argument("--batch-size", type=int, default=1000, help="--real: seeds per trainer batch")
    g.add_argument("--no-probe", action="store_true", help="--real: plan on --cluster as written")
    g.add_argument("--workdir", type=Path, help="--real: keep partitions, runs and plans here")
    g.add_argument(
        "--sync", choices=("allreduce", "ps"), default="allreduce",
        help="--real: training.sync of the job (ps: parameter servers, placed by the plan)",
    )  # fmt: skip
    g.add_argument("--parameter-servers", type=int, default=1, help="--real, --sync ps: how many")
    g.add_argument(
        "--staleness", type=int, default=0,
        help="--real, --sync ps: training.staleness (0 synchronous, k >= 1 asynchronous)",
    )  # fmt: skip


@dataclass(frozen=True)
class Measured:
    epoch_s: float
    epoch_s_all: list[float]
    steps: int
    trainer_cpu_s: float  # mean CPU seconds of a trainer's step in the measured epochs


def check_args(args: argparse.Namespace) -> None:
    """Everything checkable before a host is made."""
    from graphrun.local.netns import unavailable_reason
    from graphrun.placement.cluster import load_cluster

    if args.dataset is None:
        raise ArgumentError("--dataset: needed with --real")
    if not args.dataset.is_dir():
        raise ArgumentError(f"--dataset: {args.dataset} is not a dataset directory")
    if args.epochs < 2:
        raise ArgumentError("--epochs: must be >= 2 (the first epoch warms up)")
    if args.sync == "ps" and not 1 <= args.parameter_servers <= 64:
        raise ArgumentError("--parameter-servers: expected 1..64")
    if args.staleness and (args.sync != "ps" or not 0 < args.staleness <= 1000):
        raise ArgumentError("--staleness: 1..1000, and only with --sync ps")
    if args.random < 0 or args.iterations < 1 or args.batch_size < 1:
        raise ArgumentError("--random must be >= 0, --iterations and --batch-size >= 1")
    if args.cluster is not None:
        load_cluster(args.cluster)  # one line naming the field when it is wrong
    reason = unavailable_reason()
    if reason is not None:
        raise ArgumentError(f"--real: netns hosts are unavailable here ({reason})")


def job_data(
    dataset: Path, machines: list[str], parts_dir: Path, epochs: int, batch_size: int = 1000,
    parameter_servers: int = 0, staleness: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """The benchmark's GraphJob: ``graphrun bench train``'s GraphSAGE, a partition, a
    store server and a trainer per machine; evaluated only after the last epoch. With
    ``parameter_servers``: ``training.sync: ps`` with that many ``ps:J`` roles (and
    ``training.staleness``)."""
    data = _job_data(dataset, machines, parts_dir, epochs, batch_size)
    if parameter_servers:
        data["spec"]["training"]["sync"] = "ps"
        data["spec"]["runtime"]["parameterServers"] = parameter_servers
        if staleness:
            data["spec"]["training"]["staleness"] = staleness
    return data


def _job_data(
    dataset: Path, machines: list[str], parts_dir: Path, epochs: int, batch_size: int
) -> dict[str, Any]:
    return {
        "apiVersion": "graphrun.io/v1alpha1", "kind": "GraphJob",
        "metadata": {"name": "placement"},
        "spec": {
            "graph": {"dataset": str(dataset.resolve())},
            "partition": {"parts": len(machines), "output": str(parts_dir)},
            "runtime": {"machines": len(machines), "machineNames": machines, "hosts": "netns"},
            "training": {"task": "node-classification", "epochs": epochs, "batchSize": batch_size,
                         "fanouts": [25, 10], "hidden": 128, "lr": 0.003, "dropout": 0.5,
                         "evaluation": "sampled", "evalEvery": 10_000, "evalSubset": 100},
        },
    }  # fmt: skip


def run_job(
    data: dict[str, Any], workdir: Path, name: str, cluster_file: Path
) -> tuple[Measured, dict[RoleName, float], Path]:
    """Run the job of ``data`` as ``name``, profiled (``run-<name>/profile/``); its
    measured epochs, its roles' peak memory (MiB) and its run directory. Raises JobFailed
    (naming the role) when it fails."""
    import yaml

    from graphrun.bench.train import run_sampled
    from graphrun.local.runner import RunOptions
    from graphrun.placement.profile import read_metrics

    path = workdir / f"job-{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    run_dir = workdir / f"run-{name}"
    shutil.rmtree(run_dir, ignore_errors=True)
    opts = RunOptions(
        run_dir=run_dir, hosts="netns", cluster=cluster_file,
        profile_dir=run_dir / "profile",
    )  # fmt: skip
    _, rss = run_sampled(path, opts, workdir / f"job-{name}.log")
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [float(r["epoch_s"]) for r in recs]
    steps = int(recs[-1]["steps"])
    batches = read_metrics(sorted((run_dir / "profile").glob("trainer-*.jsonl")))[0]
    cpu = [
        (b.sample_cpu_s or 0.0) + (b.compute_cpu_s or 0.0) for b in batches if b.iteration > steps
    ]
    measured = Measured(statistics.median(times[1:]), times, steps, statistics.fmean(cpu or [0.0]))
    return measured, rss.role_peak, run_dir


def probe_cluster(cluster_file: Path, out: Path) -> dict[str, Any]:
    """Probe the hosts ``cluster_file`` describes; writes the probed cluster to ``out``
    and returns, per machine, the link rate set and the rate probed."""
    import yaml

    from graphrun.files import write_atomic
    from graphrun.local.netns import NetnsNetwork, shapes_from_cluster
    from graphrun.measure.probe import GBIT, ProbeHost, probe
    from graphrun.placement.cluster import load_cluster

    cluster = load_cluster(cluster_file)
    names = list(cluster.names)
    with NetnsNetwork(names, shapes=shapes_from_cluster(cluster_file, names)) as net:
        hosts = [ProbeHost(m, net.address(m), net.prefix(m), net.cgroup_prefix(m)) for m in names]
        result = probe(hosts, seconds=PROBE_SECONDS)
    write_atomic(out, yaml.safe_dump(result["cluster"], sort_keys=False))
    probed = {m["name"]: m for m in result["cluster"]["machines"]}
    report = {}
    for i, m in enumerate(names):
        set_gbps = cluster.egress[i] / GBIT
        got = float(probed[m]["egress_gbps"])
        report[m] = {
            "set_gbps": round(set_gbps, 4), "probed_gbps": round(got, 4),
            "error": round(got / set_gbps - 1, 4),
            "set_cpu": cluster.cpu[i], "probed_cpu": probed[m]["cpu"],
        }  # fmt: skip
    return report


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import yaml

    from graphrun.job.planning import graphjob_to_placement
    from graphrun.job.spec import parse_job
    from graphrun.placement.baselines import colocation, random_feasible
    from graphrun.placement.cluster import load_cluster
    from graphrun.placement.cost import Evaluator
    from graphrun.placement.job import Demand
    from graphrun.placement.planner import PlanOptions, optimize
    from graphrun.placement.profile import profile_from_records, read_metrics, save_profile
    from graphrun.placement.workload import make_scenario

    check_args(args)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="graphrun-placement-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cluster_file = args.cluster
    if cluster_file is None:
        cluster_file = workdir / "cluster.yaml"
        cluster_file.write_text(yaml.safe_dump(DEFAULT_CLUSTER, sort_keys=False))
    written = load_cluster(cluster_file)
    machines = list(written.names)
    servers = args.parameter_servers if args.sync == "ps" else 0
    data = job_data(
        args.dataset, machines, workdir / "parts", args.epochs, args.batch_size, servers,
        args.staleness if servers else 0,
    )  # fmt: skip

    probe_report: dict[str, Any] | None = None
    planned_on = cluster_file
    if not args.no_probe:
        planned_on = workdir / "probed.yaml"
        probe_report = probe_cluster(cluster_file, planned_on)
    cluster = load_cluster(planned_on)

    # 1. co-located, profiled: the profile and the roles' memory
    co_run, peaks, co_dir = run_job(data, workdir, "co-location", cluster_file)
    records, serves = read_metrics(sorted((co_dir / "profile").glob("*.jsonl")))
    # the first epoch warms up (its steps cost ~45% more CPU): measured epochs leave it
    # out, and so does the profile
    records = [r for r in records if r.iteration > co_run.steps]
    profile_file = workdir / "profile.json"
    save_profile(profile_from_records(records, "placement-real", serves), profile_file)
    job_file = workdir / "job-co-location.yaml"
    gp = graphjob_to_placement(parse_job(data, str(job_file)), job_file, str(profile_file), 8)

    def peak_gb(kind: str) -> float:
        values = [v for role, v in peaks.items() if role.kind == kind]
        return MEMORY_MARGIN * max(values, default=0.0) * 2**20 / 1e9

    # the CPU model shares each host's cores among its roles: no CPU reservation
    job = gp.job.with_demands({
        "store": Demand(cpu=0, memory_gb=peak_gb("store")),
        "trainer": Demand(cpu=0, memory_gb=peak_gb("trainer")),
        "ps": Demand(cpu=0, memory_gb=peak_gb("ps")),
    })  # fmt: skip
    ev = Evaluator(cluster, make_scenario(job, 0, args.iterations))

    def predicted(x: tuple[int, ...]) -> float:
        return ev.makespan(x) / args.iterations * co_run.steps

    # 2. the plan and random placements, predicted then run
    out = optimize(cluster, job, PlanOptions(seed=0, max_seconds=args.seconds))
    rng = np.random.default_rng(0)
    co = colocation(cluster, job)
    placements: list[tuple[str, tuple[int, ...]]] = [("co-location", co), ("plan", out.placement)]
    seen = {co, out.placement}
    for i in range(args.random):
        for _ in range(50):
            x = random_feasible(cluster, job, rng)
            if x not in seen:
                break
        seen.add(x)
        placements.append((f"random-{i}", x))
    runs: list[dict[str, Any]] = []
    by: dict[str, float] = {}  # measured epoch per placement
    errors = []
    for name, x in placements:
        assignments = {str(role): machines[m] for role, m in zip(job.roles, x, strict=True)}
        if name == "co-location":
            measured = co_run
        else:
            placed = json.loads(json.dumps(data))
            placed["spec"]["placement"] = {"assignments": assignments}
            measured = run_job(placed, workdir, name, cluster_file)[0]
        pred = predicted(x)
        by[name] = measured.epoch_s
        errors.append(pred / measured.epoch_s - 1)
        runs.append({
            "placement": name, "assignments": assignments,
            "predicted_epoch_s": round(pred, 3), "measured_epoch_s": round(measured.epoch_s, 3),
            "epoch_s_all": measured.epoch_s_all, "error": round(pred / measured.epoch_s - 1, 4),
            "trainer_cpu_s_per_step": round(measured.trainer_cpu_s, 4),
        })  # fmt: skip
    randoms = [v for k, v in by.items() if k.startswith("random-")]
    report = {
        "bench": "placement-real",
        "dataset": str(args.dataset),
        "sync": args.sync,
        "parameter_servers": servers,
        "staleness": args.staleness if servers else 0,
        "cluster": {
            m: {"cpu": written.cpu[i], "memory_gb": written.memory_gb[i],
                "gbps": round(written.egress[i] * 8 / 1e9, 4)}
            for i, m in enumerate(machines)
        },
        "probe": probe_report,
        "steps_per_epoch": co_run.steps,
        "runs": runs,
        "speedup_vs_colocation": round(by["co-location"] / by["plan"], 3),
        "speedup_vs_best_random": round(min(randoms) / by["plan"], 3) if randoms else None,
        "max_abs_error": round(max(abs(e) for e in errors), 4),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "workdir": str(workdir),
    }  # fmt: skip
    print(json.dumps(report), flush=True)
    return 0
