"""``graphrun plan CLUSTER JOB -o PLAN``: place a job's tasks on a cluster's machines."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphrun.arguments import output_file

if TYPE_CHECKING:
    from graphrun.job.planning import GraphJobPlacement
    from graphrun.placement.job import Job

DESCRIPTION = """\
Place the graph stores, samplers, trainers and parameter servers of a job on the
machines of a cluster: an initial feasible placement (IFS), then a Markov-chain
exploration (ETP) scored by simulating training with online flow scheduling (OES).
Writes a PlacementPlan (role -> machine) that a GraphJob can reference.

CLUSTER is a Cluster YAML (see graphrun.placement.cluster). JOB is a PlacementJob YAML
(see graphrun.placement.job) or a GraphJob spec (graphrun.job.spec). A GraphJob becomes
one store task per partition (memory: the partition's bytes on disk when the partition
directory exists, else estimated from spec.graph, plus 1 GB), its trainers (no GPU)
and samplerWorkersPerTrainer samplers each, synchronised by allreduce and scored with
--profile. Its cluster needs exactly spec.runtime.machines machines; the plan (store
backups on their main server's machine) can then be the job's placement.planFile.
The Kubernetes operator cannot read plan files: --inline JOB_OUT also writes the
GraphJob with the plan inline (spec.placement.plan; name the cluster's machines after
the nodes, or label the nodes and set spec.placement.nodeLabel).
Times printed are simulated, not measured. While it searches, where it stands (best
makespan so far, time left) goes to stderr every few seconds. Demands that fit on no
machine are refused up front, naming the --demand that would lower them.
"""


MAX_STEPS = 100_000_000  # ETP steps (--steps)
MAX_SECONDS = 86_400.0  # ETP time budget (--seconds)
MAX_REPLICAS = 16  # --tempering betas: one chain (and its simulator state) each


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan",
        help="place a job's tasks on machines (writes a PlacementPlan)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("cluster", type=Path, help="cluster YAML: machines, capacities, bandwidths")
    p.add_argument("job", type=Path, help="job YAML (kind: PlacementJob or GraphJob)")
    p.add_argument("-o", "--output", type=output_file, required=True, help="plan YAML to write")
    p.add_argument(
        "--inline",
        type=output_file,
        metavar="JOB_OUT",
        help="GraphJob only: also write the job with the plan inline in spec.placement.plan "
        "(what the Kubernetes operator takes); relative paths in it are kept as written",
    )
    p.add_argument(
        "--timeline",
        type=output_file,
        metavar="PNG",
        help="also draw the simulated schedule of the plan and of co-location (tasks per "
        "machine, flows per link) to this PNG file",
    )
    p.add_argument("--seconds", type=float, default=30.0, help="ETP time budget (default 30)")
    p.add_argument("--steps", type=int, default=None, help="ETP step budget (reproducible)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--beta", type=float, default=200.0, help="ETP inverse temperature")
    p.add_argument(
        "--tempering",
        type=float,
        nargs="*",
        default=None,
        metavar="BETA",
        help="betas of the extra ETP replicas exchanging states with the --beta chain "
        "(default 100 400; give none for a single chain)",
    )
    p.add_argument(
        "--profile",
        default="products",
        help="GraphJob only: a built-in profile (products, papers100m) or a profile JSON "
        "written by `graphrun profile` (default products)",
    )
    p.add_argument(
        "--iterations", type=int, default=8, help="GraphJob only: iterations simulated (default 8)"
    )
    p.add_argument(
        "--demand",
        action="append",
        default=[],
        metavar="KIND=CPU,MEMORY_GB[,GPUS]",
        help="what every task of KIND (store, trainer, sampler, ps) demands, over the job's "
        "own (e.g. trainer=0,1.5: with a profile of CPU seconds the simulator shares each "
        "machine's cores, so no cores need reserving); repeatable",
    )
    p.set_defaults(func=run)


def parse_demand(text: str) -> tuple[str, Any]:
    """``KIND=CPU,MEMORY_GB[,GPUS]`` as (kind, Demand); ArgumentError naming it otherwise."""
    from graphrun.errors import ArgumentError
    from graphrun.placement.job import KINDS, Demand

    kind, _, values = text.partition("=")
    if kind not in KINDS:
        raise ArgumentError(f"--demand {text}: the kind must be one of {', '.join(KINDS)}")
    try:
        nums = [float(v) for v in values.split(",")]
    except ValueError:
        nums = []
    if len(nums) not in (2, 3) or not all(0 <= v < math.inf for v in nums):
        raise ArgumentError(f"--demand {text}: give KIND=CPU,MEMORY_GB[,GPUS] with numbers >= 0")
    return kind, Demand(cpu=nums[0], memory_gb=nums[1], gpus=nums[2] if len(nums) > 2 else 0)


def load_job_for_plan(
    path: Path, profile: str = "products", iterations: int = 8
) -> Job | GraphJobPlacement:
    """The conversion point from job files to the placement model: a native ``kind:
    PlacementJob`` file gives a placement ``Job``; a ``kind: GraphJob`` spec gives a
    ``GraphJobPlacement`` (see ``graphrun.job.planning``)."""
    from graphrun.placement._io import read_yaml
    from graphrun.placement.job import job_from_dict

    data = read_yaml(path)
    if isinstance(data, dict) and data.get("kind") == "GraphJob":
        from graphrun.job.planning import graphjob_to_placement
        from graphrun.job.spec import parse_job

        return graphjob_to_placement(parse_job(data, str(path)), path, profile, iterations)
    return job_from_dict(data, str(path), base=path.parent)


def run(args: argparse.Namespace) -> int:
    from graphrun.errors import ArgumentError
    from graphrun.placement.cluster import load_cluster
    from graphrun.placement.job import MAX_ITERATIONS, Job
    from graphrun.placement.plan import write_plan
    from graphrun.placement.planner import PlanOptions, optimize
    from graphrun.placement.schedule import schedule_file, write_schedules

    if not 0 < args.seconds < math.inf:
        raise ArgumentError(f"--seconds: must be > 0 and finite, got {args.seconds}")
    if args.steps is not None and args.steps < 1:
        raise ArgumentError(f"--steps: must be >= 1, got {args.steps}")
    if not 0 < args.beta < math.inf:
        raise ArgumentError(f"--beta: must be > 0 and finite, got {args.beta}")
    for beta in args.tempering or []:
        if not 0 < beta < math.inf:
            raise ArgumentError(f"--tempering: betas must be > 0 and finite, got {beta}")
    if args.seed < 0:
        raise ArgumentError(f"--seed: must be >= 0, got {args.seed}")
    if not 1 <= args.iterations <= MAX_ITERATIONS:
        raise ArgumentError(
            f"--iterations: must be in [1, {MAX_ITERATIONS}], got {args.iterations}"
        )
    if args.steps is not None and args.steps > MAX_STEPS:
        raise ArgumentError(f"--steps: at most {MAX_STEPS}, got {args.steps}")
    if args.seconds > MAX_SECONDS:
        raise ArgumentError(f"--seconds: at most {MAX_SECONDS} (a day), got {args.seconds:g}")
    if len(args.tempering or []) > MAX_REPLICAS:
        raise ArgumentError(f"--tempering: at most {MAX_REPLICAS} betas, got {len(args.tempering)}")
    _check_outputs(args)
    demands = dict(parse_demand(d) for d in args.demand)
    cluster = load_cluster(args.cluster)
    job = load_job_for_plan(args.job, args.profile, args.iterations)
    graphjob = None
    if not isinstance(job, Job):  # a GraphJob
        graphjob = replace(job, job=job.job.with_demands(demands))
        job = graphjob.job
        graphjob.check_cluster(cluster, str(args.cluster))
    elif args.inline is not None:
        raise ArgumentError(f"--inline: {args.job} is not a GraphJob (kind: PlacementJob)")
    else:
        job = job.with_demands(demands)
    check_demands(cluster, job)
    options = PlanOptions(
        seed=args.seed,
        max_seconds=None if args.steps is not None else args.seconds,
        max_steps=args.steps,
        beta=args.beta,
        tempering=PlanOptions.tempering if args.tempering is None else tuple(args.tempering),
        progress=_say_progress(args.steps),
    )
    budget = f"{args.steps} steps" if args.steps is not None else f"{args.seconds:g} s"
    _say(f"simulating the first placements, then searching for {budget}")
    out = optimize(cluster, job, options)
    co = out.colocation_makespan
    lines = [
        f"graphrun plan {args.cluster} {args.job} (seed {args.seed})",
        f"simulated time for {job.spec.iterations} iterations: {out.makespan:.4f} s "
        f"(IFS {out.ifs_makespan:.4f} s, co-location "
        f"{'does not fit' if co is None else f'{co:.4f} s'}, "
        f"lower bound {out.bounds.value:.4f} s)",
        f"ETP: {out.search.steps} steps, {out.search.simulations} simulations, "
        f"{out.search.seconds:.1f} s",
    ]
    plan = out.plan
    if graphjob is not None:
        lines.append(f"store memory: {graphjob.store_memory_from}")
        plan = graphjob.complete(plan)
    schedules = plan_schedules(cluster, job, out, options.seed)
    png = None
    if args.timeline is not None:  # drawn before any file is written
        from graphrun.report.plots import timeline

        png = timeline(schedules)
    write_plan(plan, args.output, comments=lines)
    print(f"{args.output}: " + "; ".join(lines[1:]))
    sched = write_schedules(schedule_file(args.output), schedules)
    print(f"{sched}: the simulated schedules ({', '.join(s.label for s in schedules)})")
    if png is not None:
        from graphrun.files import write_atomic

        write_atomic(args.timeline, png)
        print(f"{args.timeline}: the simulated schedules drawn")
    if args.inline is not None:
        write_inline(args.job, plan, args.inline)
        print(f"{args.inline}: {args.job} with the plan in spec.placement.plan")
    return 0


def plan_schedules(cluster: Any, job: Any, out: Any, seed: int) -> list[Any]:
    """The simulated schedules of the plan and, when it fits, of co-location (on the
    draws the plan was scored on)."""
    from graphrun.placement.baselines import colocation
    from graphrun.placement.schedule import schedule
    from graphrun.placement.workload import make_scenario, make_template

    sc = make_scenario(job, seed)
    tpl = make_template(sc)
    out_s = [schedule(cluster, sc, out.placement, "plan", template=tpl)]
    if out.colocation_makespan is not None:
        out_s.append(schedule(cluster, sc, colocation(cluster, job), "co-location", template=tpl))
    return out_s


def _check_outputs(args: argparse.Namespace) -> None:
    """The files written (each checked writable by :func:`output_file` as it was
    parsed) are distinct, and none is an input: one would overwrite another."""
    from graphrun.errors import ArgumentError
    from graphrun.placement.schedule import schedule_file

    seen = {args.cluster.resolve(): "CLUSTER", args.job.resolve(): "JOB"}
    outs = [("-o", args.output), ("-o (its schedules)", schedule_file(args.output))]
    outs += [("--inline", args.inline), ("--timeline", args.timeline)]
    for flag, path in outs:
        if path is None:
            continue
        if path.resolve() in seen:
            raise ArgumentError(f"{flag}: {path} is also {seen[path.resolve()]}")
        seen[path.resolve()] = flag


def _say(text: str) -> None:
    print(f"graphrun plan: {text}", file=sys.stderr, flush=True)


def _say_progress(max_steps: int | None) -> Callable[[int, float, float | None, float], None]:
    """Where the search stands, on stderr every few seconds (it runs for --seconds)."""

    def progress(steps: int, elapsed: float, left: float | None, best: float) -> None:
        where = f"{left:.0f} s left" if left is not None else f"step {steps} of {max_steps}"
        found = f"best makespan so far {best:.4f} s" if best < math.inf else "none feasible yet"
        _say(f"{where}: {found} ({steps} steps in {elapsed:.0f} s)")

    return progress


def check_demands(cluster: Any, job: Any) -> None:
    """The job's demands fit the cluster; if not, one line naming the demand and the
    ``--demand`` that lowers it (a GraphJob's demands are graphrun's estimates, which a
    small machine may not have: the message did not say they can be changed)."""
    from graphrun.errors import SpecError
    from graphrun.placement.cost import check_feasible
    from graphrun.placement.job import RESOURCES

    try:
        check_feasible(cluster, job)
    except SpecError as exc:
        largest = [max(cluster.capacity(r)) for r in RESOURCES]
        fixes = []
        for kind in dict.fromkeys(t.kind for t in job.tasks):
            demand = next(t.demand for t in job.tasks if t.kind == kind)
            if any(d > cap for d, cap in zip(demand, largest, strict=True)):
                fit = [min(d, cap) for d, cap in zip(demand, largest, strict=True)]
                fixes.append(f"--demand {kind}={','.join(f'{v:g}' for v in fit)}")
        now = ", ".join(
            f"{k}={','.join(f'{v:g}' for v in next(t.demand for t in job.tasks if t.kind == k))}"
            for k in dict.fromkeys(t.kind for t in job.tasks)
        )
        hint = " or ".join(fixes) if fixes else "--demand KIND=CPU,MEMORY_GB[,GPUS] (lower)"
        raise SpecError(
            f"{exc}; lower it with {hint} (the demands now, CPU,MEMORY_GB,GPUS: {now})"
        ) from None


def write_inline(job_file: Path, plan: Any, out: Path) -> Path:
    """The GraphJob of ``job_file`` with ``plan`` inline (``spec.placement.plan``),
    written atomically to ``out`` and checked to load and resolve."""
    import yaml

    from graphrun.errors import SpecError
    from graphrun.job.spec import parse_job, resolve_placement
    from graphrun.placement._io import read_yaml, write_file
    from graphrun.placement.plan import plan_data

    data = read_yaml(job_file, "job spec")
    if not isinstance(data, dict):
        raise SpecError(f"{job_file}: expected a mapping with apiVersion, kind, metadata, spec")
    placement = dict(data["spec"].get("placement") or {})
    for key in ("assignments", "planFile", "plan"):
        placement.pop(key, None)
    data["spec"]["placement"] = {**placement, "plan": plan_data(plan)}
    resolve_placement(parse_job(data, str(out)))
    head = f"# {job_file} placed by `graphrun plan`\n"
    return write_file(out, head + yaml.safe_dump(data, sort_keys=False))
