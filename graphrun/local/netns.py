"""Network-namespace hosts: each machine of a local job gets its own network stack.

:class:`NetnsNetwork` creates, for machines ``m0 .. mN-1``:

* one namespace per machine, ``graphrun-<pid>-<tag>-<machine>``, with ``lo`` up and
  an interface ``eth0`` at ``10.<a>.<b>.<i+1>/24``;
* one switch namespace ``graphrun-<pid>-<tag>-sw`` holding a bridge ``br0``; every
  machine's ``eth0`` is one end of a veth pair whose other end (``p<i>``) is a port
  of the bridge. Nothing is created in the caller's own namespace, so the 10.x
  addresses are visible only inside these namespaces;
* optionally ``tc`` shaping on every ``eth0`` (token bucket at ``bandwidth_mbit``,
  ``netem`` delay of ``delay_ms``), so "machines" see a real link speed;
* optionally a :class:`HostShape` per machine — heterogeneous hosts on one machine: its
  own link rate and delay (``tc`` on its ``eth0``: what it sends), its own CPU share (a
  cgroup v1 ``cpu`` group with a CFS quota of ``cpus`` cores, weighted far above the
  box's other processes so that it gets its quota on a loaded box) and its own memory limit (a
  cgroup v1 ``memory`` group: a host that overfills is OOM-killed there, as a real one
  would be). :func:`shapes_from_cluster` reads them from a placement cluster file (the
  one ``graphrun plan`` takes), so a plan can be tried on the hosts it was made for.

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

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from graphrun.errors import ArgumentError, HostError, SpecError

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


def _remove_cgroup(group: Path, timeout_s: float = 5.0) -> None:
    """Remove a host's cgroup once its processes are gone (killing what is left)."""
    import signal
    import time

    deadline = time.monotonic() + timeout_s
    while group.is_dir():
        try:
            group.rmdir()
            return
        except OSError:
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


def cleanup_stale() -> list[str]:
    """Delete graphrun namespaces (and host cgroups) whose launcher process is gone;
    returns their names."""
    for controller in ("cpu", "memory"):
        with contextlib.suppress(HostError, OSError):
            for group in _own_cgroup(controller).glob(f"{PREFIX}*"):
                pid = group.name[len(PREFIX) :].split("-", 1)[0]
                if pid.isdigit() and not psutil.pid_exists(int(pid)):
                    _remove_cgroup(group)
    removed = []
    for name in list_namespaces():
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            removed.append(name)
    return removed


CGROUP_ROOT = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 100_000
# the weight of a host's cpu group against everything else on the box (cgroup v1's
# maximum; a process of the root group weighs 1024): the quota caps what the host gets,
# the weight makes sure it gets that much while other work loads the cores, as a real
# host of that size would. At the default 1024 a host group weighed as much as one other
# busy process: on a loaded 2-core box a 0.6-CPU host got 0.35-0.45 (benchmarks/README.md)
CPU_SHARES = 262_144


@dataclass(frozen=True)
class HostShape:
    """What one emulated host may use; ``None`` leaves that resource unlimited."""

    cpus: float | None = None  # cores (CFS quota), e.g. 0.2
    memory_bytes: int | None = None
    bandwidth_mbit: float | None = None  # what the host sends
    delay_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("cpus", "memory_bytes", "bandwidth_mbit", "delay_ms"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int | float) and v > 0 and v < float("inf")):
                raise ArgumentError(f"{name}: must be a positive finite number, got {v!r}")


def shapes_from_cluster(path: str | Path, machines: Sequence[str]) -> dict[str, HostShape]:
    """The :class:`HostShape` of every machine from a placement cluster YAML file.

    ``cpu`` becomes the CPU share, ``memory_gb`` the memory limit and ``egress_gbps`` (or
    ``bandwidth_gbps``) the link rate; the file must name exactly the job's machines.
    """
    from graphrun.placement.cluster import load_cluster

    cluster = load_cluster(path)
    if sorted(cluster.names) != sorted(machines):
        raise SpecError(
            f"{path}: machines: {', '.join(cluster.names)} are not the job's machines "
            f"{', '.join(machines)} (name them in runtime.machineNames)"
        )
    out = {}
    for i, name in enumerate(cluster.names):
        out[name] = HostShape(
            cpus=cluster.cpu[i] or None,
            memory_bytes=int(cluster.memory_gb[i] * 2**30) or None,
            bandwidth_mbit=cluster.egress[i] * 8 / 1e6,
        )
    return out


