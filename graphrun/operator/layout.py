"""How a GraphJob is laid out on Kubernetes: names, labels, paths, DNS names, ports.

For a GraphJob ``NAME`` in namespace ``NS`` the operator owns::

    Secret      NAME-keys         job.key: the job's CURVE key pair (graphrun-key JSON)
    ConfigMap   NAME-config       job.yaml (paths made absolute), hosts.json, partition.json
    Service     NAME-workers      headless; gives worker i the DNS name
                                  NAME-worker-i.NAME-workers.NS.svc.<cluster domain>
    Job         NAME-partitioner  (batch/v1) generates the graph if asked, then partitions it
                                  (not with partition.mode distributed)
    Pod         NAME-worker-i     one per machine that runs a store server or a trainer:
                                  `graphrun worker` (WORKER_ARGS); with partition.mode
                                  distributed, first its init container `partition`:
                                  partition rank i, meeting the others at worker 0
                                  (PARTITION_PORT), writing part i to the shared volume
    Pod         NAME-launcher     optional: the user's launcher container
    Pod         NAME-rendezvous   runtime.elastic only: `graphrun rendezvous`, the trainers'
                                  CURVE rendezvous served apart from trainer 0, at
                                  NAME-rendezvous.NAME-workers.NS.svc.<cluster domain>
    PodGroup    NAME              optional: gang scheduling (Volcano / scheduler-plugins)

Relative paths of the spec are taken relative to the shared volume's mount path (the
pods' working directory), like the local backend takes them relative to the job file.
A generated graph is written to ``<mount>/runs/NAME/data-<generator>-<hash of its parameters>``
(in one chunk per machine with partition.mode distributed, written by worker 0).

A placement plan inline in the spec (``spec.placement.plan``) decides which roles each
worker runs (the worker reads it from job.yaml, as the local backend does), and binds
worker i to the plan's machine i: the node of that name, or the node whose label
``spec.placement.nodeLabel`` has that value. A machine the plan gives no store server
and no trainer gets no pod (sampler workers run inside their trainer's pod). Each
worker pod asks for its machine's resources (see :mod:`.resources`).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any

import yaml

from graphrun.errors import SpecError
from graphrun.job.hosts import Hosts, build_hosts
from graphrun.job.spec import (
    API_VERSION,
    KIND,
    GraphJob,
    SharedVolume,
    job_roles,
    resolve_placement,
)
from graphrun.names import MAIN_TRAINER, RoleName
from graphrun.operator.queueing import queue_name
from graphrun.wire import to_builtins

CONFIG_DIR = "/etc/graphrun"
JOB_FILE = f"{CONFIG_DIR}/job.yaml"
HOSTS_FILE = f"{CONFIG_DIR}/hosts.json"
KEYS_DIR = f"{CONFIG_DIR}/keys"
KEY_FILE_NAME = "job.key"

# The worker command, agreed with `graphrun worker` (graphrun/cli/worker.py). The worker
# exits 0 once the whole job's training is done, non-zero when one of its roles failed;
# it writes the failing role, machine and exit code as the last line of its output.
WORKER_ARGS = [
    "worker",
    "--job",
    JOB_FILE,
    "--machine",
    "$(MACHINE_INDEX)",
    "--hosts-file",
    HOSTS_FILE,
    "--keys",
    KEYS_DIR,
]
BASE_PORT = 30000  # store servers listen on BASE_PORT + i, the rendezvous after them
PARTITION_PORT = BASE_PORT - 1  # partition.mode distributed: the ranks meet on worker 0
CONTAINER = "graphrun"  # the main container of every pod the operator makes
PARTITION_CONTAINER = "partition"  # the worker pods' init container in that mode

LABEL_JOB = "graphrun.io/job-name"
LABEL_REPLICA = "graphrun.io/replica-type"
LABEL_INDEX = "graphrun.io/replica-index"
ANNOTATION_ROLES = "graphrun.io/roles"  # the store and trainer roles a worker pod runs
MANAGED_BY = {"app.kubernetes.io/managed-by": "graphrun-operator"}
CONTROLLER = "graphrun.io/graphrun-operator"  # the value of spec.managedBy that means us


@dataclass(frozen=True)
class OperatorConfig:
    """Settings of one operator deployment (built by the CLI, passed everywhere)."""

    image: str = "ghcr.io/graphrun/graphrun:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    cluster_domain: str = "cluster.local"
    scheduler_plugins_name: str = "scheduler-plugins-scheduler"
    volcano_scheduler_name: str = "volcano"
    gpus_per_node: int = 8  # splits a GraphJob's runtime.gpus total (graphrun.job.gpus)


@dataclass(frozen=True)
class Owner:
    """The GraphJob object that owns every child."""

    name: str
    namespace: str
    uid: str


def secret_name(job: str) -> str:
    return f"{job}-keys"


def key_secret_name(job: GraphJob) -> str:
    """The Secret whose ``job.key`` the workers mount: the job's own, or the running
    store's (``graph.store.keySecret``)."""
    ref = job.spec.graph.store
    if ref is not None and ref.key_secret is not None:
        return ref.key_secret
    return secret_name(job.name)


