"""The hosts file: where every machine of a job is and where its servers listen.

The launcher (or the Kubernetes operator) writes it before any role starts; every
worker and role reads it. It is graphrun's "ip config"::

    {"format": "graphrun-hosts", "version": 1,
     "machines": [{"name": "m0", "address": "127.0.0.1"}, ...],  # + "slots", "gpus"
     "endpoints": {"store:0": "127.0.0.1:41001", "store:0:1": "127.0.0.1:41002", ...},
     "rendezvous": "127.0.0.1:41100"}               # + "rendezvous_external": true

``endpoints`` maps every listening role to ``host:port``; ``rendezvous`` is where the
trainers meet (``torch.distributed``): a TCP store on trainer 0's machine (Kubernetes),
or ``file:///RUN/rendezvous/<attempt>`` when every machine is on this host (the local
backend: nothing listens for it, only the job's user can reach it).
``rendezvous_external`` (written only when true): a ``graphrun rendezvous`` process
serves that TCP store apart (the operator's ``<job>-rendezvous`` pod of an elastic job),
so no trainer serves it and trainer 0 joins it like the others.
"""

from __future__ import annotations

import random
import socket
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from graphrun.errors import SpecError
from graphrun.files import read_json
from graphrun.names import MAIN_TRAINER, PLACED, ROLE_GRAMMAR, Endpoint, RoleName
from graphrun.wire import convert_json, write_json

FORMAT = "graphrun-hosts"
VERSION = 1


class Machine(msgspec.Struct, frozen=True, omit_defaults=True):
    """One machine of the hosts file."""

    name: str
    address: str
    slots: int | None = None  # trainers it runs, as an MPI hostfile's (the operator's)
    gpus: int | None = None  # its GPUs, when the job uses them (the operator's)


class Hosts(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The hosts file: machines in order, listening role -> ``host:port``, and the
    rendezvous (see the module docstring; :func:`build_hosts` makes one). ``format``
    and ``version`` have no default, so they are always written."""

    format: str
    version: int
    machines: tuple[Machine, ...]
    endpoints: dict[RoleName, Endpoint] = {}
    rendezvous: str = ""
    rendezvous_external: bool = False

    def __post_init__(self) -> None:
        if self.format != FORMAT:
            raise ValueError(f"field 'format' must be {FORMAT!r}")
        if self.version != VERSION:
            raise ValueError(f"field 'version' is {self.version!r}, not {VERSION}")
        if self.rendezvous_external and ("://" in self.rendezvous or ":" not in self.rendezvous):
            raise ValueError(
                f"field 'rendezvous_external': true needs a host:port rendezvous served "
                f"apart, not {self.rendezvous!r}"
            )
        for role, ep in self.endpoints.items():  # read once, by Hosts.read: typed here
            if not isinstance(role, RoleName) or role.kind not in PLACED:
                raise ValueError(f"endpoints: {str(role)!r} is not a placed role ({ROLE_GRAMMAR})")
            if not isinstance(ep, Endpoint):
                raise ValueError(f"endpoints.{role}: {ep!r} is not an Endpoint")

    @property
    def addresses(self) -> dict[str, str]:
        """Machine name -> address, in machine order."""
        return {m.name: m.address for m in self.machines}

    def address(self, machine: str) -> str:
        try:
            return self.addresses[machine]
        except KeyError:
            raise SpecError(f"hosts: no machine named {machine!r}") from None

    def endpoint(self, role: RoleName) -> tuple[str, int]:
        """``(host, port)`` of a listening role."""
        try:
            ep = self.endpoints[role]
        except KeyError:
            raise SpecError(f"hosts: no endpoint for role {role!r}") from None
        return ep.host, ep.port

    def store_endpoints(self) -> dict[int, list[Endpoint]]:
        """Partition -> endpoints of its store servers (primary first, then its backups,
        then its replicas)."""
        out: dict[int, list[tuple[tuple[int, int], Endpoint]]] = {}
        for name, ep in self.endpoints.items():
            if name.kind == "store":
                out.setdefault(name.index, []).append(((name.replica, name.sub), ep))
        return {p: [ep for _, ep in sorted(v)] for p, v in sorted(out.items())}

    def replica_endpoints(self) -> dict[int, list[Endpoint]]:
        """Partition -> endpoints of its replicas (``store:P:r``), in replica order."""
        out: dict[int, list[tuple[int, Endpoint]]] = {}
        for name, ep in self.endpoints.items():
            if name.kind == "store" and name.replica:
                out.setdefault(name.index, []).append((name.replica, ep))
        return {p: [ep for _, ep in sorted(v)] for p, v in sorted(out.items())}

    def probes(self) -> dict[str, Endpoint]:
        """Machine -> the endpoint of one store server on it (the first by role), for a
        reachability probe (an elastic trainer's, docs/elastic.md); machines without a
        store server are left out, and so are machines that share their address (local
        hosts: every machine is 127.0.0.1, so an endpoint found by address may be another
        machine's; probing m2 at m0's store server made the survivors of a lost m0 each
        think itself cut off, and the job restarted instead of going on)."""
        out: dict[str, Endpoint] = {}
        uses = Counter(m.address for m in self.machines)
        for m in (m for m in self.machines if uses[m.address] == 1):
            for role, ep in sorted(self.endpoints.items(), key=lambda kv: str(kv[0])):
                if role.kind == "store" and ep.host == m.address:
                    out[m.name] = ep
                    break
        return out

    def write(self, path: str | Path) -> Path:
        return write_json(path, self)

    @classmethod
    def read(cls, path: str | Path) -> Hosts:
        data = read_json(Path(path), "the hosts file", SpecError)
        return convert_json(cls, data, str(path))


def build_hosts(
    address: Mapping[str, str],
    placement: Mapping[RoleName, str],
    listening: Sequence[RoleName],
    ports: Sequence[int],
    store: Sequence[str] = (),
    slots: bool = False,
    gpus: int = 0,
    rendezvous: str | None = None,
) -> Hosts:
    """The hosts file of a job, for either backend.

    ``address``: machine -> address, in machine order; ``placement``: role -> machine;
    ``listening``: the roles that listen, each on the port at its index in ``ports``,
    whose next port is the rendezvous's, on trainer 0's machine (the first machine
    without one). ``store``: the addresses of a running store's servers, which serve
    the job in place of its own. ``slots``: write each machine's trainer count (and
    ``gpus``, when not 0)."""
    endpoints = {r: Endpoint(address[placement[r]], ports[i]) for i, r in enumerate(listening)}
    for part, a in enumerate(store):
        endpoints[RoleName.store(part)] = Endpoint.parse(a.removeprefix("tcp://"))
    trainers = Counter(m for r, m in placement.items() if r.kind == "trainer")
    machines = tuple(
        Machine(m, a, trainers[m] if slots else None, gpus if slots and gpus else None)
        for m, a in address.items()
    )
    rdv = rendezvous or address[placement.get(MAIN_TRAINER, next(iter(address)))]
    return Hosts(
        format=FORMAT, version=VERSION, machines=machines, endpoints=endpoints,
        rendezvous=f"{rdv}:{ports[len(listening)]}", rendezvous_external=rendezvous is not None,
    )  # fmt: skip


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
