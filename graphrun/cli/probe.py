"""``graphrun probe -o cluster.yaml``: measure hosts, write the cluster file for ``plan``."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from graphrun.arguments import number, output_file

DESCRIPTION = """\
Measure hosts — effective CPU cores and kernel speed, memory, the rate and latency of
every link — and write the Cluster YAML `graphrun plan` takes (-o), printing every
measurement as JSON. Without --hosts this machine is measured as one host; with
--hosts netns --cluster FILE the hosts FILE describes are emulated here (network
namespaces with their CPU share, memory limit and link rate, as `graphrun run --hosts
netns --cluster` runs them) and measured, so the probe checks the emulation.

With --hosts kubernetes --job GRAPHJOB the nodes the GraphJob's worker pods may use are
measured by a short Job in its namespace (one pod per node, as many as its
runtime.machines or --members); each node becomes a machine of the cluster file, named
after it. The Job, its Service and its Secret (the key the pods tag their messages
with) are deleted when the probe ends, however it ends. The pods run `graphrun probe
--member I --peers ...` (docs/kubernetes.md).

Examples:  graphrun probe --hosts netns --cluster four-hosts.yaml -o probed.yaml
           graphrun probe --hosts kubernetes --job graphsage.yaml -o cluster.yaml
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "probe",
        help="measure hosts and write the cluster file graphrun plan takes",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-o", "--output", type=output_file, help="cluster YAML to write")
    p.add_argument("--hosts", choices=("local", "netns", "kubernetes"), default="local")
    p.add_argument("--cluster", type=Path, help="with --hosts netns: the hosts to emulate")
    p.add_argument("--seconds", type=number(0, 3600, above=True), default=1.0,
                   help="per measurement (default 1)")  # fmt: skip
    k8s = p.add_argument_group("--hosts kubernetes")
    k8s.add_argument("--job", type=Path, help="the GraphJob whose worker nodes to measure")
    k8s.add_argument("-n", "--namespace", help="default: the job's, else the kubeconfig's")
    k8s.add_argument("--members", type=int, help="nodes to measure (default: runtime.machines)")
    k8s.add_argument("--image", help="graphrun image (default: the job's worker image)")
    k8s.add_argument("--kubeconfig", help="kubeconfig file (default: ~/.kube/config)")
    k8s.add_argument(
        "--timeout", type=number(0, 86400, above=True), default=600.0, metavar="SECONDS",
        help="longest the probe may take, pods starting included (default 600)",
    )  # fmt: skip
    member = p.add_argument_group("a probe pod (run by the probe Job)")
    member.add_argument("--member", type=int, metavar="INDEX", help="this member's index")
    member.add_argument("--peers", metavar="HOST:PORT,...", help="every member, in index order")
    member.add_argument(
        "--message-file", type=Path, default=Path("/dev/termination-log"),
        help="where the report goes (default: the pod's termination message)",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from graphrun.errors import ArgumentError
    from graphrun.files import write_atomic

    if args.member is not None:
        return _member(args)
    if args.peers is not None:
        raise ArgumentError("--peers: only with --member")
    if args.output is None:
        raise ArgumentError("-o: required (the cluster YAML to write)")
    if (args.hosts == "netns") != (args.cluster is not None):
        raise ArgumentError("--cluster: give it exactly with --hosts netns")
    if (args.hosts == "kubernetes") != (args.job is not None):
        raise ArgumentError("--job: give it exactly with --hosts kubernetes")
    result = _kubernetes(args) if args.hosts == "kubernetes" else _here(args)
    try:
        write_atomic(args.output, yaml.safe_dump(result["cluster"], sort_keys=False))
    except OSError as exc:
        raise ArgumentError(f"-o: cannot write {args.output} ({exc.strerror})") from None
    print(json.dumps(result["measured"]))
    return 0


def _here(args: argparse.Namespace) -> dict[str, Any]:
    """This machine as one host, or emulated netns hosts."""
    import socket

    from graphrun.measure.probe import ProbeHost, probe

    if args.hosts == "local":
        return probe([ProbeHost(socket.gethostname(), "127.0.0.1")], args.seconds)
    from graphrun.local.netns import NetnsNetwork, shapes_from_cluster
    from graphrun.placement.cluster import load_cluster

    names = list(load_cluster(args.cluster).names)
    with NetnsNetwork(names, shapes=shapes_from_cluster(args.cluster, names)) as net:
        hosts = [ProbeHost(m, net.address(m), net.prefix(m), net.cgroup_prefix(m)) for m in names]
        return probe(hosts, args.seconds)


def _kubernetes(args: argparse.Namespace) -> dict[str, Any]:
    """The probe Job over the nodes the GraphJob may use (graphrun.operator.probe)."""
    from graphrun.cli.operator import api_client
    from graphrun.errors import ArgumentError
    from graphrun.job.spec import load_job
    from graphrun.operator.kube import Kube
    from graphrun.operator.probe import MAX_MEMBERS, probe_spec, run_probe
    from graphrun.placement.cluster import cluster_from_dict

    if args.members is not None and not 1 <= args.members <= MAX_MEMBERS:
        raise ArgumentError(f"--members: must be 1 to {MAX_MEMBERS}, got {args.members}")
    job = load_job(args.job)
    if args.members is None and job.spec.runtime.machines > MAX_MEMBERS:
        raise ArgumentError(
            f"--members: {args.job} has {job.spec.runtime.machines} machines, a probe measures "
            f"at most {MAX_MEMBERS} nodes at once; give --members"
        )
    api = api_client(args.kubeconfig)
    namespace = args.namespace or job.metadata.namespace or _context_namespace(args.kubeconfig)
    spec = probe_spec(
        job, namespace, members=args.members, image=args.image, seconds=args.seconds,
        timeout=math.ceil(args.timeout),
    )  # fmt: skip
    print(
        f"probe: Job {namespace}/{spec.name}, {spec.members} members, image {spec.image}",
        file=sys.stderr,
    )
    result = run_probe(Kube(api), spec)
    cluster_from_dict(result["cluster"], "the probed cluster")  # what plan will read
    return result


def _context_namespace(kubeconfig: str | None) -> str:
    """The namespace of the kubeconfig's current context, else ``default``."""
    from kubernetes import config

    try:
        _, current = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError):
        return "default"
    return str((current or {}).get("context", {}).get("namespace") or "default")


