"""The pure-Python OES simulator graphrun shipped before the compiled kernel: the
oracle the kernel (``graphrun.placement._kernel``) is checked against, line for line
the same policies and tie-breaking over ``Dag`` tuples and Python lists."""

from __future__ import annotations

import heapq
import math

from graphrun.errors import ArgumentError
from graphrun.placement.dag import FLOW, Dag
from graphrun.placement.oes import Policy, SimResult

_REL_EPS = 1e-12


def _greedy(
    order: list[int],
    src: tuple[int, ...],
    dst: tuple[int, ...],
    cap: list[float],
    live_out: int,
    live_in: int,
) -> list[tuple[int, float]]:
    """Strict-priority water-filling: each flow in ``order`` takes what its ports have left.

    Returns the flows that got a positive rate. Every flow needs an egress and an
    ingress port, so the scan stops once all ``live_out`` egress ports or all
    ``live_in`` ingress ports that active flows use are saturated.
    """
    res = cap[:]
    out = []
    full_out = full_in = 0
    for f in order:
        s = src[f]
        d = dst[f]
        a = res[s]
        b = res[d]
        if a <= 0.0 or b <= 0.0:
            continue
        if a <= b:
            out.append((f, a))
            res[s] = 0.0
            res[d] = b - a
            full_out += 1
            if a == b:
                full_in += 1
        else:
            out.append((f, b))
            res[d] = 0.0
            res[s] = a - b
            full_in += 1
        if full_out >= live_out or full_in >= live_in:
            break
    return out


def max_min_rates(
    flows: list[int], src: tuple[int, ...], dst: tuple[int, ...], cap: list[float]
) -> dict[int, float]:
    """Max-min fair rates by progressive filling (the bottleneck port first)."""
    res = cap[:]
    on_port: dict[int, list[int]] = {}
    for f in flows:
        on_port.setdefault(src[f], []).append(f)
        on_port.setdefault(dst[f], []).append(f)
    count = {p: len(fs) for p, fs in on_port.items()}
    rates: dict[int, float] = {}
    while len(rates) < len(flows):
        best, share = -1, math.inf
        for p, c in count.items():
            if c > 0:
                s = res[p] / c
                if s < share:
                    best, share = p, s
        for f in on_port[best]:
            if f in rates:
                continue
            rates[f] = share
            for p in (src[f], dst[f]):
                res[p] -= share
                count[p] -= 1
        count[best] = 0
        res[best] = 0.0
    return rates


def simulate(dag: Dag, policy: Policy | str = Policy.PRIORITY) -> SimResult:
    """Run ``dag`` to completion under ``policy``; returns the makespan and finish times."""
    try:
        policy = Policy(policy)
    except ValueError:
        raise ArgumentError(f"simulate: unknown policy {policy!r}") from None
    kind, dur, size, succ = dag.kind, dag.duration, dag.size, dag.succ
    src, dst = dag.src_port, dag.dst_port
    cap = list(dag.port_capacity)
    npred = list(dag.npred)
    n = len(kind)
    finish = [math.nan] * n
    heap: list[tuple[float, int]] = []
    active: list[int] = []  # waiting or running flows (arrival order, or priority order)
    port_use = [0] * len(cap)  # active flows per port
    m = dag.num_machines
    live = [0, 0]  # egress, ingress ports with at least one active flow
    rem = list(size)
    # priority key: iteration first, then remaining bytes (scaled below 1)
    scale = 0.5 / (max(size, default=0.0) or 1.0)
    key = [it + r * scale for it, r in zip(dag.iteration, size, strict=True)]
    running: list[tuple[int, float]] = []
    stack = [v for v in range(n - 1, -1, -1) if npred[v] == 0]
    t = 0.0
    done = 0
    events = 0
    dirty = False
    while True:
        while stack:
            v = stack.pop()
            if kind[v] == FLOW:
                active.append(v)
                for p in (src[v], dst[v]):
                    port_use[p] += 1
                    if port_use[p] == 1:
                        live[p >= m] += 1
                dirty = True
            elif dur[v] > 0.0:
                heapq.heappush(heap, (t + dur[v], v))
            else:
                finish[v] = t
                done += 1
                for w in succ[v]:
                    npred[w] -= 1
                    if npred[w] == 0:
                        stack.append(w)
        if dirty:
            if policy is Policy.PRIORITY:
                active.sort(key=key.__getitem__)
                running = _greedy(active, src, dst, cap, live[0], live[1])
            elif policy is Policy.FIFO:
                running = _greedy(active, src, dst, cap, live[0], live[1])
            else:
                running = list(max_min_rates(active, src, dst, cap).items())
            dirty = False
        tn = heap[0][0] if heap else math.inf
        for f, r in running:
            tf = t + rem[f] / r
            if tf < tn:
                tn = tf
        if tn == math.inf:
            break
        events += 1
        dt = tn - t
        tol = _REL_EPS * tn  # as the kernel: relative only
        ended = []
        for f, r in running:
            if t + rem[f] / r - tn <= tol:
                ended.append(f)
            else:
                rem[f] -= r * dt
                key[f] = dag.iteration[f] + rem[f] * scale
        t = tn
        if ended:
            dirty = True
            for f in ended:
                active.remove(f)
                rem[f] = 0.0
                finish[f] = t
                done += 1
                for p in (src[f], dst[f]):
                    port_use[p] -= 1
                    if port_use[p] == 0:
                        live[p >= m] -= 1
                for w in succ[f]:
                    npred[w] -= 1
                    if npred[w] == 0:
                        stack.append(w)
        while heap and heap[0][0] - t <= tol:
            _, v = heapq.heappop(heap)
            finish[v] = t
            done += 1
            for w in succ[v]:
                npred[w] -= 1
                if npred[w] == 0:
                    stack.append(w)
    if done != n:
        raise ArgumentError(f"simulate: {n - done} nodes never ran (the DAG has a cycle)")
    return SimResult(makespan=max(finish, default=0.0), finish=tuple(finish), events=events)
