"""The cluster model: machines with capacities and NIC bandwidths behind a non-blocking switch.

Cluster file (YAML)::

    apiVersion: graphrun.io/v1alpha1
    kind: Cluster
    machines:
      - name: m0            # unique; used in plans
        cpu: 32             # cores
        memory_gb: 256
        gpus: 1             # optional, default 0
        egress_gbps: 50     # NIC send bandwidth   } or `bandwidth_gbps: 50`
        ingress_gbps: 50    # NIC receive bandwidth} for both directions
      - {name: m1, cpu: 32, memory_gb: 256, bandwidth_gbps: 10}

At most ``MAX_MACHINES`` (1024) machines; cpu at most 1e5 cores, memory_gb 1e7, gpus
1e4, bandwidths 1e5 Gbit/s (finite numbers: ``.inf`` and ``.nan`` are refused).

Every switch port is non-blocking: a flow from ``a`` to ``b`` is limited only by the
egress port of ``a`` and the ingress port of ``b``. Bandwidths are in Gbit/s in the file
and in bytes/s in :class:`Cluster`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from graphrun.errors import SpecError
from graphrun.placement._io import read_yaml, validate
from graphrun.placement.job import MAX_CPU, MAX_GPUS, MAX_MEMORY_GB

GBPS = 1e9 / 8  # bytes/s in one Gbit/s
MAX_MACHINES = 1024  # machines of a cluster (the simulator keeps machines x tasks tables)
MAX_GBPS = 1e5  # a NIC's Gbit/s
API_VERSION = "graphrun.io/v1alpha1"


class MachineSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str = Field(min_length=1, max_length=253)
    cpu: float = Field(ge=0, le=MAX_CPU)
    memory_gb: float = Field(ge=0, le=MAX_MEMORY_GB)
    gpus: Annotated[int, Field(ge=0, le=MAX_GPUS)] = 0
    egress_gbps: Annotated[float, Field(gt=0, le=MAX_GBPS)] | None = None
    ingress_gbps: Annotated[float, Field(gt=0, le=MAX_GBPS)] | None = None
    bandwidth_gbps: Annotated[float, Field(gt=0, le=MAX_GBPS)] | None = None


class ClusterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    apiVersion: Literal["graphrun.io/v1alpha1"] = "graphrun.io/v1alpha1"
    kind: Literal["Cluster"] = "Cluster"
    machines: list[MachineSpec] = Field(min_length=1, max_length=MAX_MACHINES)


@dataclass(frozen=True)
class Cluster:
    """Machines by index; capacities per resource; NIC bandwidths in bytes/s."""

    names: tuple[str, ...]
    cpu: tuple[float, ...]
    memory_gb: tuple[float, ...]
    gpus: tuple[int, ...]
    egress: tuple[float, ...]
    ingress: tuple[float, ...]

    @property
    def size(self) -> int:
        return len(self.names)

    def capacity(self, resource: str) -> tuple[float, ...]:
        return {"cpu": self.cpu, "memory_gb": self.memory_gb, "gpus": self.gpus}[resource]


def cluster_from_spec(spec: ClusterSpec, where: str = "cluster") -> Cluster:
    names: list[str] = []
    egress: list[float] = []
    ingress: list[float] = []
    for i, m in enumerate(spec.machines):
        if m.name in names:
            raise SpecError(f"{where}: machines[{i}].name: {m.name!r} is used twice")
        names.append(m.name)
        for direction, value, out in (
            ("egress", m.egress_gbps, egress),
            ("ingress", m.ingress_gbps, ingress),
        ):
            gbps = value if value is not None else m.bandwidth_gbps
            if gbps is None:
                raise SpecError(
                    f"{where}: machines[{i}].{direction}_gbps: missing "
                    f"(give {direction}_gbps or bandwidth_gbps for machine {m.name!r})"
                )
            out.append(gbps * GBPS)
    return Cluster(
        names=tuple(names),
        cpu=tuple(m.cpu for m in spec.machines),
        memory_gb=tuple(m.memory_gb for m in spec.machines),
        gpus=tuple(m.gpus for m in spec.machines),
        egress=tuple(egress),
        ingress=tuple(ingress),
    )


def cluster_from_dict(data: Any, where: str = "cluster") -> Cluster:
    return cluster_from_spec(validate(ClusterSpec, data, where), where)


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate a cluster YAML file (see the module docstring)."""
    return cluster_from_dict(read_yaml(path), str(path))


def make_cluster(
    bandwidth_gbps: list[float],
    *,
    cpu: float = 32,
    memory_gb: float = 256,
    gpus: int = 1,
) -> Cluster:
    """A cluster of identical machines ``m0..`` except for their (symmetric) bandwidths."""
    spec = ClusterSpec(
        machines=[
            MachineSpec(name=f"m{i}", cpu=cpu, memory_gb=memory_gb, gpus=gpus, bandwidth_gbps=b)
            for i, b in enumerate(bandwidth_gbps)
        ]
    )
    return cluster_from_spec(spec)
