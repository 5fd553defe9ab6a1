"""The simulator's input: a DAG of compute steps and network flows over NIC ports.

A :class:`Dag` is what the OES simulator runs. Every node is either

* a **compute** step of a fixed duration (seconds) — each task computes one step at a
  time, expressed by DAG edges between its consecutive steps, so compute never
  contends (capacity is a placement constraint, see :mod:`graphrun.placement.cost`);
* a **flow** of ``size`` bytes from machine ``src`` to machine ``dst``: it uses the
  egress port of ``src`` (port ``src``) and the ingress port of ``dst`` (port
  ``M + dst``) of a non-blocking switch. A flow between tasks on one machine is free
  and is stored as a zero-duration compute step.

A node starts when all its predecessors have finished. ``iteration`` is the training
iteration the node belongs to; the priority policy serves older iterations first.
:class:`DagBuilder` is the mutable helper that produces the frozen :class:`Dag`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphrun.errors import ArgumentError

COMPUTE = 0
FLOW = 1


@dataclass(frozen=True)
class Dag:
    """A frozen DAG of compute steps and flows (see the module docstring)."""

    num_machines: int
    port_capacity: tuple[float, ...]  # bytes/s; ports 0..M-1 egress, M..2M-1 ingress
    kind: tuple[int, ...]
    duration: tuple[float, ...]  # compute seconds (0 for flows)
    size: tuple[float, ...]  # flow bytes (0 for compute)
    src_port: tuple[int, ...]  # -1 for compute
    dst_port: tuple[int, ...]  # -1 for compute
    iteration: tuple[int, ...]
    succ: tuple[tuple[int, ...], ...]
    npred: tuple[int, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.kind)

    def flows(self) -> list[int]:
        return [v for v, k in enumerate(self.kind) if k == FLOW]

    def port_bytes(self) -> np.ndarray:
        """Bytes crossing each port over the whole DAG."""
        out = np.zeros(2 * self.num_machines)
        for v in self.flows():
            out[self.src_port[v]] += self.size[v]
            out[self.dst_port[v]] += self.size[v]
        return out


@dataclass
class DagBuilder:
    """Collects nodes and edges, then :meth:`build` freezes them into a :class:`Dag`."""

    egress: tuple[float, ...]  # bytes/s per machine
    ingress: tuple[float, ...]
    kind: list[int] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    size: list[float] = field(default_factory=list)
    src_port: list[int] = field(default_factory=list)
    dst_port: list[int] = field(default_factory=list)
    iteration: list[int] = field(default_factory=list)
    preds: list[tuple[int, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.egress) != len(self.ingress):
            raise ArgumentError("DagBuilder: egress and ingress need one entry per machine")
        if any(b <= 0 for b in (*self.egress, *self.ingress)):
            raise ArgumentError("DagBuilder: port bandwidths must be > 0")

    def _add(
        self, kind: int, dur: float, size: float, s: int, d: int, it: int, deps: tuple[int, ...]
    ) -> int:
        deps = tuple(sorted({int(x) for x in deps}))
        n = len(self.kind)
        if any(x < 0 or x >= n for x in deps):
            raise ArgumentError(f"DagBuilder: node {n} depends on an unknown node")
        self.kind.append(kind)
        self.duration.append(float(dur))
        self.size.append(float(size))
        self.src_port.append(s)
        self.dst_port.append(d)
        self.iteration.append(int(it))
        self.preds.append(deps)
        return n

    def compute(self, duration: float, iteration: int = 0, deps: tuple[int, ...] = ()) -> int:
        if duration < 0:
            raise ArgumentError(f"DagBuilder: compute duration {duration} < 0")
        return self._add(COMPUTE, duration, 0.0, -1, -1, iteration, deps)

    def flow(
        self, size: float, src: int, dst: int, iteration: int = 0, deps: tuple[int, ...] = ()
    ) -> int:
        """A flow of ``size`` bytes from machine ``src`` to machine ``dst``."""
        if size < 0:
            raise ArgumentError(f"DagBuilder: flow size {size} < 0")
        m = len(self.egress)
        if not (0 <= src < m and 0 <= dst < m):
            raise ArgumentError(f"DagBuilder: flow {src}->{dst} names an unknown machine")
        if src == dst or size == 0:
            return self._add(COMPUTE, 0.0, 0.0, -1, -1, iteration, deps)
        return self._add(FLOW, 0.0, size, src, m + dst, iteration, deps)

    def build(self) -> Dag:
        n = len(self.kind)
        succ: list[list[int]] = [[] for _ in range(n)]
        for v, ps in enumerate(self.preds):
            for u in ps:
                succ[u].append(v)
        return Dag(
            num_machines=len(self.egress),
            port_capacity=(*map(float, self.egress), *map(float, self.ingress)),
            kind=tuple(self.kind),
            duration=tuple(self.duration),
            size=tuple(self.size),
            src_port=tuple(self.src_port),
            dst_port=tuple(self.dst_port),
            iteration=tuple(self.iteration),
            succ=tuple(tuple(s) for s in succ),
            npred=tuple(len(p) for p in self.preds),
        )