def configmap_name(job: str) -> str:
    return f"{job}-config"


def service_name(job: str) -> str:
    return f"{job}-workers"


def partitioner_name(job: str) -> str:
    return f"{job}-partitioner"


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def launcher_name(job: str) -> str:
    return f"{job}-launcher"


def rendezvous_name(job: str) -> str:
    """The pod serving an elastic job's rendezvous apart (``graphrun rendezvous``)."""
    return f"{job}-rendezvous"


def rendezvous_apart(job: GraphJob) -> bool:
    """Whether the job's rendezvous is served by its own pod (:func:`rendezvous_name`)
    rather than by trainer 0: an elastic job's (``runtime.elastic``), whose survivors
    re-form there after a lost machine, trainer 0's included."""
    return job.spec.runtime.elastic is not None


def rendezvous_port(job: GraphJob) -> int:
    """Where the rendezvous listens: the port after the listening roles'."""
    return BASE_PORT + len(listening_roles(job))


def rendezvous_dns(owner: Owner, config: OperatorConfig) -> str:
    """The rendezvous pod's DNS name (hostname and subdomain as the worker pods')."""
    return (
        f"{rendezvous_name(owner.name)}.{service_name(owner.name)}.{owner.namespace}"
        f".svc.{config.cluster_domain}"
    )


def network_policy_name(job: str) -> str:
    return f"{job}-pods"


def pod_group_template(replica: str) -> str:
    """The Workload API's PodGroupTemplate of a role group (``workers``, ``launcher``)."""
    return "workers" if replica == "worker" else replica


def pod_group_name(job: str, replica: str) -> str:
    """The Workload API PodGroup the pods of a role group name in spec.schedulingGroup."""
    return f"{job}-{pod_group_template(replica)}"


def labels(job: str, replica: str | None = None, index: int | None = None) -> dict[str, str]:
    out = {LABEL_JOB: job, **MANAGED_BY}
    if replica is not None:
        out[LABEL_REPLICA] = replica
    if index is not None:
        out[LABEL_INDEX] = str(index)
    return out


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(
    owner: Owner, name: str, replica: str | None = None, index: int | None = None
) -> dict[str, Any]:
    """An owned object's metadata: its name, namespace, labels and the GraphJob as its
    controller (so deleting the job deletes it)."""
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner.name, replica, index),
        "ownerReferences": [owner_reference(owner)],
    }


def worker_dns(owner: Owner, index: int, config: OperatorConfig) -> str:
    return (
        f"{worker_name(owner.name, index)}.{service_name(owner.name)}.{owner.namespace}"
        f".svc.{config.cluster_domain}"
    )


def partition_rendezvous(owner: Owner, config: OperatorConfig) -> str:
    """Where the partition ranks of partition.mode distributed meet: rank 0, in worker 0."""
    return f"tcp://{worker_dns(owner, 0, config)}:{PARTITION_PORT}"


def partitions_on_workers(job: GraphJob) -> bool:
    """True when the worker pods partition (partition.mode distributed, nothing made yet
    by a running store): no partitioner Job."""
    return job.spec.partition.mode == "distributed" and job.spec.graph.store is None


def shared_volume(job: GraphJob) -> SharedVolume:
    vol = job.spec.shared_volume
    if vol is None:
        raise SpecError(
            "spec.sharedVolume: required on Kubernetes (partitions reach the workers through "
            "a shared volume, e.g. a ReadWriteMany PersistentVolumeClaim)"
        )
    return vol


def mount_path(job: GraphJob) -> str:
    return shared_volume(job).mount_path


def _abs(job: GraphJob, path: str) -> str:
    return posixpath.normpath(posixpath.join(mount_path(job), path))


