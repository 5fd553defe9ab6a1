"""Pure builders of every child object of a GraphJob (see :mod:`.layout` for the names).

Each ``build_*`` takes the validated job, its :class:`~.layout.Owner` and the
:class:`~.layout.OperatorConfig` and returns a plain dict ready for the API. User pod
templates (``spec.replicaSpecs.<replica>.template``) are the starting point: the
operator adds its labels, volumes, environment and command to the container named
``graphrun`` (or the first container), keeping everything else the user set.
"""

from __future__ import annotations

import base64
import copy
import shlex
from typing import Any, get_args

from graphrun.errors import SpecError
from graphrun.job.spec import GraphJob, ReplicaGroup, ReplicaSpec, resolve_placement
from graphrun.machine.stopmark import JOIN_ENV, PODINFO_ANNOTATIONS
from graphrun.operator import gang as G
from graphrun.operator import layout as L
from graphrun.operator import queueing as Q
from graphrun.operator import resources as R
from graphrun.operator.keys import CurveKeyPair
from graphrun.operator.policy import SYSTEM_PRIORITY, check_pod_policy
from graphrun.placement.job import Demand
from graphrun.wire import key_file_text

CONFIG_VOLUME, DATA_VOLUME = "graphrun-config", "graphrun-data"
SHM_VOLUME, SHM_PATH = "graphrun-shm", "/dev/shm"
IMAGE_UID = 10001
# a worker pod's default terminationGracePeriodSeconds: the trainers' checkpoint on
# SIGTERM, then the store servers (the template may set its own)
STOP_GRACE_SECONDS = 120


def check_supported(job: GraphJob) -> None:
    """Refuse, naming the field, what the operator cannot run (yet)."""
    spec = job.spec
    if spec.placement.plan_file is not None:
        raise SpecError(
            "spec.placement.planFile: the operator cannot read files from your machine; "
            "put the plan inline as spec.placement.plan (the plan file's content; "
            "`graphrun plan CLUSTER JOB -o PLAN --inline JOB_OUT` writes the job with it)"
        )
    if spec.graph.store is not None and spec.graph.store.key_secret is None:
        raise SpecError(
            "spec.graph.store.keySecret: required on Kubernetes (a Secret in the job's "
            "namespace holding the store's job.key); keyFile is read by graphrun run only"
        )
    for replica in get_args(ReplicaGroup):
        user = getattr(spec.replica_specs, replica)
        if user is not None:
            check_pod_policy(user.template, f"spec.replicaSpecs.{replica}.template")
    gang = spec.run_policy.scheduling_policy
    if gang is not None and (gang.priority_class or "").startswith(SYSTEM_PRIORITY):
        raise SpecError(
            "spec.runPolicy.schedulingPolicy.priorityClass: a system priority class is not "
            "allowed in a GraphJob (pod policy, docs/kubernetes.md)"
        )
    L.shared_volume(job)
    L.live_dir(job)
    resolve_placement(job)
    L.check_plan_nodes(job)
    R.check_machines(job)
    demands = R.machine_demands(job)
    for index in L.worker_indices(job):
        _worker_resources(job, index, demands)
    _check_partition_ranks(job)
    launcher = spec.replica_specs.launcher
    if launcher is not None and not _main_container(launcher.template).get("command"):
        raise SpecError(
            "spec.replicaSpecs.launcher.template: the launcher container needs a command"
        )


def _check_partition_ranks(job: GraphJob) -> None:
    """partition.mode distributed runs one rank in every machine's worker pod."""
    if not L.partitions_on_workers(job):
        return
    idle = sorted(set(range(job.spec.runtime.machines)) - set(L.worker_indices(job)))
    if idle:
        machine, plan = job.spec.machine_names[idle[0]], job.spec.placement.plan
        if plan is not None:
            machine += f" (the plan's {plan.machines[idle[0]]})"
        raise SpecError(
            f"spec.partition.mode: 'distributed' runs one partition rank in every machine's "
            f"worker pod, but the placement gives machine {machine} no store server and no "
            "trainer (so no pod); place a role there or use mode 'single' or 'parallel'"
        )


