"""The DAG builder graphrun shipped before the placement template: it unrolled the
job for one placement with the validating ``DagBuilder``, merging store flows by
machine as it went. The oracle ``workload.make_template(...).place`` is checked
against (same makespans under every policy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.placement.cluster import Cluster
from graphrun.placement.dag import Dag, DagBuilder
from graphrun.placement.workload import Scenario


def _grouped(bytes_from: np.ndarray, machine_of: list[int]) -> dict[int, float]:
    out: dict[int, float] = {}
    for q, b in enumerate(bytes_from.tolist()):
        m = machine_of[q]
        out[m] = out.get(m, 0.0) + b
    return out


def build_workload(cluster: Cluster, sc: Scenario, placement: Sequence[int]) -> Dag:
    """The DAG of ``sc.iterations`` iterations of the job placed by ``placement``.

    ``placement[i]`` is the machine index of task ``i`` (in ``job.tasks`` order).
    """
    job = sc.job
    if len(placement) != len(job.tasks):
        raise ArgumentError(f"placement: {len(placement)} entries for {len(job.tasks)} tasks")
    if any(not 0 <= m < cluster.size for m in placement):
        raise ArgumentError("placement: a machine index is out of range")
    u = _Unroll(sc, [int(m) for m in placement], DagBuilder(cluster.egress, cluster.ingress))
    prefetch = job.spec.prefetch
    for i in range(sc.iterations):
        gate = (u.end[i - prefetch - 1],) if i - prefetch - 1 >= 0 else ()
        trains = [u.batch(i, r, gate) for r in range(job.spec.trainers)]
        if job.spec.sync == "ps":
            u.sync_ps(i, trains)
        else:
            u.sync_allreduce(i, trains)
    return u.b.build()


class _Unroll:
    """The state of :func:`build_workload` while it unrolls iterations."""

    def __init__(self, sc: Scenario, pl: list[int], b: DagBuilder) -> None:
        spec = sc.job.spec
        self.sc, self.pl, self.b = sc, pl, b
        self.nt, self.np, self.ns = spec.trainers, spec.partitions, spec.samplers_per_trainer
        self.store_m = pl[: self.np]
        self.trainer_m = pl[self.np : self.np + self.nt]
        self.ps0 = self.np + self.nt + self.nt * self.ns  # index of ps:0
        self.busy = [0.0] * len(pl)
        self.end: list[int] = []  # per iteration: parameters delivered everywhere
        self.last_sample: dict[int, int] = {}  # sampler task -> its latest sample step
        self.last_train: dict[int, int] = {}  # trainer index -> its latest training step
        self.params_ready: list[int | None] = [None] * self.nt

    def batch(self, i: int, r: int, gate: tuple[int, ...]) -> int:
        """Sampling, batch and feature flows, and training of trainer ``r``'s batch ``i``."""
        sc, b = self.sc, self.b
        mt = self.trainer_m[r]
        # sampler worker i mod ns of trainer r; the trainer samples itself if ns == 0
        s_task = self.np + self.nt + r * self.ns + i % self.ns if self.ns else self.np + r
        ms = self.pl[s_task]
        prev = (self.last_sample[s_task],) if s_task in self.last_sample else ()
        if s_task == self.np + r and r in self.last_train:
            prev += (self.last_train[r],)  # a self-sampling trainer does one thing at a time
        fetch = [
            b.flow(v, src, ms, i, gate + prev)
            for src, v in _grouped(sc.structure[i, r], self.store_m).items()
        ]
        sample = b.compute(float(sc.sample_s[i, r]), i, (*fetch, *gate, *prev))
        self.busy[s_task] += float(sc.sample_s[i, r])
        self.last_sample[s_task] = sample
        inputs = [b.flow(float(sc.batch_bytes[i, r]), ms, mt, i, (sample,))]
        inputs += [
            b.flow(v, src, mt, i, (sample,))
            for src, v in _grouped(sc.feature[i, r], self.store_m).items()
        ]
        ready = self.params_ready[r]
        if ready is not None:
            inputs.append(ready)
        self.busy[self.np + r] += float(sc.compute_s[i, r])
        train = b.compute(float(sc.compute_s[i, r]), i, tuple(inputs))
        self.last_train[r] = train
        return train

    def sync_ps(self, i: int, trains: list[int]) -> None:
        """Gradients to every PS shard, the update, parameters back to every trainer."""
        b, tm = self.b, self.trainer_m
        ps_m = self.pl[self.ps0 :]
        share = self.sc.grad_bytes / len(ps_m)
        back: list[list[int]] = [[] for _ in range(self.nt)]
        for j, mp in enumerate(ps_m):
            grads = tuple(b.flow(share, tm[r], mp, i, (trains[r],)) for r in range(self.nt))
            upd = b.compute(float(self.sc.ps_update_s[i, j]), i, grads)
            self.busy[self.ps0 + j] += float(self.sc.ps_update_s[i, j])
            for r in range(self.nt):
                back[r].append(b.flow(share, mp, tm[r], i, (upd,)))
        ready = [b.compute(0.0, i, tuple(back[r])) for r in range(self.nt)]
        self.params_ready = list(ready)
        self.end.append(b.compute(0.0, i, tuple(ready)))

    def sync_allreduce(self, i: int, trains: list[int]) -> None:
        """After every trainer, one fluid ring flow r -> r+1 of 2(T-1)/T gradients each."""
        b, tm, nt = self.b, self.trainer_m, self.nt
        allt = b.compute(0.0, i, tuple(trains))
        ring = 2 * (nt - 1) / nt * self.sc.grad_bytes
        flows = [b.flow(ring, tm[r], tm[(r + 1) % nt], i, (allt,)) for r in range(nt)]
        self.end.append(b.compute(0.0, i, (allt, *flows)))
        self.params_ready = [self.end[-1]] * nt
