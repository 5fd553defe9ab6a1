"""``graphrun probe``: measure a set of hosts and write the cluster file ``graphrun plan`` takes.

Nobody should have to guess NIC speeds. For every host: effective CPU cores and the time
of a fixed kernel (:mod:`graphrun.job.measure` ``cpu``), the memory its processes may use
(``memory``); for every ordered pair of hosts: the rate one sends to the other
(``sink``/``send``, 1 MiB writes for ``seconds``) and the latency (``echo``/``ping``).
A host's egress is the fastest it sent to anyone, its ingress the fastest it received
(one host alone is measured to itself).

The result is a ``Cluster`` YAML (:mod:`graphrun.placement.cluster`) plus the raw
measurements (every pair's rate and latency) as JSON. Hosts are :class:`ProbeHost`
values — a name, an address and the command prefix that runs a program there — so the
same code measures network-namespace hosts here and any hosts reachable by a prefix.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from graphrun.errors import HostError

GBIT = 1e9 / 8  # bytes per second in one Gbit/s


@dataclass(frozen=True)
class ProbeHost:
    name: str
    address: str
    prefix: tuple[str, ...] = ()  # runs argv on the host
    memory_prefix: tuple[str, ...] | None = None  # where its memory limit is visible


def _measure(prefix: Sequence[str], *args: str, python: str, timeout: float = 120) -> Any:
    cmd = [*prefix, python, "-m", "graphrun.job.measure", *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise HostError(f"probe {args[0]}: no answer within {timeout:g}s") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        raise HostError(f"probe {args[0]} failed (exit code {out.returncode}): {last}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pair(a: ProbeHost, b: ProbeHost, server: str, client: list[str], python: str,
          port: int) -> Any:  # fmt: skip
    """Run ``server`` on ``b`` and ``client`` on ``a`` against it; the server's JSON."""
    cmd = [*b.prefix, python, "-m", "graphrun.job.measure", server]
    srv = subprocess.Popen(
        [*cmd, "--bind", b.address, "--port", str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert srv.stdout is not None
        if '"up"' not in srv.stdout.readline():
            raise HostError(f"probe {server} on {b.name}: did not start")
        client_out = _measure(a.prefix, *client, "--to", f"{b.address}:{port}", python=python)
        server_out = json.loads(srv.communicate(timeout=60)[0].strip().splitlines()[-1])
        return server_out | client_out
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


def probe(
    hosts: Sequence[ProbeHost],
    seconds: float = 1.0,
    python: str = sys.executable,
    port: int = 5599,
) -> dict[str, Any]:
    """Measure ``hosts``; returns ``{"cluster": <Cluster YAML data>, "measured": {...}}``."""
    measured: dict[str, Any] = {"hosts": {}, "pairs": {}}
    for h in hosts:
        cpu = _measure(h.prefix, "cpu", "--seconds", str(seconds), python=python)
        mem_prefix = h.prefix if h.memory_prefix is None else h.memory_prefix
        mem = _measure(mem_prefix, "memory", python=python)
        measured["hosts"][h.name] = {**cpu, "memory_bytes": mem["bytes"]}
    egress = {h.name: 0.0 for h in hosts}
    ingress = {h.name: 0.0 for h in hosts}
    for a in hosts:
        for b in hosts:
            if a is b and len(hosts) > 1:
                continue
            bw = _pair(a, b, "sink", ["send", "--seconds", str(seconds)], python, port)
            lat = _pair(a, b, "echo", ["ping"], python, port + 1)
            rate = float(bw["bytes_per_s"])
            measured["pairs"][f"{a.name}->{b.name}"] = {
                "gbps": round(rate / GBIT, 4), "latency_ms": round(lat["latency_s"] * 1e3, 3)
            }  # fmt: skip
            egress[a.name] = max(egress[a.name], rate)
            ingress[b.name] = max(ingress[b.name], rate)
    machines = []
    for h in hosts:
        m = measured["hosts"][h.name]
        entry: dict[str, Any] = {
            "name": h.name,
            "cpu": round(m["cores"], 2),
            "memory_gb": round(m["memory_bytes"] / 2**30, 2),
        }
        entry["egress_gbps"] = round(egress[h.name] / GBIT, 4)
        entry["ingress_gbps"] = round(ingress[h.name] / GBIT, 4)
        machines.append(entry)
    cluster = {"apiVersion": "graphrun.io/v1alpha1", "kind": "Cluster", "machines": machines}
    return {"cluster": cluster, "measured": measured}