def build_secret(owner: L.Owner, keys: CurveKeyPair) -> dict[str, Any]:
    """The job's key pair as ``job.key`` (the graphrun-key JSON file of graphrun.rpc.auth)."""
    encoded = base64.b64encode(key_file_text(keys.public, keys.secret).encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": L.metadata(owner, L.secret_name(owner.name)),
        "type": "Opaque",
        "data": {L.KEY_FILE_NAME: encoded},
    }


def build_configmap(job: GraphJob, owner: L.Owner, config: L.OperatorConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": L.metadata(owner, L.configmap_name(owner.name)),
        "data": L.config_files(job, owner, config),
    }


def build_service(owner: L.Owner, rendezvous: bool = False) -> dict[str, Any]:
    """Headless: DNS names for the worker pods, published before they are ready (the
    workers find each other while starting). ``rendezvous``: and for the rendezvous pod
    of an elastic job (:mod:`.rendezvous`): it selects every pod of the job (a Service
    selects by equality only; a pod without hostname and subdomain gets no name)."""
    selector = {L.LABEL_JOB: owner.name}
    if not rendezvous:
        selector[L.LABEL_REPLICA] = "worker"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": L.metadata(owner, L.service_name(owner.name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
        },
    }


def _main_index(template: dict[str, Any]) -> int:
    """The index of the container named ``graphrun``, else 0 (the first)."""
    containers = template.get("spec", {}).get("containers") or [{}]
    return next((i for i, c in enumerate(containers) if c.get("name") == L.CONTAINER), 0)


def _main_container(template: dict[str, Any]) -> dict[str, Any]:
    containers = template.get("spec", {}).get("containers") or [{}]
    return containers[_main_index(template)]


def _worker_resources(
    job: GraphJob, index: int, demands: list[Demand] | None
) -> dict[str, Any] | None:
    """Worker ``index``'s container resources (see :mod:`.resources`)."""
    user = job.spec.replica_specs.worker
    template = user.template if user else {}
    where = f"spec.replicaSpecs.worker.template.spec.containers[{_main_index(template)}].resources"
    base = _main_container(template).get("resources")
    return R.worker_resources(job, index, base, where, demands)


def _volumes(job: GraphJob, owner: L.Owner) -> list[dict[str, Any]]:
    vol = L.shared_volume(job)
    config = {
        "name": CONFIG_VOLUME,
        "projected": {
            "sources": [
                {"configMap": {"name": L.configmap_name(owner.name)}},
                {
                    "secret": {
                        "name": L.key_secret_name(job),
                        "items": [
                            {
                                "key": L.KEY_FILE_NAME,
                                "path": f"keys/{L.KEY_FILE_NAME}",
                                "mode": 0o400,
                            }
                        ],
                    }
                },
            ]
        },
    }
    data = {"name": DATA_VOLUME, "persistentVolumeClaim": {"claimName": vol.claim_name}}
    return [config, data]


def _pod_template(
    job: GraphJob,
    owner: L.Owner,
    config: L.OperatorConfig,
    replica: ReplicaGroup,
    index: int | None,
    command: list[str] | None,
    args: list[str] | None,
    env: list[dict[str, Any]],
) -> dict[str, Any]:
    """A PodTemplateSpec: the user's template plus what the operator needs."""
    user: ReplicaSpec | None = getattr(job.spec.replica_specs, replica)
    tpl = copy.deepcopy(user.template) if user else {}
    meta = tpl.setdefault("metadata", {})
    meta["labels"] = {**meta.get("labels", {}), **L.labels(owner.name, replica, index)}
    spec = tpl.setdefault("spec", {})
    containers = spec.setdefault("containers", [])
    if not containers:
        containers.append({"name": L.CONTAINER})
    main = next((c for c in containers if c.get("name") == L.CONTAINER), containers[0])
    main.setdefault("name", L.CONTAINER)
    main["image"] = main.get("image") or job.spec.image or config.image
    main.setdefault("imagePullPolicy", job.spec.image_pull_policy or config.image_pull_policy)
    if command is not None:
        main["command"] = command
    if args is not None:
        main["args"] = args
    if env:
        main["env"] = [*main.get("env", []), *env]
    main["workingDir"] = L.mount_path(job)
    main.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    main["volumeMounts"] = [
        *main.get("volumeMounts", []),
        {"name": CONFIG_VOLUME, "mountPath": L.CONFIG_DIR, "readOnly": True},
        {"name": DATA_VOLUME, "mountPath": L.mount_path(job)},
    ]
    spec["volumes"] = [*spec.get("volumes", []), *_volumes(job, owner)]
    spec["restartPolicy"] = "Never"  # the operator restarts, within backoffLimit
    spec.setdefault("automountServiceAccountToken", False)
    spec.setdefault("enableServiceLinks", False)
    # The image runs as uid 10001 (Dockerfile): let it write to the shared volume.
    spec["securityContext"] = {"fsGroup": IMAGE_UID, **(spec.get("securityContext") or {})}
    G.pod_scheduling(job, owner, config, meta, spec)
    return tpl


