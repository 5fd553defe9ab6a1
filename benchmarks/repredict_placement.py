"""Re-predict a `graphrun bench placement --real` run's placements from its own records,
with and without the store servers' serving steps (benchmarks/README.md, pr5).

    python benchmarks/repredict_placement.py WORKDIR RESULT.json
"""

import json
import sys
from pathlib import Path

import yaml

from graphrun.job.planning import graphjob_to_placement
from graphrun.job.spec import parse_job
from graphrun.placement.cluster import load_cluster
from graphrun.placement.cost import Evaluator
from graphrun.placement.job import Demand
from graphrun.placement.profile import profile_from_records, read_metrics, save_profile
from graphrun.placement.workload import make_scenario

w = Path(sys.argv[1])
it = 16
res = json.load(open(sys.argv[2]))
cluster = load_cluster(w / "probed.yaml")
machines = list(cluster.names)
records, serves = read_metrics(sorted((w / "run-co-location" / "profile").glob("*.jsonl")))
steps = res["steps_per_epoch"]
records = [r for r in records if r.iteration > steps]
for label, sv in [("as run", serves), ("no serve cpu", [])]:
    pf = Path(f"/tmp/prof-{label.replace(' ', '_')}.json")
    save_profile(profile_from_records(records, "x", sv), pf)
    job_file = w / "job-co-location.yaml"
    data = yaml.safe_load(open(job_file))
    gp = graphjob_to_placement(parse_job(data, str(job_file)), job_file, str(pf), 8)
    job = gp.job.with_demands(
        {"store": Demand(cpu=0, memory_gb=0.1), "trainer": Demand(cpu=0, memory_gb=0.1)}
    )
    ev = Evaluator(cluster, make_scenario(job, 0, it))
    out = []
    for r in res["runs"]:
        x = tuple(machines.index(r["assignments"][role]) for role in job.roles)
        p = ev.makespan(x) / it * steps
        out.append(
            f"{r['placement']} {p:.2f}/{r['measured_epoch_s']:.2f} ({p / r['measured_epoch_s'] - 1:+.0%})"
        )
    print(label, "; ".join(out))
