"""Every object the operator makes for a GraphJob, without a cluster (``graphrun render``).

``helm template`` for GraphJobs: the same pure builders the operator calls
(:mod:`.builders`, :mod:`.rendezvous`), in the order a fresh job makes them —

* the base objects (:func:`base_builders`, which the operator's first reconcile step
  uses too): the job's key Secret (none on a running store, whose Secret the job names),
  the ConfigMap (job, hosts, partition settings), the headless Service, the
  NetworkPolicy, the gang scheduler's PodGroup or Workload with its PodGroups;
* the partitioner Job (none where the worker pods partition, or on a running store);
* the rendezvous pod of an elastic job;
* one worker pod per machine that runs a role;
* the launcher pod, if the spec has one.

What only the cluster knows is shown as such: the key pair is made when the job is
created, so the Secret shows its shape with ``<made by the operator>`` in place of the
keys (as ``stringData``, readable); the owner references name the GraphJob with
:data:`UID`, a placeholder of the uid it gets. Objects made later in a job's life — a
worker pod made again in join mode after an elastic loss, pods after a restart with
``--resume`` — are these with one flag changed and are not listed.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import yaml

from graphrun.job.spec import GraphJob
from graphrun.operator import builders as B
from graphrun.operator import gang as G
from graphrun.operator import layout as L
from graphrun.operator import rendezvous as RZ
from graphrun.operator.keys import CurveKeyPair

UID = "00000000-0000-0000-0000-000000000000"
MADE_BY_OPERATOR = "<made by the operator>"
Built = dict[str, Any] | list[dict[str, Any]] | None


def base_builders(
    job: GraphJob, owner: L.Owner, config: L.OperatorConfig, keys: CurveKeyPair
) -> dict[str, Callable[[], Built]]:
    """The builders of a job's base objects by kind, in the order they are made: each
    returns an object, a list of them, or None where the job has none of that kind."""
    own_store = job.spec.graph.store is None  # else the store's key Secret is used
    return {
        "Secret": lambda: B.build_secret(owner, keys) if own_store else None,
        "ConfigMap": lambda: B.build_configmap(job, owner, config),
        "Service": lambda: B.build_service(owner, L.rendezvous_apart(job)),
        "NetworkPolicy": lambda: B.build_network_policy(owner),
        "PodGroup": lambda: G.build_podgroup(job, owner),
        "Workload": lambda: G.build_workload(job, owner),
    }


def render(job: GraphJob, namespace: str, config: L.OperatorConfig) -> list[dict[str, Any]]:
    """Every object the operator makes for ``job`` in ``namespace`` (pure; the job is
    one :func:`graphrun.operator.builders.check_supported` accepted)."""
    owner = L.Owner(job.name, namespace, UID)
    keys = CurveKeyPair(MADE_BY_OPERATOR, MADE_BY_OPERATOR)
    out: list[dict[str, Any]] = []
    for build in base_builders(job, owner, config, keys).values():
        built = build()
        out.extend(built if isinstance(built, list) else [built] if built else [])
    if job.spec.graph.store is None and not L.partitions_on_workers(job):
        out.append(B.build_partitioner(job, owner, config))
    if L.rendezvous_apart(job):
        out.append(RZ.build_rendezvous(job, owner, config))
    out.extend(B.build_worker(job, owner, config, i) for i in L.worker_indices(job))
    if job.spec.replica_specs.launcher is not None:
        out.append(B.build_launcher(job, owner, config))
    return [_readable_secret(o) if o["kind"] == "Secret" else o for o in out]


def _readable_secret(secret: dict[str, Any]) -> dict[str, Any]:
    """A Secret whose ``data`` holds no real key: shown decoded, as ``stringData``."""
    data = secret.get("data") or {}
    shown = {name: base64.b64decode(value).decode() for name, value in data.items()}
    return {**{k: v for k, v in secret.items() if k != "data"}, "stringData": shown}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap's files, scripts) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(obj: dict[str, Any]) -> str:
    """One object as a YAML document, keys in the builders' order."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=100)