def generate_argv(job: GraphJob) -> list[str] | None:
    """``graphrun generate`` for the job's generator (in one chunk per machine when the
    machines partition it), or None."""
    gen = job.spec.graph.generator
    if gen is None:
        return None
    flags = []
    for key, value in gen.params.items():
        flag = "".join("-" + c.lower() if c.isupper() else c for c in key).replace("_", "-")
        if isinstance(value, bool):  # switches: --reverse / --no-reverse
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            flags += [f"--{flag}", str(value)]
    if job.spec.partition.mode == "distributed":
        flags += ["--chunks", str(job.spec.num_parts)]
    return ["graphrun", "generate", gen.name, L.dataset_dir(job), *flags]


def partitioner_script(job: GraphJob) -> str:
    """Generate the graph (if the spec asks) and partition it; skip what already exists,
    so a retried partitioner picks up where it stopped."""
    dataset, out = L.dataset_dir(job), L.partition_dir(job)
    steps = []
    generate = generate_argv(job)
    if generate is not None:
        steps.append(f"test -e {shlex.quote(dataset + '/graph.json')} || {shlex.join(generate)}")
    partition = ["graphrun", "partition", dataset, out, "--parts", str(job.spec.num_parts)]
    partition += job.spec.partition.cli_args()
    steps.append(f"test -e {shlex.quote(out + '/partition.json')} || {shlex.join(partition)}")
    return "set -e\n" + "\n".join(steps) + "\n"


def partition_rank_script(
    job: GraphJob, owner: L.Owner, config: L.OperatorConfig, index: int
) -> str:
    """partition.mode distributed, worker ``index``'s init container: partition rank
    ``index`` of one per machine, meeting the others at worker 0; rank 0 renames the
    output into place once every rank has written its part. Worker 0 generates the graph
    first if the spec asks (the others wait for it). Skipped once the partitions exist,
    so restarted pods go straight to serving."""
    dataset, out = L.dataset_dir(job), L.partition_dir(job)
    chunks = shlex.quote(dataset + "/chunks.json")
    steps = []
    generate = generate_argv(job)
    if generate is not None and index == 0:
        steps.append(f"test -e {chunks} || {shlex.join(generate)}")
    elif generate is not None:
        steps.append(f"until test -e {chunks}; do sleep 2; done  # worker 0 generates it")
    n = job.spec.num_parts
    timeout = max(600, job.spec.run_policy.startup_deadline_seconds)  # others may start late
    rank = [
        "graphrun", "partition", dataset, out, "--parts", str(n), *job.spec.partition.cli_args(),
        "--rank", str(index), "--rendezvous", L.partition_rendezvous(owner, config),
        "--timeout", str(timeout),
    ]  # fmt: skip
    steps.append(f"test -e {shlex.quote(out + '/partition.json')} || {shlex.join(rank)}")
    return "set -e\n" + "\n".join(steps) + "\n"


