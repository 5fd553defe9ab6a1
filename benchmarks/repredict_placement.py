"""Re-predict a `graphrun bench placement --real` run's placements from its own records,
with and without the store servers' serving steps (benchmarks/README.md, pr5), with
the feature flows charged although the trainers' caches hold every row (the model before
``features_cached``; pr6), and on the hosts' CPU quotas as written in the run's
``cluster.yaml`` instead of the probed shares (what the probe measures since pr8: it
read 5-15% low before), and without the parameter servers' CPU (their records, ``ps-J.jsonl``,
left out: ``ps_update_s`` 0, the model before issue 32's fix), and an asynchronous PS
(``training.staleness``) simulated as a synchronous one (the model before too). The last
line predicts every placement from *its own* run's records (its trainers', stores' and
parameter servers'), not the co-located run's: what is left then is the model's error,
not the machine's drift between runs (the trainers' CPU seconds a step moved by up to
25% between the runs of one command on the loaded box, issue 32).

    python benchmarks/repredict_placement.py WORKDIR RESULT.json

WORKDIR is the run's ``--workdir``, RESULT.json the JSON line it printed. The model is
the benchmark's (``graphrun.bench.placement_real``): the co-located run's batch records
without the warm-up epoch, 16 simulated iterations scaled to the epoch's steps.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

from graphrun.job.planning import graphjob_to_placement
from graphrun.job.spec import parse_job
from graphrun.placement.cluster import Cluster, load_cluster
from graphrun.placement.cost import Evaluator
from graphrun.placement.job import Demand
from graphrun.placement.profile import (
    PSRecord,
    profile_from_records,
    read_metrics,
    save_profile,
)
from graphrun.placement.workload import make_scenario

ITERATIONS = 16


def main(workdir: Path, result: dict) -> None:
    probed = load_cluster(workdir / "probed.yaml")
    quotas = replace(probed, cpu=load_cluster(workdir / "cluster.yaml").cpu)
    machines = list(probed.names)
    steps = result["steps_per_epoch"]
    profiled = workdir / "run-co-location" / "profile"
    records, serves = read_metrics(sorted(profiled.glob("*.jsonl")))
    records = [r for r in records if r.iteration > steps]
    job_file = workdir / "job-co-location.yaml"
    data = yaml.safe_load(job_file.read_text())
    tiny = Demand(cpu=0, memory_gb=0.1)  # memory does not change a makespan
    no_ps = [r for r in serves if not isinstance(r, PSRecord)]
    variants = (
        ("with serving steps", serves, {}, probed),
        ("without serving steps", [], {}, probed),
        ("features charged", serves, {"features_cached": False}, probed),
        ("with serving steps, CPU quotas", serves, {}, quotas),
        ("without the PS's CPU", no_ps, {}, probed),
        ("an asynchronous PS planned as synchronous", serves, {"staleness": 0}, probed),
    )

    def evaluator(recs: list, served: list, update: dict, cluster: Cluster) -> Evaluator:
        with tempfile.TemporaryDirectory() as tmp:
            profile_file = Path(tmp) / "profile.json"
            save_profile(profile_from_records(recs, "repredict", served), profile_file)
            spec = parse_job(data, str(job_file))
            gp = graphjob_to_placement(spec, job_file, str(profile_file), 8)
        job = gp.job.with_demands({"store": tiny, "trainer": tiny})
        if update:
            job = replace(job, spec=job.spec.model_copy(update=update))
        return Evaluator(cluster, make_scenario(job, 0, ITERATIONS))

    def cell(ev: Evaluator, run: dict) -> str:
        x = tuple(machines.index(run["assignments"][str(role)]) for role in ev.job.roles)
        predicted = ev.makespan(x) / ITERATIONS * steps
        measured = run["measured_epoch_s"]
        return (
            f"{run['placement']} {predicted:.2f}/{measured:.2f} ({predicted / measured - 1:+.0%})"
        )

    for label, served, update, cluster in variants:
        ev = evaluator(records, served, update, cluster)
        spec = ev.job.spec
        label += f" (features_cached: {spec.features_cached}, staleness {spec.staleness})"
        print(f"{label}: " + "; ".join(cell(ev, run) for run in result["runs"]))
    cells = []
    for run in result["runs"]:
        own = workdir / f"run-{run['placement']}" / "profile"
        recs, served = read_metrics(sorted(own.glob("*.jsonl")))
        cells.append(cell(evaluator([r for r in recs if r.iteration > steps], served, {}, probed),
                          run))  # fmt: skip
    print("each placement from its own run's records: " + "; ".join(cells))


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()))