def _member(args: argparse.Namespace) -> int:
    """One probe pod: measure, write the report (or the error) to --message-file."""
    from graphrun.errors import PEER_LOST_EXIT, ArgumentError, GraphrunError, PeerLost
    from graphrun.measure.member import (
        KEY_ENV,
        MESSAGE_LIMIT,
        MemberConfig,
        parse_key,
        parse_peers,
        run_member,
    )

    if args.peers is None:
        raise ArgumentError("--member: needs --peers")
    try:
        peers = parse_peers(args.peers)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    if not 0 <= args.member < len(peers):
        raise ArgumentError(f"--member: {args.member} is not an index of the {len(peers)} peers")
    if not os.environ.get(KEY_ENV):
        raise ArgumentError(f"--member: needs the probe's key in ${KEY_ENV} (hex)")
    try:
        key = parse_key(os.environ[KEY_ENV], f"${KEY_ENV}")
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    cfg = MemberConfig(args.member, peers, key, seconds=args.seconds, timeout=args.timeout)
    try:
        message = run_member(cfg).to_message()
    except GraphrunError as exc:
        line = f"graphrun: error: {exc}"
        print(line, file=sys.stderr)
        args.message_file.write_text(line.encode()[:MESSAGE_LIMIT].decode(errors="ignore"))
        return PEER_LOST_EXIT if isinstance(exc, PeerLost) else 1
    args.message_file.write_text(message)  # the kubelet's file: written in place
    print(message)
    return 0
