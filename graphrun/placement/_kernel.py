"""The OES event loop over flat arrays, compiled with numba (:mod:`graphrun.jit`).

:func:`run` is the inner loop of ETP (thousands of simulations per search). It takes
the DAG as arrays — node ``v`` is a flow iff ``src[v] >= 0`` — and returns the finish
time of every node, the number of events and the number of nodes that ran. The
semantics are those documented in :mod:`graphrun.placement.oes`; ties are broken the
same way on every run (stable priority order, ports in order of first use), so the
compiled function and its Python source (``run.py_func``) give identical results.
"""

from __future__ import annotations

import numpy as np

from graphrun.jit import njit as jit

PRIORITY, FAIR, FIFO = 0, 1, 2
_REL_EPS = 1e-12


@jit
def greedy(
    order: np.ndarray,
    count: int,
    src: np.ndarray,
    dst: np.ndarray,
    cap: np.ndarray,
    live_out: int,
    live_in: int,
    out_f: np.ndarray,
    out_r: np.ndarray,
) -> int:
    """Strict-priority water-filling over ``order[:count]``: each flow takes what its two
    ports have left. Writes the flows that got a positive rate to ``out_f``/``out_r``
    and returns how many. Every flow needs an egress and an ingress port, so the scan
    stops once all ``live_out`` egress or all ``live_in`` ingress ports in use are full."""
    res = cap.copy()
    k = 0
    full_out = 0
    full_in = 0
    for j in range(count):
        f = order[j]
        s = src[f]
        d = dst[f]
        a = res[s]
        b = res[d]
        if a <= 0.0 or b <= 0.0:
            continue
        if a <= b:
            out_f[k] = f
            out_r[k] = a
            res[s] = 0.0
            res[d] = b - a
            full_out += 1
            if a == b:
                full_in += 1
        else:
            out_f[k] = f
            out_r[k] = b
            res[d] = 0.0
            res[s] = a - b
            full_in += 1
        k += 1
        if full_out >= live_out or full_in >= live_in:
            break
    return k


@jit
def max_min(
    flows: np.ndarray,
    count: int,
    src: np.ndarray,
    dst: np.ndarray,
    cap: np.ndarray,
    out_f: np.ndarray,
    out_r: np.ndarray,
) -> int:
    """Max-min fair rates of ``flows[:count]`` by progressive filling: the port with the
    smallest fair share first (ties: the port used first). Writes ``count`` rates."""
    res = cap.copy()
    users = np.zeros(cap.shape[0], np.int64)
    ports = np.empty(2 * count, np.int64)  # in order of first use
    nports = 0
    for j in range(count):
        for p in (src[flows[j]], dst[flows[j]]):
            if users[p] == 0:
                ports[nports] = p
                nports += 1
            users[p] += 1
    rated = np.zeros(count, np.bool_)
    k = 0
    while k < count:
        best = -1
        share = np.inf
        for i in range(nports):
            p = ports[i]
            if users[p] > 0:
                s = res[p] / users[p]
                if s < share:
                    best = p
                    share = s
        for j in range(count):
            f = flows[j]
            if rated[j] or (src[f] != best and dst[f] != best):
                continue
            rated[j] = True
            out_f[k] = f
            out_r[k] = share
            k += 1
            res[src[f]] -= share
            users[src[f]] -= 1
            res[dst[f]] -= share
            users[dst[f]] -= 1
        users[best] = 0
        res[best] = 0.0
    return k


@jit
def _heap_push(ht: np.ndarray, hv: np.ndarray, n: int, t: float, v: int) -> int:
    i = n
    ht[i] = t
    hv[i] = v
    while i > 0:
        parent = (i - 1) >> 1
        if ht[parent] < ht[i] or (ht[parent] == ht[i] and hv[parent] < hv[i]):
            break
        ht[parent], ht[i] = ht[i], ht[parent]
        hv[parent], hv[i] = hv[i], hv[parent]
        i = parent
    return n + 1


