"""From (cluster, job, placement) to the DAG the simulator runs.

One training iteration ``i`` of trainer ``r`` of ``W`` (its home partition
``p = r * P // W``, :func:`graphrun.names.home_partition`; sampler worker ``w = i mod S``)
is::

    structure flows store:q -> sampler   (gated by the prefetch window and the worker's
          |                               previous batch)
    sample compute (sampler)
          |------------------------------.
    batch flow sampler -> trainer        feature flows store:q -> trainer
          '------------------------------'
    train compute (trainer)    also after the parameters of iteration i-1 arrived
          |
    ps:    gradient flows trainer -> ps:j, PS update, parameter flows ps:j -> trainer
    allreduce: after every trainer, a ring flow trainer r -> r+1 of 2(T-1)/T gradients

Sampling of iteration ``i`` may start once iteration ``i - prefetch - 1`` has ended
(parameters delivered to every trainer); a trainer without sampler workers samples its
batch ``i`` only after training batch ``i - 1`` (one process does one thing at a time).

Flows of one stage from stores on the same machine are merged; flows inside a machine
are free. Times and bytes are drawn once per :class:`Scenario` (seeded), so every
placement is scored on the same draws.

Parameter servers (``sync: ps``): synchronous (``staleness: 0``), each shard's update of
iteration ``i`` waits for every trainer's gradient and every trainer's parameters for
its next batch wait for that update. Asynchronous (``staleness: k >= 1``, the runtime's
stale synchronous parallel): a shard applies every gradient as it comes (an update of
``ps_update_s / T`` each), and trainer ``r``'s parameters after iteration ``i`` leave
the shard once its own gradient is applied and every trainer's of iteration ``i - k``
(a pull waits for the slowest trainer only when it is more than ``k`` steps behind);
each trainer's sampling then waits for its own parameters of iteration
``i - prefetch - 1``, not for every trainer's. With CPU seconds in the profile, a
shard's update is a CPU step of its ``ps:j`` task (``ps_update_s``: the CPU seconds the
parameter servers measured for one step of every trainer, receiving, applying and
sending included), shared with the other roles of its machine like theirs.

CPU: a profile measured by graphrun's runtime carries the CPU seconds of each batch's
sampling and compute (``Profile.cpu_seconds``). Then those steps are fluids too: a
step of task ``t`` on machine ``m`` is a flow of its CPU seconds through two more
ports, ``t``'s own (its intra-op threads: it uses at most that many cores) and ``m``'s
CPU (its cores), so the trainers and samplers of one machine share its cores while
they compute and one alone gets them all (processor sharing, work-conserving, by the
same policy as the NICs). With the store servers' CPU seconds per byte they send
(``serve_cpu_s_per_byte``), each store flow that leaves its machine comes with serving:
its CPU seconds twice, as two steps of the store's. The *reply*, beside the flow (the
receiver waits for both), runs through the store's port alone (as many cores as a
trainer's threads, at full speed); the *charge*, which nothing waits for, runs through
its machine's cores alone. A machine's ``cpu`` is a share of faster cores (a cgroup CPU
quota: a process runs at a whole core's speed until the quota of the period is spent),
so a store on an otherwise idle slow machine answers at a core's speed, and its CPU
seconds still count against the machine's share: they slow the roles beside it, and a
machine whose share cannot keep up with its stores' serving bounds the epoch. Profiles
without CPU seconds (the built-ins) keep their step times on every machine.

The unrolled DAG does not depend on the placement except through those rules, so it is
built once per scenario as a :class:`Template` over tasks, and :meth:`Template.place`
turns it into the simulator's arrays for one placement in a few vectorised steps (what
ETP does thousands of times); :func:`build_workload` freezes the same arrays into a
:class:`~graphrun.placement.dag.Dag`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.names import home_partition
from graphrun.placement import _kernel
from graphrun.placement.cluster import Cluster
from graphrun.placement.dag import COMPUTE, FLOW, Dag
from graphrun.placement.job import Job
from graphrun.placement.oes import DagArrays
from graphrun.placement.profile import SERVE

# how a CPU step flows (``Template.cpu_route``): through its task's threads and its
# machine's cores, through the task's threads alone (a store's reply, at a core's speed),
# or through its machine's cores alone (the reply's CPU seconds charged to the machine)
ROUTE_SHARED, ROUTE_THREADS, ROUTE_CORES = 0, 1, 2
# what each node of a template is (``Template.stage``), for schedules and timelines
STAGES = (
    "sync", "structure", "sample", "batch", "feature", "train", "serve", "serve-charge",
    "gradient", "update", "parameters", "allreduce",
)  # fmt: skip
_STAGE = {name: i for i, name in enumerate(STAGES)}
_UNLIMITED = 1e18  # the capacity of the port a one-sided CPU step's other end uses


@dataclass(frozen=True)
class Scenario:
    """Per-iteration draws from a profile, shared by every placement scored on it."""

    job: Job
    iterations: int
    sample_s: np.ndarray  # (K, T)
    compute_s: np.ndarray  # (K, T)
    structure: np.ndarray  # (K, T, P) bytes the batch's sampler pulls from partition q
    feature: np.ndarray  # (K, T, P)
    batch_bytes: np.ndarray  # (K, T)
    grad_bytes: float
    ps_update_s: np.ndarray  # (K, J)
    cpu_seconds: bool = False  # sample_s and compute_s are CPU seconds (scaled by share)
    threads: float = 1.0  # cores one trainer or sampler can use at most
    serve_cpu_per_byte: float = 0.0  # a store's CPU seconds per byte it sends remotely


def make_scenario(job: Job, seed: int = 0, iterations: int | None = None) -> Scenario:
    spec, prof = job.spec, job.profile
    k = iterations or spec.iterations
    t, p = spec.trainers, spec.partitions
    rng = np.random.default_rng(seed)

    def per_part(kind: str) -> np.ndarray:
        out = prof[f"{kind}_other"].sample(rng, k * t * p).reshape(k, t, p)
        own = prof[f"{kind}_own"].sample(rng, k * t).reshape(k, t)
        for r in range(t):
            out[:, r, home_partition(r, t, p)] = own[:, r]
        return out

    cpu = prof.cpu_seconds
    return Scenario(
        job=job,
        iterations=k,
        sample_s=prof["sample_cpu_s" if cpu else "sample_s"].sample(rng, k * t).reshape(k, t),
        compute_s=prof["compute_cpu_s" if cpu else "compute_s"].sample(rng, k * t).reshape(k, t),
        structure=per_part("structure"),
        # a trainer whose feature cache holds the whole graph's rows pulls none, wherever
        # it runs (co-located rows come from shared memory, all others from its cache);
        # drawn all the same, so the other quantities' draws do not change with it
        feature=per_part("feature") * (0.0 if spec.features_cached else 1.0),
        batch_bytes=prof["batch_bytes"].sample(rng, k * t).reshape(k, t),
        grad_bytes=prof["grad_bytes"].mean,
        ps_update_s=prof["ps_update_s"]
        .sample(rng, k * max(1, spec.parameter_servers))
        .reshape(k, -1),
        cpu_seconds=cpu,
        threads=max(prof["threads"].values) if cpu else 1.0,
        serve_cpu_per_byte=prof[SERVE].mean if cpu and SERVE in prof.quantities else 0.0,
    )


def traffic_matrix(sc: Scenario) -> np.ndarray:
    """(tasks, tasks) bytes sent from task i to task j over all iterations of ``sc``.

    Summed over the pairs on different machines, these are exactly the bytes the DAG
    of :func:`build_workload` puts on each port (merging flows keeps their bytes).
    """
    spec = sc.job.spec
    nt, np_, ns = spec.trainers, spec.partitions, spec.samplers_per_trainer
    base_s = np_ + nt
    ps0 = base_s + nt * ns
    out = np.zeros((len(sc.job.tasks),) * 2)
    for i in range(sc.iterations):
        for r in range(nt):
            s_task = base_s + r * ns + i % ns if ns else np_ + r
            out[:np_, s_task] += sc.structure[i, r]
            out[:np_, np_ + r] += sc.feature[i, r]
            out[s_task, np_ + r] += sc.batch_bytes[i, r]
    if spec.sync == "ps":
        share = sc.iterations * sc.grad_bytes / spec.parameter_servers
        out[np_ : np_ + nt, ps0:] += share
        out[ps0:, np_ : np_ + nt] += share
    else:
        ring = sc.iterations * 2 * (nt - 1) / nt * sc.grad_bytes
        for r in range(nt):
            out[np_ + r, np_ + (r + 1) % nt] += ring
    np.fill_diagonal(out, 0.0)
    return out


@dataclass(frozen=True)
class Template:
    """The placement-independent DAG of a scenario: flows run between *tasks*.

    Every store's flow of one stage (structure to a sampler, features to a trainer)
    is its own node here, with the stage as its merge ``group``: placing the template
    (:meth:`place`) merges the flows of one group whose stores share a machine into
    the first of them and turns the rest, like every flow inside a machine, into free
    zero-duration steps. A group's flows share their predecessors and successors, so
    this is the same DAG as merging while unrolling, with a few extra no-op nodes.
    """

    num_tasks: int
    duration: np.ndarray  # float64 compute seconds (0 for flows)
    size: np.ndarray  # float64 bytes (0 for compute)
    src_task: np.ndarray  # int64, -1 for compute
    dst_task: np.ndarray
    group: np.ndarray  # int64 merge group of a store flow, -1 otherwise
    iteration: np.ndarray  # float64
    succ_ptr: np.ndarray  # int64 CSR over successors
    succ_idx: np.ndarray
    npred: np.ndarray
    task_busy: tuple[float, ...]  # total compute seconds per task (CPU seconds if scaled)
    cpu_task: np.ndarray  # int64 the task whose CPU a compute step uses, -1 for none
    serve_of: np.ndarray  # int64 the store flow a serving step sends, -1 for none
    cpu_route: np.ndarray  # int64 ROUTE_* of a CPU step (ROUTE_SHARED for the others)
    cpu_seconds: bool = False  # durations are CPU seconds, scaled per placement
    threads: float = 1.0
    owner: np.ndarray | None = None  # int64 the task a compute step runs on, -1 for none
    stage: np.ndarray | None = None  # int64 index into STAGES

    @property
    def num_nodes(self) -> int:
        return int(self.duration.shape[0])

    def alone(self, cluster: Cluster, x: np.ndarray) -> np.ndarray:
        """Per task: how much longer its steps take than their CPU seconds when it has its
        machine to itself (1 unscaled): a bound, not what sharing gives."""
        if not self.cpu_seconds:
            return np.ones(self.num_tasks)
        cores = np.asarray(cluster.cpu, dtype=np.float64)[x]
        return 1.0 / np.maximum(np.minimum(self.threads, cores), 1e-9)

    def best_slowdown(self, cluster: Cluster) -> np.ndarray:
        """Per task: the least slowdown any placement gives (each alone on the fastest)."""
        fastest = np.full(self.num_tasks, int(np.argmax(cluster.cpu)), dtype=np.int64)
        return self.alone(cluster, fastest)

    def place(
        self, cluster: Cluster, placement: Sequence[int], slowdown: np.ndarray | None = None
    ) -> DagArrays:
        """The simulator's arrays for ``placement`` (machine index per task). With CPU
        seconds, steps are flows through the CPU ports (see the module docstring), unless
        ``slowdown`` gives each task's steps a fixed duration (bounds)."""
        x = np.asarray(placement, dtype=np.int64)
        if x.shape != (self.num_tasks,):
            raise ArgumentError(f"placement: {x.size} entries for {self.num_tasks} tasks")
        if x.size and (x.min() < 0 or x.max() >= cluster.size):
            raise ArgumentError("placement: a machine index is out of range")
        size, src, dst = _kernel.place(
            self.size, self.src_task, self.dst_task, self.group, x, cluster.size
        )
        duration = self.duration
        serving = self.serve_of >= 0
        if serving.any():  # a store serves only what leaves its machine
            f = self.serve_of[serving]
            inside = x[self.src_task[f]] == x[self.dst_task[f]]
            duration = duration.copy()
            duration[np.flatnonzero(serving)[inside]] = 0.0
        capacity = np.asarray((*cluster.egress, *cluster.ingress), dtype=np.float64)
        machines = cluster.size  # ports below this are senders' (egress), the rest receivers'
        if self.cpu_seconds and slowdown is not None:
            # a reply runs at its threads' full speed; a charge waits for nothing
            scale = np.where(self.cpu_task >= 0, slowdown[self.cpu_task], 1.0)
            scale[self.cpu_route == ROUTE_THREADS] = 1.0 / max(self.threads, 1e-9)
            scale[self.cpu_route == ROUTE_CORES] = 0.0
            duration = duration * scale
        elif self.cpu_seconds:
            # ports: egress [0, M), task threads [M, M+T), any sender M+T, ingress
            # [M+T+1, 2M+T+1), CPU [2M+T+1, 3M+T+1), any receiver 3M+T+1
            m, t = cluster.size, self.num_tasks
            step = (self.cpu_task >= 0) & (duration > 0)
            task, route = self.cpu_task[step], self.cpu_route[step]
            dst = np.where(dst >= 0, dst + t + 1, dst)
            size, src = size.copy(), src.copy()
            size[step] = duration[step]
            src[step] = np.where(route == ROUTE_CORES, m + t, m + task)
            dst[step] = np.where(route == ROUTE_THREADS, 3 * m + t + 1, 2 * m + t + 1 + x[task])
            duration = np.where(step, 0.0, duration)
            cores = np.maximum(np.asarray(cluster.cpu, dtype=np.float64), 1e-9)
            capacity = np.concatenate([
                capacity[:m], np.full(t, self.threads), [_UNLIMITED], capacity[m:], cores,
                [_UNLIMITED],
            ])  # fmt: skip
            machines = m + t + 1
        return DagArrays(
            duration=duration,
            size=size,
            src=src,
            dst=dst,
            iteration=self.iteration,
            succ_ptr=self.succ_ptr,
            succ_idx=self.succ_idx,
            npred=self.npred,
            capacity=capacity,
            machines=machines,
        )


