"""``graphrun bench placement``: ETP against co-location, random, IFS, FFD and annealing.

With ``--real``, the closed loop instead: probe, profile, plan, run and compare predicted
with measured epochs on emulated heterogeneous hosts (:mod:`graphrun.bench.placement_real`).

Otherwise all times are *simulated* training times (OES, priority scheduling) of the job's
``iterations`` on synthetic profiles, not measurements. One JSON object per setting:
means, standard deviations and extremes over seeds (each seed redraws the profile
samples and reseeds the searches), ETP's ratio to the lower bound of its own
placement, its wall time, the anytime curve of the first seed, and the largest
relative makespan difference between OES fair sharing and SimGrid on random flow
sets over the setting's machines (null when SimGrid is not installed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

from graphrun.bench import placement_real

SETTINGS = (
    "hetero-products",
    "hetero-papers100m",
    "hetero8-products",
    "scale16-products",
    "tiny3-products",
    "hetero1gpu-products",
)


@dataclass(frozen=True)
class Setting:
    name: str
    bandwidth_gbps: tuple[float, ...]
    partitions: int
    profile: str
    samplers_per_trainer: int
    parameter_servers: int
    iterations: int
    gpus: int = 2  # per machine


def _setting(name: str) -> Setting:
    profile = name.split("-", 1)[1]
    if name.startswith("hetero-"):
        # the paper's setting: 4 machines at 50 Gbit/s, two of them limited to 10 Gbit/s
        return Setting(name, (50, 50, 10, 10), 4, profile, 2, 2, 8)
    if name.startswith("hetero1gpu-"):  # one GPU per machine: every machine trains
        return Setting(name, (50, 50, 10, 10), 4, profile, 2, 2, 8, gpus=1)
    if name.startswith("hetero8-"):
        return Setting(name, (50,) * 4 + (10,) * 4, 8, profile, 2, 2, 6)
    if name.startswith("tiny3-"):  # small enough for the exhaustive optimum (3**7 placements)
        return Setting(name, (50, 25, 10), 2, profile, 1, 1, 4)
    return Setting(name, (50,) * 8 + (10,) * 8, 16, profile, 4, 4, 8)  # 100 tasks


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "placement",
        help="task placement: ETP vs baselines (simulated)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS[:2]))
    p.add_argument("--seeds", type=int, default=10, help="seeds per setting (default 10)")
    p.add_argument("--seconds", type=float, default=10.0, help="ETP/SA budget per seed")
    p.add_argument("--random-samples", type=int, default=10, help="random placements per seed")
    placement_real.add_arguments(p)
    p.set_defaults(func=run)


def _stats(prefix: str, xs: list[float]) -> dict[str, float]:
    return {
        prefix: statistics.fmean(xs),
        f"{prefix}_std": statistics.pstdev(xs),
        f"{prefix}_min": min(xs),
        f"{prefix}_max": max(xs),
    }


def run_setting(s: Setting, seeds: int, seconds: float, random_samples: int) -> dict[str, Any]:
    import numpy as np

    from graphrun.placement.baselines import (
        MAX_EXHAUSTIVE,
        colocation,
        exhaustive,
        first_fit_decreasing,
        random_feasible,
    )
    from graphrun.placement.bounds import lower_bounds
    from graphrun.placement.cluster import make_cluster
    from graphrun.placement.cost import Evaluator
    from graphrun.placement.job import Demand, Demands, JobSpec, job_from_spec
    from graphrun.placement.profile import builtin_profile
    from graphrun.placement.search import TEMPERING, anneal, etp, ifs
    from graphrun.placement.simgrid_check import crosscheck, random_flowsets, simgrid_available
    from graphrun.placement.workload import build_workload, make_scenario

    m = len(s.bandwidth_gbps)
    cluster = make_cluster(list(s.bandwidth_gbps), cpu=32, memory_gb=256, gpus=s.gpus)
    spec = JobSpec(
        name=s.name,
        partitions=s.partitions,
        trainers=s.partitions,
        samplers_per_trainer=s.samplers_per_trainer,
        parameter_servers=s.parameter_servers,
        prefetch=2,
        iterations=s.iterations,
        profile=s.profile,
        demands=Demands(
            store=Demand(cpu=2, memory_gb=100),
            trainer=Demand(cpu=8, memory_gb=16, gpus=1),
            sampler=Demand(cpu=4, memory_gb=4),
            ps=Demand(cpu=1, memory_gb=4),
        ),
    )
    job = job_from_spec(spec, builtin_profile(s.profile))
    rows: dict[str, list[float]] = {}
    curve: list[list[float]] = []
    for seed in range(seeds):
        ev = Evaluator(cluster, make_scenario(job, seed))
        rng = np.random.default_rng(seed)
        start = ifs(ev)
        res = etp(ev, start, seed=seed, max_seconds=seconds, tempering=TEMPERING)
        sa = anneal(ev, start, seed=seed, max_seconds=seconds)
        rand = [ev.makespan(random_feasible(cluster, job, rng)) for _ in range(random_samples)]
        bound = lower_bounds(build_workload(cluster, ev.scenario, res.placement)).value
        for key, value in {
            "speedup_vs_colocation": ev.makespan(colocation(cluster, job)) / res.makespan,
            "speedup_vs_random": float(np.median(rand)) / res.makespan,
            "speedup_vs_ifs": ev.makespan(start) / res.makespan,
            "speedup_vs_ffd": ev.makespan(first_fit_decreasing(cluster, job)) / res.makespan,
            "speedup_vs_annealing": sa.makespan / res.makespan,
            "etp_to_lower_bound": res.makespan / bound,
            "etp_seconds": res.seconds,
            "etp_seconds_to_best": res.curve[-1].seconds if res.curve else 0.0,
            "etp_steps": float(res.steps),
            "etp_simulations": float(res.simulations),
            "etp_makespan_s": res.makespan,
        }.items():
            rows.setdefault(key, []).append(value)
        if m ** len(job.tasks) <= MAX_EXHAUSTIVE:
            rows.setdefault("etp_to_optimum", []).append(res.makespan / exhaustive(ev)[1])
        if seed == 0:
            curve = [[round(p.seconds, 3), round(p.makespan, 6)] for p in res.curve]
    out: dict[str, Any] = {
        "setting": s.name,
        "simulated": True,
        "machines": m,
        "bandwidth_gbps": list(s.bandwidth_gbps),
        "gpus_per_machine": s.gpus,
        "tasks": len(job.tasks),
        "iterations": s.iterations,
        "seeds": seeds,
        "budget_seconds": seconds,
    }
    for key, xs in rows.items():
        out.update(_stats(key, xs))
    out["etp_to_lower_bound_per_seed"] = [round(x, 4) for x in rows["etp_to_lower_bound"]]
    out["anytime_curve_seed0"] = curve
    out["simgrid_max_rel_error"] = None
    if simgrid_available():
        sets = random_flowsets(seed=0, count=20, machines=m, flows=3 * m)
        bw = tuple(b * 1e9 / 8 for b in s.bandwidth_gbps)
        sets = [type(fs)(bw, bw, fs.flows) for fs in sets]
        out["simgrid_max_rel_error"] = crosscheck(sets).max_rel_error
    return out


def run(args: argparse.Namespace) -> int:
    from graphrun.errors import ArgumentError

    if args.real:
        return placement_real.run(args)
    if args.seeds < 1 or args.seconds <= 0:
        raise ArgumentError("--seeds and --seconds must be positive")
    for name in args.settings:
        t0 = time.perf_counter()
        row = run_setting(_setting(name), args.seeds, args.seconds, args.random_samples)
        row["wall_seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(row), flush=True)
    return 0
