"""Cross-check the fluid simulator against SimGrid on random flow sets.

A flow set is a few machines (random egress/ingress bandwidths) and random flows
(source, destination, bytes, start time). OES runs each set under fair sharing
(:func:`oes_finish`); SimGrid runs the same sets in a child process
(``_simgrid_worker.py``, which appends Debian's dist-packages to its own ``sys.path``
only). :func:`crosscheck` reports the largest relative difference of the makespans
and of the individual flow finish times.

SimGrid comes from Debian's ``python3-simgrid``; :func:`simgrid_available` says
whether it is installed for this Python.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphrun.errors import GraphrunError
from graphrun.placement.dag import DagBuilder
from graphrun.placement.oes import Policy, simulate

DIST_PACKAGES = Path("/usr/lib/python3/dist-packages")
WORKER = Path(__file__).with_name("_simgrid_worker.py")


@dataclass(frozen=True)
class Flow:
    src: int
    dst: int
    size: int  # bytes
    start: float  # seconds


@dataclass(frozen=True)
class FlowSet:
    egress: tuple[float, ...]  # bytes/s per machine
    ingress: tuple[float, ...]
    flows: tuple[Flow, ...]


@dataclass(frozen=True)
class CrossCheck:
    flowsets: int
    flows: int
    max_rel_error: float  # over makespans
    max_rel_error_flows: float  # over every flow's finish time


def simgrid_available() -> bool:
    tag = f"simgrid.cpython-{sys.version_info.major}{sys.version_info.minor}"
    return any(DIST_PACKAGES.glob(f"{tag}*.so"))


def random_flowsets(
    seed: int, count: int = 20, machines: int = 4, flows: int = 12
) -> list[FlowSet]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        eg = tuple(float(x) for x in rng.choice([1.25e9, 2.5e9, 6.25e9], size=machines))
        ing = tuple(float(x) for x in rng.choice([1.25e9, 2.5e9, 6.25e9], size=machines))
        fs = []
        for _ in range(flows):
            a, b = rng.choice(machines, size=2, replace=False)
            size = int(rng.integers(10**6, 10**9))
            start = float(rng.choice([0.0, float(rng.uniform(0, 0.5))]))
            fs.append(Flow(int(a), int(b), size, start))
        out.append(FlowSet(eg, ing, tuple(fs)))
    return out


def oes_finish(fs: FlowSet, policy: Policy = Policy.FAIR) -> list[float]:
    """Finish time of every flow of ``fs`` in the fluid simulator."""
    b = DagBuilder(egress=fs.egress, ingress=fs.ingress)
    ids = []
    for f in fs.flows:
        deps = (b.compute(f.start),) if f.start > 0 else ()
        ids.append(b.flow(f.size, f.src, f.dst, 0, deps))
    result = simulate(b.build(), policy)
    return [result.finish[v] for v in ids]


def simgrid_finish(flowsets: list[FlowSet], timeout: float = 300.0) -> list[list[float]]:
    """Finish time of every flow of every set, simulated by SimGrid in a child process."""
    if not simgrid_available():
        raise GraphrunError("SimGrid is not installed (Debian package python3-simgrid)")
    req = {
        "flowsets": [
            {
                "machines": [
                    {"egress": e, "ingress": i} for e, i in zip(fs.egress, fs.ingress, strict=True)
                ],
                "flows": [f.__dict__ for f in fs.flows],
            }
            for fs in flowsets
        ]
    }
    return _run_worker(req, timeout)


def _run_worker(req: dict, timeout: float) -> list[list[float]]:
    try:
        proc = subprocess.run(
            [sys.executable, str(WORKER)],
            input=json.dumps(req),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise GraphrunError(f"SimGrid cross-check timed out after {timeout:g} s") from exc
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise GraphrunError(f"SimGrid worker failed (exit {proc.returncode}): {tail[0]}")
    return json.loads(proc.stdout)["finish"]


def crosscheck(flowsets: list[FlowSet]) -> CrossCheck:
    """Largest relative differences between OES (fair sharing) and SimGrid."""
    sg = simgrid_finish(flowsets)
    worst_ms = worst_flow = 0.0
    for fs, theirs in zip(flowsets, sg, strict=True):
        ours = oes_finish(fs)
        worst_ms = max(worst_ms, abs(max(ours) - max(theirs)) / max(theirs))
        for a, b in zip(ours, theirs, strict=True):
            worst_flow = max(worst_flow, abs(a - b) / b)
    return CrossCheck(
        flowsets=len(flowsets),
        flows=sum(len(fs.flows) for fs in flowsets),
        max_rel_error=worst_ms,
        max_rel_error_flows=worst_flow,
    )