def _partition_container(
    job: GraphJob, owner: L.Owner, config: L.OperatorConfig, index: int, main: dict[str, Any]
) -> dict[str, Any]:
    """The init container of worker ``index`` in partition.mode distributed: the main
    container's image, resources and environment, the shared volume, its rank's script."""
    container: dict[str, Any] = {
        "name": L.PARTITION_CONTAINER,
        "image": main["image"],
        "imagePullPolicy": main["imagePullPolicy"],
        "command": ["sh", "-c"],
        "args": [partition_rank_script(job, owner, config, index)],
        "workingDir": L.mount_path(job),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": DATA_VOLUME, "mountPath": L.mount_path(job)}],
    }
    for key in ("env", "resources", "securityContext"):
        if key in main:
            container[key] = copy.deepcopy(main[key])
    if index == 0:
        port = {"name": "partition", "containerPort": L.PARTITION_PORT, "protocol": "TCP"}
        container["ports"] = [port]
    return container


def build_partitioner(job: GraphJob, owner: L.Owner, config: L.OperatorConfig) -> dict[str, Any]:
    """A batch/v1 Job that runs once (backoffLimit 0): the operator owns retries."""
    tpl = _pod_template(
        job, owner, config, "partitioner", None, ["sh", "-c"], [partitioner_script(job)], []
    )
    meta = L.metadata(owner, L.partitioner_name(owner.name), "partitioner")
    Q.mark_job(job, meta)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {"backoffLimit": 0, "template": tpl},
    }