def dataset_dir(job: GraphJob) -> str:
    """The dataset; a generated one lives in a directory named after its parameters,
    so different parameters never reuse a graph made with others."""
    gen = job.spec.graph.generator
    if gen is None:  # GraphSource has exactly one of dataset, generator
        return _abs(job, job.spec.graph.dataset or "")
    key = gen.model_dump(mode="json")
    if job.spec.partition.mode == "distributed":  # written in chunks: another layout
        key["chunks"] = job.spec.num_parts
    params = json.dumps(key, sort_keys=True)
    digest = hashlib.sha256(params.encode()).hexdigest()[:8]
    return _abs(job, f"runs/{job.name}/data-{gen.name}-{digest}")


def partition_dir(job: GraphJob) -> str:
    return _abs(job, job.partition_dir())


def run_dir(job: GraphJob) -> str:
    """The trainers' run directory on the shared volume (metrics.jsonl, tensorboard/): the
    job file's own directory is the read-only ConfigMap."""
    return _abs(job, f"runs/{job.name}")


def checkpoint_dir(job: GraphJob) -> str:
    return _abs(job, job.spec.training.checkpoint_dir or f"runs/{job.name}/checkpoints")


def live_dir(job: GraphJob) -> str | None:
    """The job's own store servers' logs (``spec.live``; a directory per partition
    under it): on the shared volume, so a store's log outlives its pod and node."""
    live = job.spec.live
    if live is None or job.spec.graph.store is not None:
        return None
    path = _abs(job, live.log_dir or f"runs/{job.name}/live")
    mount = posixpath.normpath(mount_path(job))
    if not path.startswith(mount.rstrip("/") + "/"):
        raise SpecError(
            f"spec.live.logDir: {live.log_dir!r} is not on the shared volume ({mount}): the "
            "store servers' logs must be on a PersistentVolume to outlive their pods"
        )
    return path


def rendered_job(job: GraphJob) -> dict[str, Any]:
    """The job as the pods read it: absolute paths, the generated graph as a dataset,
    Kubernetes-only fields left out."""
    spec = job.spec
    training: dict[str, Any] = {"checkpointDir": checkpoint_dir(job)}
    if spec.training.script is not None:
        training["script"] = _abs(job, spec.training.script)
    new = job.model_copy(
        update={
            "spec": spec.model_copy(
                update={
                    "graph": spec.graph.model_copy(
                        update={"dataset": dataset_dir(job), "generator": None}
                    ),
                    "partition": spec.partition.model_copy(update={"output": partition_dir(job)}),
                    "training": spec.training.model_copy(
                        update={
                            "checkpoint_dir": training["checkpointDir"],
                            "script": training.get("script"),
                        }
                    ),
                    "replica_specs": spec.replica_specs.model_copy(
                        update={"partitioner": None, "worker": None, "launcher": None}
                    ),
                    "live": (
                        spec.live.model_copy(update={"log_dir": live_dir(job)})
                        if spec.live is not None and spec.graph.store is None
                        else spec.live
                    ),
                }
            )
        }
    )
    return new.to_dict()


def host_plan(job: GraphJob, owner: Owner, config: OperatorConfig) -> Hosts:
    """The hosts file (graphrun.job.hosts): machine -> DNS name of its worker pod in
    machine order with its trainer slots (and GPUs, when the job uses them), listening
    role -> host:port, and the rendezvous (the rendezvous pod's, said to be served
    apart, for an elastic job: :func:`rendezvous_apart`)."""
    names = job.spec.machine_names
    address = {m: worker_dns(owner, i, config) for i, m in enumerate(names)}
    stores = listening_roles(job)
    ports = [BASE_PORT + i for i in range(len(stores) + 1)]
    store = job.spec.graph.store.addresses if job.spec.graph.store is not None else ()
    gpus = job.spec.runtime.machine_gpus or 0
    rdv = rendezvous_dns(owner, config) if rendezvous_apart(job) else None
    return build_hosts(address, resolve_placement(job), stores, ports, store, True, gpus, rdv)


def machine_ports(job: GraphJob, machine_index: int) -> list[tuple[str, int]]:
    """(port name, port) of what listens on a machine: its store and parameter servers,
    the rendezvous (unless its own pod serves it)."""
    machine = job.spec.machine_names[machine_index]
    placement = resolve_placement(job)
    stores = listening_roles(job)
    out = [(_port_name(role, i), BASE_PORT + i) for i, role in enumerate(stores)
           if placement[role] == machine]  # fmt: skip
    main = placement.get(MAIN_TRAINER, job.spec.machine_names[0]) == machine
    if main and not rendezvous_apart(job):
        out.append(("rendezvous", rendezvous_port(job)))
    return out


