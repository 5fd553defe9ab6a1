"""``graphrun operator``: run the Kubernetes operator for GraphJobs (kopf)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from graphrun.operator.layout import OperatorConfig

DESCRIPTION = """\
Run the GraphJob controller: watch graphjobs.graphrun.io and turn each into a key
Secret, a ConfigMap (job, hosts, partition settings), a headless Service, a
partitioner Job and one worker pod per machine; report phase, conditions and events;
enforce the run policy (backoffLimit, activeDeadlineSeconds, cleanPodPolicy,
ttlSecondsAfterFinished, suspend, gang scheduling).

Inside a cluster it uses the pod's service account; outside, ~/.kube/config (or
--kubeconfig). Install the CRD first: `graphrun operator --print-crd | kubectl apply -f -`
or `kubectl apply -k deploy/` (see docs/kubernetes.md).
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "operator",
        help="run the Kubernetes operator for GraphJob resources",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "-n", "--namespace", action="append", default=[], metavar="NS",
        help="watch this namespace (repeatable; globs like 'ml-*' work)",
    )  # fmt: skip
    where.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    add_config_arguments(p)
    p.add_argument(
        "--resync", type=float, default=10.0, metavar="SECONDS",
        help="look at every GraphJob at least this often (deadlines, TTL); default 10",
    )  # fmt: skip
    p.add_argument("--kubeconfig", help="kubeconfig file (outside a cluster)")
    p.add_argument(
        "--liveness", metavar="URL", help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz"
    )
    p.add_argument("--print-crd", action="store_true", help="print the CRD as YAML and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=run)


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """The settings of an operator deployment that shape what it makes (also `render`'s)."""
    p.add_argument("--image", help="graphrun image for pods whose spec gives none")
    p.add_argument(
        "--image-pull-policy", choices=("Always", "IfNotPresent", "Never"), default="IfNotPresent"
    )
    p.add_argument("--cluster-domain", default="cluster.local", help="DNS domain of the cluster")
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=8,
        help="GPUs of a node: splits a GraphJob's runtime.gpus total into machines (default 8)",
    )


def operator_config(args: argparse.Namespace) -> OperatorConfig:
    """The :class:`~graphrun.operator.layout.OperatorConfig` of :func:`add_config_arguments`'
    flags, checked (an ArgumentError line naming the flag)."""
    from graphrun.errors import ArgumentError
    from graphrun.operator.layout import OperatorConfig

    if not 1 <= args.gpus_per_node <= 64:
        raise ArgumentError(f"--gpus-per-node: must be in 1..64, got {args.gpus_per_node}")
    return OperatorConfig(
        image=args.image or OperatorConfig().image,
        image_pull_policy=args.image_pull_policy,
        cluster_domain=args.cluster_domain,
        gpus_per_node=args.gpus_per_node,
    )


def api_client(kubeconfig: str | None) -> ApiClient:
    """The Kubernetes API client: in a pod its service account, else the kubeconfig
    (``kubeconfig``, or ~/.kube/config); no configuration is one line (a UserError)."""
    import yaml
    from kubernetes import client, config

    from graphrun.errors import UserError

    cfg = client.Configuration()
    try:
        if kubeconfig is None:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    except (config.ConfigException, OSError, yaml.YAMLError) as exc:
        where = f"{kubeconfig}: " if kubeconfig else ""
        reason = " ".join(str(exc).split())  # a YAML error spans several lines
        raise UserError(f"{where}no Kubernetes configuration: {reason}") from None
    return client.ApiClient(cfg)


def run(args: argparse.Namespace) -> int:
    from graphrun.operator.crd import crd_yaml

    if args.print_crd:
        sys.stdout.write(crd_yaml())
        return 0

    import logging

    import kopf

    from graphrun.errors import ArgumentError
    from graphrun.operator.handlers import OperatorContext, register
    from graphrun.operator.kube import Kube

    config = operator_config(args)
    if not args.resync > 0:  # NaN fails too
        raise ArgumentError(f"--resync: must be > 0, got {args.resync}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    ctx = OperatorContext(
        kube=Kube(api_client(args.kubeconfig)), config=config, resync_seconds=args.resync
    )
    registry = kopf.OperatorRegistry()
    register(registry, ctx)
    namespaces = list(args.namespace)
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
    )
    return 0