@jit
def _heap_pop(ht: np.ndarray, hv: np.ndarray, n: int) -> int:
    """Remove the smallest (time, node); the caller read it from ``ht[0], hv[0]``."""
    n -= 1
    ht[0] = ht[n]
    hv[0] = hv[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (ht[c + 1] < ht[c] or (ht[c + 1] == ht[c] and hv[c + 1] < hv[c])):
            c += 1
        if ht[i] < ht[c] or (ht[i] == ht[c] and hv[i] < hv[c]):
            break
        ht[c], ht[i] = ht[i], ht[c]
        hv[c], hv[i] = hv[i], hv[c]
        i = c
    return n


@jit
def _release(
    v: int,
    succ_ptr: np.ndarray,
    succ_idx: np.ndarray,
    npred: np.ndarray,
    stack: np.ndarray,
    ns: int,
) -> int:
    """Node ``v`` finished: successors whose last predecessor it was go on the ready
    stack. Returns the stack's new height."""
    for e in range(succ_ptr[v], succ_ptr[v + 1]):
        w = succ_idx[e]
        npred[w] -= 1
        if npred[w] == 0:
            stack[ns] = w
            ns += 1
    return ns


@jit
def _sort_by_key(a: np.ndarray, count: int, key: np.ndarray) -> None:
    """Stable insertion sort of ``a[:count]`` by ``key`` (the list is nearly sorted)."""
    for i in range(1, count):
        v = a[i]
        kv = key[v]
        j = i - 1
        while j >= 0 and key[a[j]] > kv:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = v


@jit
def run(
    dur: np.ndarray,
    size: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    iteration: np.ndarray,
    succ_ptr: np.ndarray,
    succ_idx: np.ndarray,
    npred0: np.ndarray,
    cap: np.ndarray,
    machines: int,
    policy: int,
) -> tuple[np.ndarray, int, int]:
    """Simulate the DAG to completion: (finish times, events, nodes that ran)."""
    n = dur.shape[0]
    finish = np.full(n, np.nan)
    npred = npred0.copy()
    rem = size.copy()
    smax = 0.0
    for v in range(n):
        if src[v] >= 0 and size[v] > smax:
            smax = size[v]
    scale = 0.5 / (smax if smax > 0.0 else 1.0)
    key = iteration + rem * scale  # priority: iteration, then remaining bytes
    ht = np.empty(n + 1)
    hv = np.empty(n + 1, np.int64)
    nh = 0
    active = np.empty(n + 1, np.int64)  # arrival order (fifo) or priority order
    na = 0
    run_f = np.empty(n + 1, np.int64)
    run_r = np.empty(n + 1)
    nr = 0
    ended = np.empty(n + 1, np.int64)
    port_use = np.zeros(cap.shape[0], np.int64)
    live_out = 0
    live_in = 0
    stack = np.empty(n + 1, np.int64)
    ns = 0
    for v in range(n - 1, -1, -1):
        if npred[v] == 0:
            stack[ns] = v
            ns += 1
    t = 0.0
    done = 0
    events = 0
    dirty = False
    while True:
        while ns > 0:
            ns -= 1
            v = stack[ns]
            if src[v] >= 0:
                active[na] = v
                na += 1
                for p in (src[v], dst[v]):
                    port_use[p] += 1
                    if port_use[p] == 1:
                        if p >= machines:
                            live_in += 1
                        else:
                            live_out += 1
                dirty = True
            elif dur[v] > 0.0:
                nh = _heap_push(ht, hv, nh, t + dur[v], v)
            else:
                finish[v] = t
                done += 1
                ns = _release(v, succ_ptr, succ_idx, npred, stack, ns)
        if dirty:
            if policy == PRIORITY:
                _sort_by_key(active, na, key)
                nr = greedy(active, na, src, dst, cap, live_out, live_in, run_f, run_r)
            elif policy == FIFO:
                nr = greedy(active, na, src, dst, cap, live_out, live_in, run_f, run_r)
            else:
                nr = max_min(active, na, src, dst, cap, run_f, run_r)
            dirty = False
        tn = ht[0] if nh > 0 else np.inf
        for j in range(nr):
            tf = t + rem[run_f[j]] / run_r[j]
            if tf < tn:
                tn = tf
        if tn == np.inf:
            break
        events += 1
        dt = tn - t
        tol = _REL_EPS * tn  # relative only: an absolute floor ended tiny steps early
        ne = 0
        for j in range(nr):
            f = run_f[j]
            r = run_r[j]
            if t + rem[f] / r - tn <= tol:
                ended[ne] = f
                ne += 1
            else:
                rem[f] -= r * dt
                key[f] = iteration[f] + rem[f] * scale
        t = tn
        if ne > 0:
            dirty = True
            for j in range(ne):
                rem[ended[j]] = -1.0  # mark, then drop the ended flows keeping the order
            k = 0
            for i in range(na):
                if rem[active[i]] >= 0.0:
                    active[k] = active[i]
                    k += 1
            na = k
            for j in range(ne):
                f = ended[j]
                rem[f] = 0.0
                finish[f] = t
                done += 1
                for p in (src[f], dst[f]):
                    port_use[p] -= 1
                    if port_use[p] == 0:
                        if p >= machines:
                            live_in -= 1
                        else:
                            live_out -= 1
                ns = _release(f, succ_ptr, succ_idx, npred, stack, ns)
        while nh > 0 and ht[0] - t <= tol:
            v = hv[0]
            nh = _heap_pop(ht, hv, nh)
            finish[v] = t
            done += 1
            ns = _release(v, succ_ptr, succ_idx, npred, stack, ns)
    return finish, events, done


@jit
def place(
    size: np.ndarray,
    src_task: np.ndarray,
    dst_task: np.ndarray,
    group: np.ndarray,
    x: np.ndarray,
    machines: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flow sizes and ports of a template under placement ``x`` (see
    :meth:`graphrun.placement.workload.Template.place`): flows inside a machine or of
    no bytes become free steps; the flows of one group whose sources share a machine
    merge into the first of them (bytes added in node order)."""
    n = size.shape[0]
    out_size = np.zeros(n)
    src = np.full(n, -1, np.int64)
    dst = np.full(n, -1, np.int64)
    rep_group = np.full(machines, -1, np.int64)  # the group whose representative ...
    rep_node = np.zeros(machines, np.int64)  # ... from each machine is this node
    for v in range(n):
        if src_task[v] < 0 or size[v] <= 0.0:
            continue
        sm = x[src_task[v]]
        dm = x[dst_task[v]]
        if sm == dm:
            continue
        g = group[v]
        if g >= 0 and rep_group[sm] == g:
            out_size[rep_node[sm]] += size[v]
            continue
        if g >= 0:
            rep_group[sm] = g
            rep_node[sm] = v
        out_size[v] = size[v]
        src[v] = sm
        dst[v] = machines + dm
    return out_size, src, dst


@jit
def overload(demand: np.ndarray, x: np.ndarray, cap: np.ndarray) -> float:
    """Sum over machines and resources of the overload relative to the capacity (a
    resource a machine lacks counts as capacity 1)."""
    use = np.zeros(cap.shape)
    for t in range(x.shape[0]):
        for k in range(cap.shape[1]):
            use[x[t], k] += demand[t, k]
    total = 0.0
    for m in range(cap.shape[0]):
        for k in range(cap.shape[1]):
            over = use[m, k] - cap[m, k]
            if over > 0.0:
                total += over / max(cap[m, k], 1.0)
    return total


@jit
def port_load(traffic: np.ndarray, x: np.ndarray, egress: np.ndarray, ingress: np.ndarray) -> float:
    """The busiest port's seconds: bytes between tasks on different machines over the
    sender's egress and the receiver's ingress bandwidth."""
    m = egress.shape[0]
    out = np.zeros(m)
    inn = np.zeros(m)
    n = x.shape[0]
    for i in range(n):
        for j in range(n):
            if x[i] != x[j]:
                out[x[i]] += traffic[i, j]
                inn[x[j]] += traffic[i, j]
    best = 0.0
    for k in range(m):
        best = max(best, out[k] / egress[k], inn[k] / ingress[k])
    return best