def _own_cgroup(controller: str) -> Path:
    """This process's cgroup directory of a v1 ``controller`` (new groups go below it)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return CGROUP_ROOT / controller / path.lstrip("/")
    raise HostError(f"cgroup v1 controller {controller!r} is not mounted at {CGROUP_ROOT}")


@dataclass(frozen=True)
class HostMemory:
    """What a host with a memory limit used, as its cgroup counts it: the most it held at
    once (processes, their shared memory and the page cache they filled), its limit, and
    how often it reached that limit (the kernel took back page cache, or OOM-killed)."""

    peak_bytes: int
    limit_bytes: int
    at_limit: int  # memory.failcnt

    def __str__(self) -> str:
        mib = 2**20
        text = f"{self.peak_bytes / mib:,.0f} of {self.limit_bytes / mib:,.0f} MiB"
        return text + (f" (at its limit {self.at_limit:,} times)" if self.at_limit else "")


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
        shapes: Mapping[str, HostShape] | None = None,
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
        unknown = set(shapes or {}) - set(machines)
        if unknown:
            raise ArgumentError(f"shapes: no machine {sorted(unknown)[0]!r}")
        self.shapes = {m: (shapes or {}).get(m, HostShape()) for m in machines}
        self._created: list[str] = []
        self._cgroups: dict[str, list[Path]] = {m: [] for m in machines}

    def prefix(self, machine: str) -> tuple[str, ...]:
        """Command prefix that runs argv on ``machine``: its network namespace and its own
        host name (a UTS namespace), so co-location checks see separate hosts."""
        host = self.hosts[machine]
        # the host's cgroups are joined before `ip netns exec`, which mounts a /sys of the
        # namespace's own (without the cgroup file systems); children inherit them
        netns = (*self.cgroup_prefix(machine), "ip", "netns", "exec", host.namespace)
        if not self.own_hostnames:
            return netns
        return (*netns, "unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"',
                host.hostname)  # fmt: skip

    def cgroup_prefix(self, machine: str) -> tuple[str, ...]:
        """Command prefix that runs argv in ``machine``'s cgroups only (this host's network
        and file systems): what the host may use can be read from there."""
        join = "".join(f"echo $$ > {g}/cgroup.procs && " for g in self._cgroups[machine])
        return ("sh", "-c", f'{join}exec "$@"', "sh") if join else ()

    def address(self, machine: str) -> str:
        return self.hosts[machine].address

    def open(self) -> NetnsNetwork:
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsError(f"network-namespace hosts unavailable: {reason}")
        cleanup_stale()  # those of launchers killed before their close (never called before)
        try:
            self._add(self.switch)
            _ip("link", "set", "lo", "up", netns=self.switch)
            _ip("link", "add", "br0", "type", "bridge", netns=self.switch)
            _ip("link", "set", "br0", "up", netns=self.switch)
            for i, host in enumerate(self.hosts.values()):
                self._add_host(i, host)
                self._add_cgroups(host)
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
        shape = self.shapes[host.machine]
        rate = shape.bandwidth_mbit or self.bandwidth_mbit
        delay = shape.delay_ms or self.delay_ms
        if rate is not None or delay is not None:
            self._shape(ns, rate, delay)

    def _shape(self, ns: str, rate_mbit: float | None, delay_ms: float | None) -> None:
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0"]
        if delay_ms is not None:
            _run([*tc, "root", "handle", "1:", "netem", "delay", f"{delay_ms}ms"])
            parent = ["parent", "1:1", "handle", "10:"]
        else:
            parent = ["root", "handle", "10:"]
        if rate_mbit is not None:
            burst = max(32, int(rate_mbit * 1000 / 8 / 100))  # ~10 ms of traffic, kB
            _run([*tc, *parent, "tbf", "rate", f"{rate_mbit}mbit", "burst", f"{burst}kb",
                  "latency", "100ms"])  # fmt: skip

    def _add_cgroups(self, host: NetnsHost) -> None:
        """A cpu and a memory cgroup for the host, when its shape limits them."""
        shape = self.shapes[host.machine]
        limits = {
            "cpu": {"cpu.cfs_period_us": CFS_PERIOD_US,
                    "cpu.cfs_quota_us": int(shape.cpus * CFS_PERIOD_US),
                    "cpu.shares": CPU_SHARES} if shape.cpus else None,
            "memory": {"memory.limit_in_bytes": shape.memory_bytes}
            if shape.memory_bytes else None,
        }  # fmt: skip
        for controller, files in limits.items():
            if files is None:
                continue
            group = _own_cgroup(controller) / host.namespace
            try:
                group.mkdir()
                self._cgroups[host.machine].append(group)
                for name, value in files.items():
                    (group / name).write_text(f"{value}\n")
            except OSError as exc:
                raise HostError(
                    f"{group}: cannot set up the host's {controller} limit ({exc})"
                ) from exc

    def memory_used(self) -> dict[str, HostMemory]:
        """Every host with a memory limit: what it used so far (read before :meth:`close`,
        which removes the cgroups; the hosts' processes cannot read them, ``ip netns exec``
        gives them a /sys without the cgroup file systems)."""
        out = {}
        for machine, groups in self._cgroups.items():
            for g in groups:  # its memory group, if it has one (the cpu group has no such files)
                try:
                    peak, limit, failed = (
                        int((g / f"memory.{name}").read_text())
                        for name in ("max_usage_in_bytes", "limit_in_bytes", "failcnt")
                    )
                except (OSError, ValueError):
                    continue
                out[machine] = HostMemory(peak, limit, failed)
        return out

    def _remove_cgroups(self) -> None:
        for groups in self._cgroups.values():
            for g in groups:
                _remove_cgroup(g)
            groups.clear()

    def close(self) -> None:
        for name in reversed(self._created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        self._created.clear()
        self._remove_cgroups()

    def __enter__(self) -> NetnsNetwork:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
