"""OES: the event-driven fluid simulator of online execution and flow scheduling.

:func:`simulate` runs a :class:`~graphrun.placement.dag.Dag` to completion:

* **Execution** is work-conserving: a node starts the moment its last predecessor
  finishes; a compute step then takes exactly its duration.
* **Flows** are fluids over NIC ports (egress of the sender, ingress of the receiver,
  a non-blocking switch in between). Whenever the set of flows changes, rates are
  re-allocated by the chosen :class:`Policy`, and the simulation jumps to the next
  event (a compute step or a flow finishing). Between events rates are constant.

Policies:

``priority`` (OES)
    strict-priority water-filling: flows are served greedily in the order (training
    iteration, remaining bytes) — the synchronisation chain of the oldest iteration
    first, then the prefetch flows of later iterations, smallest remaining first
    within an iteration; each flow takes all that is left on its two ports.
``fair``
    max-min fair sharing over the ports (progressive filling), the model of TCP
    flows and of SimGrid's bandwidth sharing.
``fifo``
    greedy in arrival order.

This is the inner loop of ETP: the event loop lives in :mod:`graphrun.placement._kernel`
over flat arrays (compiled with numba when installed); :func:`simulate` takes a
:class:`~graphrun.placement.dag.Dag`, :func:`simulate_arrays` the arrays ETP builds
directly from a placed :class:`~graphrun.placement.workload.Template`, and
:func:`simulate_times` every node's start and finish (what
:mod:`graphrun.placement.schedule` turns into tasks per machine and flows per link).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.placement import _kernel
from graphrun.placement.dag import FLOW, Dag


class Policy(StrEnum):
    PRIORITY = "priority"
    FAIR = "fair"
    FIFO = "fifo"


_CODE = {Policy.PRIORITY: _kernel.PRIORITY, Policy.FAIR: _kernel.FAIR, Policy.FIFO: _kernel.FIFO}


@dataclass(frozen=True)
class SimResult:
    makespan: float
    finish: tuple[float, ...]  # finish time per node
    events: int


@dataclass(frozen=True)
class DagArrays:
    """A DAG as the kernel takes it: node ``v`` is a flow iff ``src[v] >= 0``."""

    duration: np.ndarray  # float64 compute seconds (0 for flows)
    size: np.ndarray  # float64 flow bytes (0 for compute)
    src: np.ndarray  # int64 egress port, -1 for compute
    dst: np.ndarray  # int64 ingress port, -1 for compute
    iteration: np.ndarray  # float64
    succ_ptr: np.ndarray  # int64 CSR over successors
    succ_idx: np.ndarray
    npred: np.ndarray  # int64
    capacity: np.ndarray  # float64 bytes/s per port
    machines: int


def dag_arrays(dag: Dag) -> DagArrays:
    flow = np.asarray(dag.kind, dtype=np.int64) == FLOW
    ptr = np.zeros(dag.num_nodes + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(s) for s in dag.succ])
    idx = np.fromiter((w for s in dag.succ for w in s), dtype=np.int64, count=int(ptr[-1]))
    return DagArrays(
        duration=np.asarray(dag.duration, dtype=np.float64),
        size=np.where(flow, np.asarray(dag.size, dtype=np.float64), 0.0),
        src=np.where(flow, np.asarray(dag.src_port, dtype=np.int64), -1),
        dst=np.where(flow, np.asarray(dag.dst_port, dtype=np.int64), -1),
        iteration=np.asarray(dag.iteration, dtype=np.float64),
        succ_ptr=ptr,
        succ_idx=idx,
        npred=np.asarray(dag.npred, dtype=np.int64),
        capacity=np.asarray(dag.port_capacity, dtype=np.float64),
        machines=dag.num_machines,
    )


def _policy(policy: Policy | str) -> Policy:
    try:
        return Policy(policy)
    except ValueError:
        raise ArgumentError(f"simulate: unknown policy {policy!r}") from None


def simulate_arrays(a: DagArrays, policy: Policy | str = Policy.PRIORITY) -> tuple[float, int]:
    """The makespan and event count of ``a`` under ``policy`` (no finish times kept)."""
    finish, events, _ = _run(a, _policy(policy))
    return float(finish.max(initial=0.0)), events


def simulate_times(
    a: DagArrays, policy: Policy | str = Policy.PRIORITY
) -> tuple[np.ndarray, np.ndarray]:
    """Every node's ``(start, finish)``: a node starts when its last predecessor
    finishes (a flow may then wait for bandwidth, a CPU step for cores, until its end)."""
    finish, _, _ = _run(a, _policy(policy))
    start = np.zeros_like(finish)
    counts = np.diff(a.succ_ptr)
    np.maximum.at(start, a.succ_idx, np.repeat(finish, counts))
    return start, finish


def _run(a: DagArrays, policy: Policy) -> tuple[np.ndarray, int, int]:
    finish, events, done = _kernel.run(
        a.duration,
        a.size,
        a.src,
        a.dst,
        a.iteration,
        a.succ_ptr,
        a.succ_idx,
        a.npred,
        a.capacity,
        a.machines,
        _CODE[policy],
    )
    n = a.duration.shape[0]
    if done != n:
        raise ArgumentError(f"simulate: {n - done} nodes never ran (the DAG has a cycle)")
    return finish, int(events), int(done)


def max_min_rates(
    flows: list[int], src: tuple[int, ...], dst: tuple[int, ...], cap: list[float]
) -> dict[int, float]:
    """Max-min fair rates by progressive filling (the bottleneck port first)."""
    f = np.asarray(flows, dtype=np.int64)
    out_f = np.empty(len(flows), dtype=np.int64)
    out_r = np.empty(len(flows))
    k = _kernel.max_min(
        f,
        len(flows),
        np.asarray(src, dtype=np.int64),
        np.asarray(dst, dtype=np.int64),
        np.asarray(cap, dtype=np.float64),
        out_f,
        out_r,
    )
    return {int(a): float(b) for a, b in zip(out_f[:k], out_r[:k], strict=True)}


def simulate(dag: Dag, policy: Policy | str = Policy.PRIORITY) -> SimResult:
    """Run ``dag`` to completion under ``policy``; returns the makespan and finish times."""
    policy = _policy(policy)
    finish, events, _ = _run(dag_arrays(dag), policy)
    return SimResult(
        makespan=float(finish.max(initial=0.0)), finish=tuple(finish.tolist()), events=events
    )