@dataclass(frozen=True)
class Workload:
    dag: Dag
    task_busy: tuple[float, ...]  # total compute seconds per task


def make_template(sc: Scenario) -> Template:
    """Unroll ``sc.iterations`` iterations of the job into a :class:`Template`."""
    job = sc.job
    u = _Unroll(sc)
    prefetch = job.spec.prefetch
    for i in range(sc.iterations):
        trains = [u.batch(i, r, u.gate(i - prefetch - 1, r)) for r in range(job.spec.trainers)]
        if job.spec.sync == "ps" and job.spec.staleness:
            u.async_ps(i, trains, job.spec.staleness)
        elif job.spec.sync == "ps":
            u.sync_ps(i, trains)
        else:
            u.sync_allreduce(i, trains)
    return u.build()


def build_workload(cluster: Cluster, sc: Scenario, placement: Sequence[int]) -> Workload:
    """The DAG of ``sc.iterations`` iterations of the job placed by ``placement``.

    ``placement[i]`` is the machine index of task ``i`` (in ``job.tasks`` order). With
    CPU seconds, each step takes what it would alone on its machine: the DAG bounds the
    simulated makespan from below (the bounds' model), it does not reproduce it.
    """
    if len(placement) != len(sc.job.tasks):
        raise ArgumentError(f"placement: {len(placement)} entries for {len(sc.job.tasks)} tasks")
    tpl = make_template(sc)
    x = np.asarray(placement, dtype=np.int64)
    alone = tpl.alone(cluster, x)
    busy = np.asarray(tpl.task_busy) * alone
    placed = tpl.place(cluster, placement, alone)
    return Workload(dag=to_dag(placed), task_busy=tuple(busy.tolist()))


