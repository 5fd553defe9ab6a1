"""``graphrun probe -o cluster.yaml``: measure hosts, write the cluster file for ``plan``."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Measure hosts — effective CPU cores and kernel speed, memory, the rate and latency of
every link — and write the Cluster YAML `graphrun plan` takes (-o), printing every
measurement as JSON. Without --hosts this machine is measured as one host; with
--hosts netns --cluster FILE the hosts FILE describes are emulated here (network
namespaces with their CPU share, memory limit and link rate, as `graphrun run --hosts
netns --cluster` runs them) and measured, so the probe checks the emulation.

Example:  graphrun probe --hosts netns --cluster four-hosts.yaml -o probed.yaml
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "probe",
        help="measure hosts and write the cluster file graphrun plan takes",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-o", "--output", type=Path, required=True, help="cluster YAML to write")
    p.add_argument("--hosts", choices=("local", "netns"), default="local")
    p.add_argument("--cluster", type=Path, help="with --hosts netns: the hosts to emulate")
    p.add_argument("--seconds", type=float, default=1.0, help="per measurement (default 1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import socket

    import yaml

    from graphrun.errors import ArgumentError
    from graphrun.files import write_atomic
    from graphrun.job.hostprobe import ProbeHost, probe

    if not math.isfinite(args.seconds) or args.seconds <= 0:
        raise ArgumentError(f"--seconds: must be a positive number, got {args.seconds}")
    if (args.hosts == "netns") != (args.cluster is not None):
        raise ArgumentError("--cluster: give it exactly with --hosts netns")
    if not args.output.parent.is_dir():
        raise ArgumentError(f"-o: {args.output.parent} is not a directory")
    if args.hosts == "local":
        result = probe([ProbeHost(socket.gethostname(), "127.0.0.1")], args.seconds)
    else:
        from graphrun.job.netns import NetnsNetwork, shapes_from_cluster
        from graphrun.placement.cluster import load_cluster

        names = list(load_cluster(args.cluster).names)
        with NetnsNetwork(names, shapes=shapes_from_cluster(args.cluster, names)) as net:
            hosts = [
                ProbeHost(m, net.address(m), net.prefix(m), net.cgroup_prefix(m)) for m in names
            ]
            result = probe(hosts, args.seconds)
    try:
        write_atomic(args.output, yaml.safe_dump(result["cluster"], sort_keys=False))
    except OSError as exc:
        raise ArgumentError(f"-o: cannot write {args.output} ({exc.strerror})") from None
    print(json.dumps(result["measured"]))
    return 0
