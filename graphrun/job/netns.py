"""Network-namespace hosts: each machine of a local job gets its own network stack.

:class:`NetnsNetwork` creates, for machines ``m0 .. mN-1``:

* one namespace per machine, ``graphrun-<pid>-<tag>-<machine>``, with ``lo`` up and
  an interface ``eth0`` at ``10.<a>.<b>.<i+1>/24``;
* one switch namespace ``graphrun-<pid>-<tag>-sw`` holding a bridge ``br0``; every
  machine's ``eth0`` is one end of a veth pair whose other end (``p<i>``) is a port
  of the bridge. Nothing is created in the caller's own namespace, so the 10.x
  addresses are visible only inside these namespaces;
* optionally ``tc`` shaping on every ``eth0`` (token bucket at ``bandwidth_mbit``,
  ``netem`` delay of ``delay_ms``), so "machines" see a real link speed.

Roles run inside with ``ip netns exec NAME unshare --uts ...`` (:meth:`NetnsNetwork.prefix`):
every machine also gets its own host name (``graphrun-<machine>``), so the store
client's co-location check (same host name, boot id and shm device) treats only the
partitions of its own machine as local and reaches the others over the network.
Deleting a namespace deletes its interfaces; :meth:`NetnsNetwork.close` deletes
all of them, also after a partial setup, and :func:`cleanup_stale` removes those
left by a launcher that was killed (its pid no longer exists). Shared memory
(``/dev/shm``) and the file system stay shared, as on one host.

Needs root and iproute2; :func:`unavailable_reason` says why not otherwise.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from graphrun.errors import ArgumentError, HostError

PREFIX = "graphrun-"
NetnsError = HostError


def unavailable_reason() -> str | None:
    """Why network-namespace hosts cannot be used here, or ``None`` if they can."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root or use hosts: local)"
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns list` failed: {exc}"
    if out.returncode != 0:
        return f"`ip netns list` failed: {out.stderr.strip()}"
    return None


def _ip(*args: str, netns: str | None = None) -> None:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    _run(argv)


def _run(argv: Sequence[str]) -> None:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(argv)}: {exc}") from exc
    if out.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {out.stderr.strip()}")


def list_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def cleanup_stale() -> list[str]:
    """Delete graphrun namespaces whose launcher process is gone; returns their names."""
    removed = []
    for name in list_namespaces():
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            removed.append(name)
    return removed


@dataclass(frozen=True)
class NetnsHost:
    machine: str
    namespace: str
    address: str

    @property
    def hostname(self) -> str:
        return f"graphrun-{self.machine}"


class NetnsNetwork:
    """Namespaces + veth pairs + a bridge for a set of machines; a context manager."""

    def __init__(
        self,
        machines: Sequence[str],
        bandwidth_mbit: float | None = None,
        delay_ms: float | None = None,
        subnet: str = "10.77.0",
        own_hostnames: bool = True,
    ) -> None:
        if not machines or len(machines) > 250:
            raise ArgumentError(f"machines: need 1..250 machines, got {len(machines)}")
        if bandwidth_mbit is not None and bandwidth_mbit <= 0:
            raise ArgumentError(f"bandwidth_mbit: must be positive, got {bandwidth_mbit}")
        self.tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{self.tag}-sw"
        self.hosts = {
            m: NetnsHost(m, f"{self.tag}-{m}", f"{subnet}.{i + 1}") for i, m in enumerate(machines)
        }
        self.own_hostnames = own_hostnames and shutil.which("unshare") is not None
        self.bandwidth_mbit = bandwidth_mbit
        self.delay_ms = delay_ms
        self._created: list[str] = []

    def prefix(self, machine: str) -> tuple[str, ...]:
        """Command prefix that runs argv on ``machine``: its network namespace and its own
        host name (a UTS namespace), so co-location checks see separate hosts."""
        host = self.hosts[machine]
        netns = ("ip", "netns", "exec", host.namespace)
        if not self.own_hostnames:
            return netns
        return (*netns, "unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"',
                host.hostname)  # fmt: skip

    def address(self, machine: str) -> str:
        return self.hosts[machine].address

    def open(self) -> NetnsNetwork:
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsError(f"network-namespace hosts unavailable: {reason}")
        try:
            self._add(self.switch)
            _ip("link", "set", "lo", "up", netns=self.switch)
            _ip("link", "add", "br0", "type", "bridge", netns=self.switch)
            _ip("link", "set", "br0", "up", netns=self.switch)
            for i, host in enumerate(self.hosts.values()):
                self._add_host(i, host)
        except BaseException:
            self.close()
            raise
        return self

    def _add(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._created.append(name)

    def _add_host(self, i: int, host: NetnsHost) -> None:
        ns, port = host.namespace, f"p{i}"
        self._add(ns)
        _ip("link", "set", "lo", "up", netns=ns)
        _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port,
            "netns", self.switch)  # fmt: skip
        _ip("link", "set", port, "master", "br0", netns=self.switch)
        _ip("link", "set", port, "up", netns=self.switch)
        _ip("addr", "add", f"{host.address}/24", "dev", "eth0", netns=ns)
        _ip("link", "set", "eth0", "up", netns=ns)
        if self.bandwidth_mbit is not None or self.delay_ms is not None:
            self._shape(ns)

    def _shape(self, ns: str) -> None:
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0"]
        if self.delay_ms is not None:
            _run([*tc, "root", "handle", "1:", "netem", "delay", f"{self.delay_ms}ms"])
            parent = ["parent", "1:1", "handle", "10:"]
        else:
            parent = ["root", "handle", "10:"]
        if self.bandwidth_mbit is not None:
            rate = f"{self.bandwidth_mbit}mbit"
            burst = max(32, int(self.bandwidth_mbit * 1000 / 8 / 100))  # ~10 ms of traffic, kB
            _run([*tc, *parent, "tbf", "rate", rate, "burst", f"{burst}kb", "latency", "100ms"])

    def close(self) -> None:
        for name in reversed(self._created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        self._created.clear()

    def __enter__(self) -> NetnsNetwork:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
