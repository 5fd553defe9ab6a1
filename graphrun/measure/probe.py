"""``graphrun probe``: measure a set of hosts and write the cluster file ``graphrun plan`` takes.

Nobody should have to guess NIC speeds. For every host: effective CPU cores and the time
of a fixed kernel (:mod:`graphrun.measure.host` ``cpu``), the memory its processes may use
(``memory``); for every ordered pair of hosts: the rate one sends to the other
(``sink``/``send``, 1 MiB writes for ``seconds``) and the latency (``echo``/``ping``).
A host's egress is the fastest it sent to anyone, its ingress the fastest it received
(one host alone is measured to itself). Every probe makes a fresh key
(:mod:`graphrun.measure.auth`) and hands it to both ends of every measurement in their
environment (``$GRAPHRUN_PROBE_KEY``, never on a command line), each measurement a step of
its own: the servers measure only the client that shows the key, for that step.

The result is a ``Cluster`` YAML (:mod:`graphrun.placement.cluster`) plus the raw
measurements (every pair's rate and latency) as JSON. Hosts are :class:`ProbeHost`
values — a name, an address and the command prefix that runs a program there — so the
same code measures network-namespace hosts here and any hosts reachable by a prefix.
:func:`assemble` turns measurements into the cluster file, whoever took them (the
Kubernetes probe's members report theirs in their pods' termination messages).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from graphrun.errors import HostError
from graphrun.measure.auth import KEY_ENV, new_key
from graphrun.measure.host import SERVE_SECONDS

GBIT = 1e9 / 8  # bytes per second in one Gbit/s


@dataclass(frozen=True)
class ProbeHost:
    name: str
    address: str
    prefix: tuple[str, ...] = ()  # runs argv on the host
    memory_prefix: tuple[str, ...] | None = None  # where its memory limit is visible


def _env(key: bytes | None) -> dict[str, str] | None:
    return None if key is None else os.environ | {KEY_ENV: key.hex()}


def _measure(
    prefix: Sequence[str], *args: str, python: str, timeout: float = 120,
    key: bytes | None = None,
) -> dict[str, Any]:  # fmt: skip
    cmd = [*prefix, python, "-m", "graphrun.measure.host", *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(key))
    except subprocess.TimeoutExpired:
        raise HostError(f"probe {args[0]}: no answer within {timeout:g}s") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        raise HostError(f"probe {args[0]} failed (exit code {out.returncode}): {last}")
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    if not isinstance(answer, dict):
        raise HostError(f"probe {args[0]}: answered {answer!r}, not a JSON object")
    return answer


def _pair(a: ProbeHost, b: ProbeHost, server: str, client: list[str], python: str,
          port: int, key: bytes, step: int) -> dict[str, Any]:  # fmt: skip
    """Run ``server`` on ``b`` and ``client`` on ``a`` against it, as measurement ``step``
    of the probe whose key is ``key``; the server's JSON and the client's."""
    where = ["--step", str(step)]
    cmd = [*b.prefix, python, "-m", "graphrun.measure.host", server, *where]
    srv = subprocess.Popen(
        [*cmd, "--bind", b.address, "--port", str(port), "--timeout", str(SERVE_SECONDS)],
        stdout=subprocess.PIPE, text=True, env=_env(key),
    )  # fmt: skip
    try:
        assert srv.stdout is not None
        if '"up"' not in srv.stdout.readline():
            raise HostError(f"probe {server} on {b.name}: did not start")
        to = ["--to", f"{b.address}:{port}"]
        client_out = _measure(a.prefix, *client, *to, *where, python=python, key=key)
        try:
            text = srv.communicate(timeout=SERVE_SECONDS)[0]
        except subprocess.TimeoutExpired:
            raise HostError(f"probe {server} on {b.name}: no answer") from None
        if srv.returncode != 0 or not text.strip():
            raise HostError(f"probe {server} on {b.name} failed (exit code {srv.returncode})")
        server_out = json.loads(text.strip().splitlines()[-1])
        return server_out | client_out
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


@dataclass(frozen=True)
class HostMeasure:
    """What one host measured of itself (:mod:`graphrun.measure.host` ``cpu``, ``memory``)."""

    name: str
    cores: float
    kernel_s: float
    memory_bytes: int


@dataclass(frozen=True)
class LinkMeasure:
    """What ``src`` measured sending to ``dst``: the steady rate and the one-way latency."""

    src: str
    dst: str
    bytes_per_s: float
    latency_s: float


def probe(
    hosts: Sequence[ProbeHost],
    seconds: float = 1.0,
    python: str = sys.executable,
    port: int = 5599,
) -> dict[str, Any]:
    """Measure ``hosts``; returns ``{"cluster": <Cluster YAML data>, "measured": {...}}``."""
    measured = []
    key = new_key()
    for h in hosts:
        cpu = _measure(h.prefix, "cpu", "--seconds", str(seconds), python=python)
        mem_prefix = h.prefix if h.memory_prefix is None else h.memory_prefix
        mem = _measure(mem_prefix, "memory", python=python)
        measured.append(HostMeasure(h.name, cpu["cores"], cpu["kernel_s"], mem["bytes"]))
    links: list[LinkMeasure] = []
    for a in hosts:
        for b in hosts:
            if a is b and len(hosts) > 1:
                continue
            step = 2 * len(links)
            send = ["send", "--seconds", str(seconds)]
            bw = _pair(a, b, "sink", send, python, port, key, step)
            lat = _pair(a, b, "echo", ["ping"], python, port + 1, key, step + 1)
            links.append(
                LinkMeasure(a.name, b.name, float(bw["bytes_per_s"]), float(lat["latency_s"]))
            )
    return assemble(measured, links)


def assemble(hosts: Sequence[HostMeasure], links: Sequence[LinkMeasure]) -> dict[str, Any]:
    """The Cluster YAML data and the raw measurements: ``{"cluster": ..., "measured": ...}``.

    A host's egress is the fastest it sent to anyone, its ingress the fastest it received
    (a host without links gets neither and the cluster file would be refused: give one
    link per host at least, a host alone measured to itself)."""
    measured: dict[str, Any] = {"hosts": {}, "pairs": {}}
    for h in hosts:
        measured["hosts"][h.name] = {
            "cores": h.cores, "kernel_s": h.kernel_s, "memory_bytes": h.memory_bytes
        }  # fmt: skip
    egress = {h.name: 0.0 for h in hosts}
    ingress = {h.name: 0.0 for h in hosts}
    for link in links:
        measured["pairs"][f"{link.src}->{link.dst}"] = {
            "gbps": round(link.bytes_per_s / GBIT, 4),
            "latency_ms": round(link.latency_s * 1e3, 3),
        }
        egress[link.src] = max(egress[link.src], link.bytes_per_s)
        ingress[link.dst] = max(ingress[link.dst], link.bytes_per_s)
    machines = []
    for h in hosts:
        entry: dict[str, Any] = {
            "name": h.name,
            "cpu": round(h.cores, 3),  # a 0.2-core host: 0.01 is 5%
            "memory_gb": round(h.memory_bytes / 2**30, 2),
        }
        entry["egress_gbps"] = round(egress[h.name] / GBIT, 4)
        entry["ingress_gbps"] = round(ingress[h.name] / GBIT, 4)
        machines.append(entry)
    cluster = {"apiVersion": "graphrun.io/v1alpha1", "kind": "Cluster", "machines": machines}
    return {"cluster": cluster, "measured": measured}
