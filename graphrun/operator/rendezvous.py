"""The rendezvous pod of an elastic job: the trainers' CURVE rendezvous served apart (pure).

Trainer 0 serves the rendezvous the trainers meet at (:mod:`graphrun.train.rendezvous`):
losing its machine would lose the place the survivors re-form at. An elastic job
(``runtime.elastic``, :func:`.layout.rendezvous_apart`) gets a small pod instead,
``<job>-rendezvous``, that runs ``graphrun rendezvous`` with the job's key on the
rendezvous port; the hosts file points there and says it is served apart
(``rendezvous_external``), so trainer 0 joins it like the others.

The pod is made with the worker pods, deleted with them (suspend, restart, finish) and
watched like them: losing it while the job trains fails the attempt (the restart policy
applies), as losing trainer 0's machine did. It runs with the restricted Pod Security
Standard (non-root, no privilege escalation, every capability dropped, RuntimeDefault
seccomp), mounts only the job's key, carries the job's labels (the job's NetworkPolicy
admits it and only it to the job's pods) and the workers' subdomain (a DNS name). It
asks for little (a Python process holding a bounded table) and prefers a node without a
worker pod of the job: a node lost with both would lose the rendezvous too.
"""

from __future__ import annotations

import copy
from typing import Any

from graphrun.job.spec import GraphJob
from graphrun.operator import builders as B
from graphrun.operator import layout as L

REPLICA = "rendezvous"  # its graphrun.io/replica-type label
PORT_NAME = "rendezvous"
KEY_VOLUME = "graphrun-keys"
RESOURCES = {
    "requests": {"cpu": "50m", "memory": "64Mi"},
    # Python, pyzmq and a table of at most 64 MiB (graphrun.rpc.rendezvous.Limits)
    "limits": {"memory": "256Mi"},
}
# what the pod keeps of the worker template's spec: where it may run, its image's pull
# secrets and its priority
KEPT = ("imagePullSecrets", "nodeSelector", "tolerations", "priorityClassName")


def restricted_pod_security() -> dict[str, Any]:
    """The pod securityContext of the restricted Pod Security Standard."""
    return {
        "runAsNonRoot": True,
        "runAsUser": B.IMAGE_UID,
        "runAsGroup": B.IMAGE_UID,
        "fsGroup": B.IMAGE_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted_container_security() -> dict[str, Any]:
    """The container securityContext of the restricted Pod Security Standard."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }


def rendezvous_argv(job: GraphJob) -> list[str]:
    """The pod's command (``graphrun rendezvous``, graphrun/cli/rendezvous.py)."""
    return [
        "graphrun", "rendezvous", "--bind", f"tcp://*:{L.rendezvous_port(job)}",
        "--key-file", f"{L.KEYS_DIR}/{L.KEY_FILE_NAME}",
    ]  # fmt: skip


def build_rendezvous(job: GraphJob, owner: L.Owner, config: L.OperatorConfig) -> dict[str, Any]:
    """The ``<job>-rendezvous`` pod (the module docstring says what and why)."""
    user = job.spec.replica_specs.worker
    tpl = user.template if user else {}
    template = tpl.get("spec") or {}
    port = L.rendezvous_port(job)
    workers = {"matchLabels": {L.LABEL_JOB: owner.name, L.LABEL_REPLICA: "worker"}}
    keys = {
        "secret": {
            "secretName": L.key_secret_name(job),
            "items": [{"key": L.KEY_FILE_NAME, "path": L.KEY_FILE_NAME, "mode": 0o400}],
        },
    }
    container = {
        "name": L.CONTAINER,
        "image": B._main_container(tpl).get("image") or job.spec.image or config.image,
        "imagePullPolicy": job.spec.image_pull_policy or config.image_pull_policy,
        "command": rendezvous_argv(job),
        "ports": [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 5},
        "resources": copy.deepcopy(RESOURCES),
        "securityContext": restricted_container_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": KEY_VOLUME, "mountPath": L.KEYS_DIR, "readOnly": True}],
    }  # fmt: skip
    spec: dict[str, Any] = {k: copy.deepcopy(template[k]) for k in KEPT if k in template}
    spec |= {
        "hostname": L.rendezvous_name(owner.name),
        "subdomain": L.service_name(owner.name),
        "restartPolicy": "Never",  # a lost rendezvous fails the attempt: the operator restarts
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": restricted_pod_security(),
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": workers,
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        },
        "containers": [container],
        "volumes": [{"name": KEY_VOLUME, **keys}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": L.metadata(owner, L.rendezvous_name(owner.name), REPLICA),
        "spec": spec,
    }