def _port_name(role: RoleName, i: int) -> str:
    """``store-<i>`` (the i-th listening role), ``ps-<j>`` (parameter server j)."""
    return f"ps-{role.index}" if role.kind == "ps" else f"store-{i}"


def listening_roles(job: GraphJob) -> list[RoleName]:
    """The roles that listen, in port order: store servers, then parameter servers."""
    return [r.id for r in job_roles(job.spec) if r.kind in ("store", "ps")]


def machine_roles(job: GraphJob) -> list[list[RoleName]]:
    """Per machine (in machine order), the store, parameter-server and trainer roles its
    worker runs."""
    placement = resolve_placement(job)
    index = {m: i for i, m in enumerate(job.spec.machine_names)}
    out: list[list[RoleName]] = [[] for _ in index]
    for role in job_roles(job.spec):
        if role.kind in ("store", "ps", "trainer"):
            out[index[placement[role.id]]].append(role.id)
    return out


def worker_indices(job: GraphJob) -> list[int]:
    """The machines that get a worker pod: those running a store or parameter server or a
    trainer."""
    return [i for i, roles in enumerate(machine_roles(job)) if roles]


_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def node_requirement(job: GraphJob, index: int) -> tuple[str, dict[str, Any]] | None:
    """How worker ``index`` is bound to its plan machine's node: ``("matchFields", ...)``
    on the node name, or ``("matchExpressions", ...)`` on ``spec.placement.nodeLabel``;
    None without an inline plan."""
    placement = job.spec.placement
    if placement.plan is None:
        return None
    machine = placement.plan.machines[index]
    if placement.node_label is None:
        return "matchFields", {"key": "metadata.name", "operator": "In", "values": [machine]}
    return "matchExpressions", {"key": placement.node_label, "operator": "In", "values": [machine]}


def check_plan_nodes(job: GraphJob) -> None:
    """The plan's machines must be node names (or values of the node label)."""
    placement = job.spec.placement
    if placement.plan is None:
        return
    for i, machine in enumerate(placement.plan.machines):
        if placement.node_label is None:
            if len(machine) > 253 or not _NODE_NAME.match(machine):
                raise SpecError(
                    f"spec.placement.plan.machines[{i}]: {machine!r} is not a Kubernetes node "
                    "name (lowercase letters, digits, '-' and '.'); name the nodes, or label "
                    "them and set spec.placement.nodeLabel"
                )
        elif len(machine) > 63 or not _LABEL_VALUE.match(machine):
            raise SpecError(
                f"spec.placement.plan.machines[{i}]: {machine!r} is not a value of node label "
                f"{placement.node_label} (at most 63 letters, digits, '-', '_', '.')"
            )


def partition_settings(job: GraphJob) -> dict[str, Any]:
    p = job.spec.partition
    return {
        "method": p.algorithm,
        "parts": job.spec.num_parts,
        "balanceTrain": p.balance_train,
        "balanceEdges": p.balance_edges,
        "haloHops": p.halo_hops,
        "dataset": dataset_dir(job),
        "output": partition_dir(job),
    }


def config_files(job: GraphJob, owner: Owner, config: OperatorConfig) -> dict[str, str]:
    """The ConfigMap's files."""
    return {
        "job.yaml": yaml.safe_dump(rendered_job(job), sort_keys=False),
        "hosts.json": json.dumps(to_builtins(host_plan(job, owner, config)), indent=2) + "\n",
        "partition.json": json.dumps(partition_settings(job), indent=2) + "\n",
    }


def managed_here(job: GraphJob) -> bool:
    """Whether this operator runs ``job``: ``spec.managedBy`` unset or naming it. A job
    managed by another controller (e.g. ``kueue.x-k8s.io/multikueue``, which copies it
    to a worker cluster) is left alone: no children, no status."""
    return job.spec.managed_by in (None, CONTROLLER)


def uses_stop_mark(job: GraphJob) -> bool:
    """Whether the job's worker pods tell a one-pod deletion from a stop of the whole job
    (:mod:`graphrun.machine.stopmark`): with ``runtime.elastic``, the operator annotates
    the pods ``graphrun.io/stop: job`` before it deletes them all (suspend, restart), and
    a worker whose pod is deleted without it leaves alone, so the others go on. Not for a
    job queued by Kueue: Kueue deletes the pods of an eviction itself, unannounced, and
    its trainers must then checkpoint, so every SIGTERM there stops the whole job."""
    return job.spec.runtime.elastic is not None and queue_name(job) is None