def build_worker(
    job: GraphJob,
    owner: L.Owner,
    config: L.OperatorConfig,
    index: int,
    resume: bool = False,
    join: bool = False,
) -> dict[str, Any]:
    """Worker ``index``: runs machine ``index``'s store servers, samplers and trainers
    (``--resume``: trainers continue from the last checkpoint), after partitioning with
    the other workers in partition.mode distributed. With a placement plan
    it is bound to the plan's machine ``index`` by required node affinity, runs the
    roles the plan gives that machine (listed in the ``graphrun.io/roles`` annotation)
    and asks for that machine's resources (:mod:`.resources`).

    ``join``: the replacement of a lost machine of an elastic job (:mod:`.elastic`):
    ``GRAPHRUN_ELASTIC_JOIN=1``, so its worker runs only the trainers, which join the
    running job at the next epoch boundary; no partition step, no readiness probe on a
    store port (it starts no store server)."""
    machine = job.spec.machine_names[index]
    roles = L.machine_roles(job)[index]
    env = [
        {"name": "MACHINE_INDEX", "value": str(index)},
        {"name": "MACHINE_NAME", "value": machine},
    ]
    if join:
        env.append({"name": JOIN_ENV, "value": "1"})
    args = [*L.WORKER_ARGS, "--run-dir", L.run_dir(job)]
    again = ["--resume"] if resume else []
    tpl = _pod_template(job, owner, config, "worker", index, ["graphrun"], [*args, *again], env)
    spec = tpl["spec"]
    # SIGTERM (suspend, a Kueue eviction, a drained node): the trainers agree on a step
    # and write an exact checkpoint, then the stores stop; the worker splits the pod's
    # grace period between the two (graphrun.machine.worker)
    grace = int(spec.setdefault("terminationGracePeriodSeconds", STOP_GRACE_SECONDS))
    stop = ["--grace", str(max(1, (grace - 5) // 2))]
    if L.uses_stop_mark(job):  # a SIGTERM without the mark: this pod leaves alone
        stop += ["--stop-mark", PODINFO_ANNOTATIONS]
        _pod_annotations_file(spec)
    _main_container(tpl)["args"] = [*args, *stop, *again]
    spec["hostname"] = L.worker_name(owner.name, index)
    spec["subdomain"] = L.service_name(owner.name)
    node = L.node_requirement(job, index)
    if node is not None:
        _require_node(spec, *node)
    tpl["metadata"].setdefault("annotations", {})[L.ANNOTATION_ROLES] = ",".join(map(str, roles))
    Q.mark_pod(job, len(L.worker_indices(job)), tpl["metadata"], spec)
    main = _main_container(tpl)
    resources = _worker_resources(job, index, R.machine_demands(job))
    if resources is not None:
        main["resources"] = resources
    _shared_memory(spec, main)
    if L.partitions_on_workers(job) and not join:  # after the user's init containers
        init = _partition_container(job, owner, config, index, main)
        spec["initContainers"] = [*spec.get("initContainers", []), init]
    ports = L.machine_ports(job, index)
    if ports:
        main["ports"] = [
            *main.get("ports", []),
            *({"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports),
        ]
        first_store = next((p for n, p in ports if n.startswith("store")), None)
        if first_store is not None and not join:
            main.setdefault(
                "readinessProbe",
                {"tcpSocket": {"port": first_store}, "periodSeconds": 5, "failureThreshold": 3},
            )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **tpl.get("metadata", {}),
            **L.metadata(owner, L.worker_name(owner.name, index), "worker", index),
            "labels": tpl["metadata"]["labels"],
        },
        "spec": spec,
    }


def _pod_annotations_file(spec: dict[str, Any]) -> None:
    """The pod's own annotations in a file, ``/etc/graphrun/podinfo/annotations``: a
    downward-API source of the config volume (the kubelet rewrites it when they change),
    where the worker looks for the stop mark (:mod:`graphrun.machine.stopmark`)."""
    config = next(v for v in spec["volumes"] if v.get("name") == CONFIG_VOLUME)
    path = PODINFO_ANNOTATIONS.removeprefix(L.CONFIG_DIR + "/")
    item = {"path": path, "fieldRef": {"fieldPath": "metadata.annotations"}}
    config["projected"]["sources"].append({"downwardAPI": {"items": [item]}})


def _shared_memory(spec: dict[str, Any], main: dict[str, Any]) -> None:
    """A memory-backed ``/dev/shm`` (a container's own is 64 MiB: any real partition
    would kill the store server with SIGBUS). The store servers keep their partition
    there and the trainers' loaders pass batches through it; it counts against the
    container's memory limit, and is capped by it when the template sets one."""
    if any(m.get("mountPath") == SHM_PATH for m in main.get("volumeMounts", [])):
        return  # the user's template brings its own
    empty: dict[str, Any] = {"medium": "Memory"}
    limit = main.get("resources", {}).get("limits", {}).get("memory")
    if limit is not None:
        empty["sizeLimit"] = limit
    spec["volumes"] = [*spec.get("volumes", []), {"name": SHM_VOLUME, "emptyDir": empty}]
    main["volumeMounts"] = [
        *main.get("volumeMounts", []),
        {"name": SHM_VOLUME, "mountPath": SHM_PATH},
    ]


def _require_node(spec: dict[str, Any], kind: str, requirement: dict[str, Any]) -> None:
    """Add a required node affinity, ANDed with every node selector term the user's
    template already requires (terms are ORed; requirements inside a term are ANDed)."""
    affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term[kind] = [*term.get(kind, []), requirement]


def build_launcher(job: GraphJob, owner: L.Owner, config: L.OperatorConfig) -> dict[str, Any]:
    """The optional launcher pod: the user's container with the job's config mounted."""
    tpl = _pod_template(job, owner, config, "launcher", None, None, None, [])
    Q.mark_pod(job, None, tpl["metadata"], tpl["spec"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **tpl.get("metadata", {}),
            **L.metadata(owner, L.launcher_name(owner.name), "launcher"),
            "labels": tpl["metadata"]["labels"],
        },
        "spec": tpl["spec"],
    }


def build_network_policy(owner: L.Owner) -> dict[str, Any]:
    """The job's closed pod network: its pods (workers, launcher, partitioner) accept
    connections only from each other — store servers, the rendezvous and the
    ``torch.distributed`` links, whose gloo and NCCL ports are ephemeral, so every TCP
    port. A pod of another job, or any other pod of the cluster, reaches none of them
    (where the cluster's network plugin enforces NetworkPolicies; SECURITY.md)."""
    own = {"matchLabels": {L.LABEL_JOB: owner.name, **L.MANAGED_BY}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": L.metadata(owner, L.network_policy_name(owner.name)),
        "spec": {
            "podSelector": own,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": own}], "ports": [{"protocol": "TCP"}]}],
        },
    }