def to_dag(a: DagArrays) -> Dag:
    """The frozen :class:`Dag` of placed arrays (for the bounds and the tests)."""
    n = a.duration.shape[0]
    flow = a.src >= 0
    ptr, idx = a.succ_ptr.tolist(), a.succ_idx.tolist()
    return Dag(
        num_machines=a.machines,
        port_capacity=tuple(a.capacity.tolist()),
        kind=tuple(np.where(flow, FLOW, COMPUTE).tolist()),
        duration=tuple(np.where(flow, 0.0, a.duration).tolist()),
        size=tuple(a.size.tolist()),
        src_port=tuple(a.src.tolist()),
        dst_port=tuple(a.dst.tolist()),
        iteration=tuple(int(i) for i in a.iteration.tolist()),
        succ=tuple(tuple(idx[ptr[v] : ptr[v + 1]]) for v in range(n)),
        npred=tuple(a.npred.tolist()),
    )


class _Unroll:
    """The state of :func:`make_template` while it unrolls iterations: nodes are
    appended to flat lists (dependencies always on earlier nodes)."""

    def __init__(self, sc: Scenario) -> None:
        spec = sc.job.spec
        self.sc = sc
        self.nt, self.np, self.ns = spec.trainers, spec.partitions, spec.samplers_per_trainer
        self.ps0 = self.np + self.nt + self.nt * self.ns  # index of ps:0
        self.busy = [0.0] * len(sc.job.tasks)
        self.end: list[int] = []  # per iteration: parameters delivered everywhere
        self.last_sample: dict[int, int] = {}  # sampler task -> its latest sample step
        self.last_train: dict[int, int] = {}  # trainer task -> its latest training step
        self.params_ready: list[int | None] = [None] * self.nt
        # asynchronous PS: per trainer, its parameters' arrival per iteration (its
        # sampling gate), and per iteration and shard, the update of each trainer's push
        self.ready_of: list[list[int]] = [[] for _ in range(self.nt)]
        self.updates: list[list[tuple[int, ...]]] = []
        self.asynchronous = spec.sync == "ps" and spec.staleness > 0
        self.dur: list[float] = []
        self.size: list[float] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.group: list[int] = []
        self.it: list[int] = []
        self.preds: list[tuple[int, ...]] = []
        self.cpu_task: list[int] = []
        self.cpu_route: list[int] = []
        self.owner: list[int] = []
        self.stage: list[int] = []
        self.serve_of: dict[int, int] = {}  # serving step -> its flow
        self.groups = 0

    def _node(
        self,
        dur: float,
        size: float,
        s: int,
        d: int,
        g: int,
        i: int,
        deps: tuple,
        cpu: int = -1,
        route: int = ROUTE_SHARED,
        stage: str = "sync",
        owner: int = -1,
    ) -> int:
        self.owner.append(owner if owner >= 0 else cpu)
        self.stage.append(_STAGE[stage])
        self.cpu_task.append(cpu)
        self.cpu_route.append(route)
        self.dur.append(dur)
        self.size.append(size)
        self.src.append(s)
        self.dst.append(d)
        self.group.append(g)
        self.it.append(i)
        self.preds.append(deps)
        return len(self.dur) - 1

    def compute(
        self,
        dur: float,
        i: int,
        deps: tuple[int, ...],
        task: int = -1,
        route: int = ROUTE_SHARED,
        stage: str = "sync",
        owner: int = -1,
    ) -> int:
        """A compute step; ``task`` runs it (its duration scales with that task's CPU);
        ``owner`` runs one whose duration does not scale (a PS update)."""
        return self._node(dur, 0.0, -1, -1, -1, i, deps, task, route, stage, owner)

    def flow(self, size: float, s: int, d: int, i: int, deps: tuple[int, ...], stage: str) -> int:
        return self._node(0.0, size, s, d, -1, i, deps, stage=stage)

    def store_flows(
        self, sizes: np.ndarray, d: int, i: int, deps: tuple[int, ...], stage: str
    ) -> list[int]:
        """One flow per store to task ``d``, merged by machine when placed, and with a
        serving cost, each store's reply beside its flow (and the reply's charge to the
        store's machine, which nothing waits for)."""
        self.groups += 1
        flows = [
            self._node(0.0, b, q, d, self.groups - 1, i, deps, stage=stage)
            for q, b in enumerate(sizes.tolist())
        ]
        cost = self.sc.serve_cpu_per_byte
        replies = []
        for q, (f, b) in enumerate(zip(flows, sizes.tolist(), strict=True)):
            if cost > 0 and b > 0:
                reply = self.compute(b * cost, i, deps, q, ROUTE_THREADS, "serve")
                charge = self.compute(b * cost, i, deps, q, ROUTE_CORES, "serve-charge")
                self.serve_of[reply] = self.serve_of[charge] = f
                replies.append(reply)
        return flows + replies

    def gate(self, i: int, r: int) -> tuple[int, ...]:
        """What trainer ``r``'s sampling waits for: the end of iteration ``i`` (every
        trainer's parameters), or with an asynchronous PS its own parameters of ``i``."""
        if i < 0:
            return ()
        return (self.ready_of[r][i],) if self.asynchronous else (self.end[i],)

    def batch(self, i: int, r: int, gate: tuple[int, ...]) -> int:
        """Sampling, batch and feature flows, and training of trainer ``r``'s batch ``i``."""
        sc = self.sc
        t_task = self.np + r
        # sampler worker i mod ns of trainer r; the trainer samples itself if ns == 0
        s_task = self.np + self.nt + r * self.ns + i % self.ns if self.ns else t_task
        prev: tuple[int, ...] = (self.last_sample[s_task],) if s_task in self.last_sample else ()
        if s_task == t_task and t_task in self.last_train:
            # a trainer that samples for itself does one thing at a time (its compute is
            # serial, which the busiest-task bound counts on)
            prev += (self.last_train[t_task],)
        fetch = self.store_flows(sc.structure[i, r], s_task, i, gate + prev, "structure")
        sample = self.compute(
            float(sc.sample_s[i, r]), i, (*fetch, *gate, *prev), s_task, stage="sample"
        )
        self.busy[s_task] += float(sc.sample_s[i, r])
        self.last_sample[s_task] = sample
        inputs = [self.flow(float(sc.batch_bytes[i, r]), s_task, t_task, i, (sample,), "batch")]
        inputs += self.store_flows(sc.feature[i, r], t_task, i, (sample,), "feature")
        ready = self.params_ready[r]
        if ready is not None:
            inputs.append(ready)
        self.busy[t_task] += float(sc.compute_s[i, r])
        train = self.compute(float(sc.compute_s[i, r]), i, tuple(inputs), t_task, stage="train")
        self.last_train[t_task] = train
        return train

    def sync_ps(self, i: int, trains: list[int]) -> None:
        """Gradients to every PS shard, the update, parameters back to every trainer."""
        nps = len(self.sc.job.tasks) - self.ps0
        share = self.sc.grad_bytes / nps
        back: list[list[int]] = [[] for _ in range(self.nt)]
        for j in range(nps):
            ps = self.ps0 + j
            grads = tuple(
                self.flow(share, self.np + r, ps, i, (trains[r],), "gradient")
                for r in range(self.nt)
            )
            cost = float(self.sc.ps_update_s[i, j])
            upd = self.compute(cost, i, grads, self._ps_cpu(ps), stage="update", owner=ps)
            self.busy[ps] += cost
            for r in range(self.nt):
                back[r].append(self.flow(share, ps, self.np + r, i, (upd,), "parameters"))
        ready = [self.compute(0.0, i, tuple(back[r])) for r in range(self.nt)]
        self.params_ready = list(ready)
        self.end.append(self.compute(0.0, i, tuple(ready)))

    def _ps_cpu(self, ps: int) -> int:
        """The task whose CPU a PS update uses: the shard's own with CPU seconds, else
        none (a profile's wall time, as before)."""
        return ps if self.sc.cpu_seconds else -1

    def async_ps(self, i: int, trains: list[int], staleness: int) -> None:
        """Every push applied as it comes; trainer ``r``'s parameters of iteration ``i``
        once its own push is applied and every push of iteration ``i - staleness``."""
        nps = len(self.sc.job.tasks) - self.ps0
        share = self.sc.grad_bytes / nps
        back: list[list[int]] = [[] for _ in range(self.nt)]
        applied = []
        for j in range(nps):
            ps = self.ps0 + j
            cost = float(self.sc.ps_update_s[i, j]) / self.nt
            pushes = []
            for r in range(self.nt):
                grad = self.flow(share, self.np + r, ps, i, (trains[r],), "gradient")
                cpu = self._ps_cpu(ps)
                pushes.append(self.compute(cost, i, (grad,), cpu, stage="update", owner=ps))
                self.busy[ps] += cost
            applied.append(tuple(pushes))
            slowest = self.updates[i - staleness][j] if i >= staleness else ()
            for r in range(self.nt):
                deps = (pushes[r], *slowest)
                back[r].append(self.flow(share, ps, self.np + r, i, deps, "parameters"))
        self.updates.append(applied)
        ready = [self.compute(0.0, i, tuple(back[r])) for r in range(self.nt)]
        for r in range(self.nt):
            self.ready_of[r].append(ready[r])
        self.params_ready = list(ready)
        self.end.append(self.compute(0.0, i, tuple(ready)))

    def sync_allreduce(self, i: int, trains: list[int]) -> None:
        """After every trainer, one fluid ring flow r -> r+1 of 2(T-1)/T gradients each."""
        nt = self.nt
        allt = self.compute(0.0, i, tuple(trains))
        ring = 2 * (nt - 1) / nt * self.sc.grad_bytes
        flows = [
            self.flow(ring, self.np + r, self.np + (r + 1) % nt, i, (allt,), "allreduce")
            for r in range(nt)
        ]
        self.end.append(self.compute(0.0, i, (allt, *flows)))
        self.params_ready = [self.end[-1]] * nt

    def build(self) -> Template:
        n = len(self.dur)
        serve_of = np.full(n, -1, dtype=np.int64)
        for v, f in self.serve_of.items():
            serve_of[v] = f
        succ: list[list[int]] = [[] for _ in range(n)]
        for v, ps in enumerate(self.preds):
            for u in sorted(set(ps)):
                succ[u].append(v)
        ptr = np.zeros(n + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(s) for s in succ])
        return Template(
            num_tasks=len(self.busy),
            duration=np.asarray(self.dur, dtype=np.float64),
            size=np.asarray(self.size, dtype=np.float64),
            src_task=np.asarray(self.src, dtype=np.int64),
            dst_task=np.asarray(self.dst, dtype=np.int64),
            group=np.asarray(self.group, dtype=np.int64),
            iteration=np.asarray(self.it, dtype=np.float64),
            succ_ptr=ptr,
            succ_idx=np.asarray([w for s in succ for w in s], dtype=np.int64),
            npred=np.asarray([len(set(p)) for p in self.preds], dtype=np.int64),
            task_busy=tuple(self.busy),
            cpu_task=np.asarray(self.cpu_task, dtype=np.int64),
            serve_of=serve_of,
            cpu_route=np.asarray(self.cpu_route, dtype=np.int64),
            cpu_seconds=self.sc.cpu_seconds,
            threads=self.sc.threads,
            owner=np.asarray(self.owner, dtype=np.int64),
            stage=np.asarray(self.stage, dtype=np.int64),
        )
