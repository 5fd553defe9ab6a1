"""The rows `graphrun bench cost` fits, from one graph's measurements (issue 44, item 4).

    python benchmarks/cost_rows.py DATASET GEN_TIME PAR PAR_TIME DIST DIST_TIME RUN \
        [TRAINER_PRIVATE_MB] >> rows.jsonl
    python benchmarks/cost_rows.py --unchunked DATASET PAR PAR_TIME >> rows.jsonl

DATASET is the chunked dataset (its ``chunks.json`` gives the nodes, edges and feature
width), GEN_TIME the ``/usr/bin/time -v`` output of its ``graphrun generate``, PAR and
DIST the JSON that ``graphrun partition --json`` printed in ``--mode parallel`` and
``--mode distributed`` (PAR_TIME, DIST_TIME their ``/usr/bin/time -v`` output), RUN the
run directory of a ``graphrun run`` of one epoch on the parallel mode's partitions,
TRAINER_PRIVATE_MB the largest trainer's peak private memory (RSS less shared pages,
sampled with psutil while it ran): a job whose machines share one box maps every
machine's store into every trainer, so a trainer's RSS counts the other host's graph.
Prints one row per stage (benchmarks/README.md, "Cost as the graph grows"):

- ``generate``: the command's peak RSS and CPU seconds (user + system);
- ``partition-parallel``: its phases' largest peak, CPU seconds of the command;
- ``partition-distributed``: the largest rank's peak, CPU seconds of the launcher and
  all its ranks, ``hosts`` the ranks;
- ``serve``: the largest store server's peak RSS (``VmHWM``, from the workers' status
  files), the store servers' CPU seconds, ``hosts`` the machines;
- ``train-epoch``: the trainers' CPU seconds in the epoch (``metrics.jsonl``), wall
  ``epoch_s``;
- ``evaluate``: the trainers' CPU seconds outside the epoch (start-up and evaluation),
  wall ``eval_s``;

both with TRAINER_PRIVATE_MB as ``peak_mb`` (without it: the largest trainer's peak RSS,
at the epoch's end and over the whole run). With ``--unchunked``: one
``partition-parallel-unchunked`` row, ``--mode parallel`` on the same graph written
unchunked (``graphrun generate`` without ``--chunks``), which reads its input mapped.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def timed(path: Path) -> dict[str, float]:
    """CPU seconds, peak RSS (MiB) and wall seconds from ``/usr/bin/time -v``."""
    text = path.read_text()

    def field(name: str) -> str:
        found = re.search(rf"{re.escape(name)}: (\S+)", text)
        if found is None:
            sys.exit(f"{path}: no '{name}' line (not /usr/bin/time -v output?)")
        return found.group(1)

    wall = 0.0
    for part in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":"):
        wall = wall * 60 + float(part)
    return {
        "cpu_s": round(
            float(field("User time (seconds)")) + float(field("System time (seconds)")), 2
        ),
        "peak_mb": round(int(field("Maximum resident set size (kbytes)")) / 1024, 1),
        "wall_s": round(wall, 1),
    }


def last_json(path: Path) -> dict:
    return json.loads(path.read_text().strip().splitlines()[-1])


def shape(dataset: Path) -> dict[str, int]:
    """Nodes, edges and feature width from ``chunks.json`` or ``graph.json``."""
    name = "chunks.json" if (dataset / "chunks.json").is_file() else "graph.json"
    meta = json.loads((dataset / name).read_text())
    (feat,) = [
        f["shape"][1] for f in meta["node_features"]["_N"].values() if f["dtype"] == "float32"
    ]
    return {"nodes": meta["num_nodes"], "edges": meta["num_edges"], "feat_dim": feat}


def unchunked(dataset: Path, par: Path, par_t: Path) -> None:
    p = last_json(par)
    row = {"stage": "partition-parallel-unchunked", **shape(dataset), "hosts": 1}
    row |= {**timed(par_t), "peak_mb": p["peak_rss_mb"], "phase_peak_mb": p["phase_peak_mb"]}
    print(json.dumps(row))


def main(argv: list[str]) -> None:
    if argv[:1] == ["--unchunked"] and len(argv) == 4:
        unchunked(*map(Path, argv[1:]))
        return
    if len(argv) not in (7, 8):
        sys.exit(__doc__)
    dataset, gen, par, par_t, dist, dist_t, run = map(Path, argv[:7])
    private = float(argv[7]) if len(argv) == 8 else None
    graph = shape(dataset)
    rows = [{"stage": "generate", "hosts": 1, **timed(gen)}]
    p = last_json(par)
    rows.append(
        {
            "stage": "partition-parallel",
            "hosts": 1,
            **timed(par_t),
            "peak_mb": p["peak_rss_mb"],
            "phase_peak_mb": p["phase_peak_mb"],
        }
    )
    d = last_json(dist)
    peaks = [max(ph["peak_rss_mb"] for ph in r["phases"].values()) for r in d["ranks"]]
    rows.append(
        {
            "stage": "partition-distributed",
            "hosts": len(peaks),
            **timed(dist_t),
            "peak_mb": max(peaks),
            "peak_mb_per_rank": peaks,
        }
    )
    usage = [
        json.loads(f.read_text())["usage"]["roles"] for f in sorted((run / "status").glob("*.json"))
    ]
    stores = [u for roles in usage for name, u in roles.items() if name.startswith("store")]
    trainers = [u for roles in usage for name, u in roles.items() if name.startswith("trainer")]
    rows.append(
        {
            "stage": "serve",
            "hosts": len(usage),
            "peak_mb": max(s["peak_rss_mb"] for s in stores),
            "cpu_s": round(sum(s["cpu_s"] for s in stores), 2),
        }
    )
    (m,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    epoch_cpu = sum(t["cpu_s"] for t in m["trainers"])
    rows.append(
        {
            "stage": "train-epoch",
            "hosts": len(usage),
            "peak_mb": private or max(t["peak_rss_mb"] for t in m["trainers"]),
            "cpu_s": round(epoch_cpu, 2),
            "wall_s": m["epoch_s"],
        }
    )
    rows.append(
        {
            "stage": "evaluate",
            "hosts": len(usage),
            "peak_mb": private or max(t["peak_rss_mb"] for t in trainers),
            "cpu_s": round(sum(t["cpu_s"] for t in trainers) - epoch_cpu, 2),
            "wall_s": m["eval_s"],
            "test_acc": m["test_acc"],
        }
    )
    for row in rows:
        print(json.dumps({"stage": row.pop("stage"), **graph, **row}))


if __name__ == "__main__":
    main(sys.argv[1:])
