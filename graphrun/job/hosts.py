"""The hosts file: where every machine of a job is and where its servers listen.

The launcher (or the Kubernetes operator) writes it before any role starts; every
worker and role reads it. It is graphrun's "ip config"::

    {"format": "graphrun-hosts", "version": 1,
     "machines": [{"name": "m0", "address": "127.0.0.1"}, ...],
     "endpoints": {"store:0": "127.0.0.1:41001", "store:0:1": "127.0.0.1:41002", ...},
     "rendezvous": "127.0.0.1:41100"}

``endpoints`` maps every listening role to ``host:port``; ``rendezvous`` is where the
trainers meet (``torch.distributed``): a TCP store on trainer 0's machine (Kubernetes),
or ``file:///RUN/rendezvous/<attempt>`` when every machine is on this host (the local
backend: nothing listens for it, only the job's user can reach it).
"""

from __future__ import annotations

import json
import random
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphrun.errors import SpecError
from graphrun.files import write_atomic
from graphrun.graph.format import read_json
from graphrun.names import RoleName

FORMAT = "graphrun-hosts"
VERSION = 1


@dataclass(frozen=True)
class Hosts:
    """Machine name -> address, listening role -> ``host:port``, and the rendezvous."""

    machines: Mapping[str, str]
    endpoints: Mapping[str, str] = field(default_factory=dict)
    rendezvous: str = ""

    def address(self, machine: str) -> str:
        try:
            return self.machines[machine]
        except KeyError:
            raise SpecError(f"hosts: no machine named {machine!r}") from None

    def endpoint(self, role: RoleName) -> tuple[str, int]:
        """``(host, port)`` of a listening role."""
        try:
            return split_endpoint(self.endpoints[str(role)])  # keyed as in the file
        except KeyError:
            raise SpecError(f"hosts: no endpoint for role {role!r}") from None

    def store_endpoints(self) -> dict[int, list[str]]:
        """Partition -> endpoints of its store servers (primary first, then its backups,
        then its replicas)."""
        out: dict[int, list[tuple[tuple[int, int], str]]] = {}
        for role, ep in self.endpoints.items():
            name = RoleName.parse(role)
            if name.kind == "store":
                out.setdefault(name.index, []).append(((name.replica, name.sub), ep))
        return {p: [ep for _, ep in sorted(v)] for p, v in sorted(out.items())}

    def replica_endpoints(self) -> dict[int, list[str]]:
        """Partition -> endpoints of its replicas (``store:P:r``), in replica order."""
        out: dict[int, list[tuple[int, str]]] = {}
        for role, ep in self.endpoints.items():
            name = RoleName.parse(role)
            if name.kind == "store" and name.replica:
                out.setdefault(name.index, []).append((name.replica, ep))
        return {p: [ep for _, ep in sorted(v)] for p, v in sorted(out.items())}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "machines": [{"name": n, "address": a} for n, a in self.machines.items()],
            "endpoints": dict(self.endpoints),
            "rendezvous": self.rendezvous,
        }

    def write(self, path: str | Path) -> Path:
        p = Path(path)
        write_atomic(p, json.dumps(self.to_dict(), indent=2) + "\n")
        return p

    @classmethod
    def from_dict(cls, data: Any, source: str = "<hosts>") -> Hosts:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise SpecError(f"{source}: field 'format' must be {FORMAT!r}")
        if data.get("version") != VERSION:
            raise SpecError(f"{source}: field 'version' is {data.get('version')!r}, not {VERSION}")
        try:
            machines = {str(m["name"]): str(m["address"]) for m in data["machines"]}
            endpoints = {str(k): str(v) for k, v in dict(data.get("endpoints", {})).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError(f"{source}: malformed 'machines' or 'endpoints' ({exc})") from None
        for role, ep in endpoints.items():
            try:
                RoleName.parse(role)
                split_endpoint(ep)
            except (SpecError, ValueError) as exc:
                raise SpecError(f"{source}: endpoints.{role}: {exc}") from None
        return cls(machines, endpoints, str(data.get("rendezvous", "")))

    @classmethod
    def read(cls, path: str | Path) -> Hosts:
        p = Path(path)
        return cls.from_dict(read_json(p, "the hosts file", SpecError), str(p))


def split_endpoint(ep: str) -> tuple[str, int]:
    host, sep, port = ep.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SpecError(f"{ep!r} is not host:port")
    return host, int(port)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports that are free on ``host`` right now, outside the kernel's
    ephemeral range: a port the kernel hands out for ``bind(0)`` is also one it hands to
    outgoing connections, so between this check and the server's bind any client on the
    machine could take it (a store failed with "Address already in use" that way)."""
    low, _ = _ephemeral_range()
    first = min(_PORTS_FROM, max(1024, low - 4096))
    picked: list[int] = []
    for port in random.sample(range(first, low), low - first):
        if len(picked) == n:
            break
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        picked.append(port)
    if len(picked) < n:
        raise SpecError(f"{host}: fewer than {n} free ports in [{first}, {low})")
    return picked


_PORTS_FROM = 20000


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux), or the IANA one elsewhere."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def tcp_ready(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
