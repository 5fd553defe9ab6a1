"""The pod policy of a GraphJob's templates (``spec.replicaSpecs.*.template``).

Whoever may create a GraphJob may create pods through the operator, so creating one must
not give more than a graphrun pod needs. The policy follows the Kubernetes Pod Security
Standards (baseline, and "restricted" where a graphrun pod loses nothing by it) and is
checked before anything is created; a refusal is one :class:`~graphrun.errors.SpecError`
naming the field. Refused:

- host namespaces (``hostNetwork``/``hostPID``/``hostIPC``), ``hostPort``s, Windows
  ``hostProcess``, probes and lifecycle hooks aimed at another ``host``;
- every volume type but :data:`VOLUME_TYPES` (an allow-list: no ``hostPath``, ``nfs``,
  ``gitRepo``, ...), and in a ``projected`` volume every source but
  :data:`PROJECTED_SOURCES` (no ``serviceAccountToken``);
- a service account other than ``default``, or its token (``automountServiceAccountToken``);
- privileged containers, privilege escalation, added capabilities, an unmasked
  ``procMount``;
- seccomp or AppArmor ``Unconfined`` (in the security contexts or the legacy
  annotations), SELinux users, roles and types outside the container types;
- running as root: ``runAsUser: 0``, ``runAsNonRoot: false``, group 0 (``runAsGroup``,
  ``fsGroup``, ``supplementalGroups``);
- sysctls outside :data:`SAFE_SYSCTLS` (those the kubelet namespaces per pod);
- ``nodeName`` (it skips the scheduler and every taint but ``NoExecute``), tolerations of
  every taint (``operator: Exists`` with no key) and of the control plane's taints;
- the system priority classes (``system-node-critical``, ``system-cluster-critical``:
  they preempt the cluster's own pods), in the template or as the job's
  ``runPolicy.schedulingPolicy.priorityClass``.

Allowed, because a graphrun pod may need them and they give nothing of the node: keyed
tolerations, node selectors and affinity, resources, images, environment, sidecars,
``emptyDir``/``persistentVolumeClaim``/``configMap``/``secret``/``downwardAPI``/
``projected``/``csi``/``ephemeral`` volumes. Not required (as "restricted" would): an
explicit ``runAsNonRoot: true``, ``allowPrivilegeEscalation: false``, a dropped ``ALL``
or a seccomp profile — the graphrun image runs as uid 10001 and a namespace that enforces
"restricted" (Pod Security Admission) still can.
"""

from __future__ import annotations

from typing import Any

from graphrun.errors import SpecError

HOST_FIELDS = ("hostNetwork", "hostPID", "hostIPC")
VOLUME_TYPES = frozenset(
    {
        "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
        "projected", "secret",
    }
)  # fmt: skip
PROJECTED_SOURCES = frozenset({"configMap", "secret", "downwardAPI"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
    }
)  # fmt: skip
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
CONTROL_PLANE_TAINTS = frozenset(
    {"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"}
)
SYSTEM_PRIORITY = "system-"  # system-node-critical, system-cluster-critical: they preempt
CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
UNCONFINED_ANNOTATIONS = (
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
    "container.apparmor.security.beta.kubernetes.io/",
)


def _refuse(field: str, what: str = "not allowed", hint: str = "") -> SpecError:
    return SpecError(f"{field}: {what} in a GraphJob{hint} (pod policy, docs/kubernetes.md)")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def check_pod_policy(template: dict[str, Any], where: str) -> None:
    """Refuse, naming the field, what the policy above does not allow in ``template``
    (a PodTemplateSpec at ``where``)."""
    _check_annotations(_dict(_dict(template.get("metadata")).get("annotations")), where)
    at = f"{where}.spec"
    spec = _dict(template.get("spec"))
    for name in HOST_FIELDS:
        if spec.get(name):
            raise _refuse(f"{at}.{name}")
    for key in ("serviceAccountName", "serviceAccount"):
        if spec.get(key) not in (None, "", "default"):
            raise _refuse(f"{at}.{key}")
    if spec.get("automountServiceAccountToken"):
        raise _refuse(f"{at}.automountServiceAccountToken")
    if str(spec.get("priorityClassName") or "").startswith(SYSTEM_PRIORITY):
        raise _refuse(f"{at}.priorityClassName", "a system priority class is not allowed")
    if spec.get("nodeName"):
        raise _refuse(f"{at}.nodeName", "not allowed", "; use nodeSelector or affinity")
    _check_tolerations(_list(spec.get("tolerations")), f"{at}.tolerations")
    for i, vol in enumerate(_list(spec.get("volumes"))):
        _check_volume(_dict(vol), f"{at}.volumes[{i}]")
    _check_security_context(_dict(spec.get("securityContext")), f"{at}.securityContext", pod=True)
    for kind in CONTAINER_KINDS:
        for i, container in enumerate(_list(spec.get(kind))):
            _check_container(_dict(container), f"{at}.{kind}[{i}]")


def _check_annotations(annotations: dict[str, Any], where: str) -> None:
    for key, value in annotations.items():
        if str(key).startswith(UNCONFINED_ANNOTATIONS) and str(value).lower() == "unconfined":
            raise _refuse(f"{where}.metadata.annotations[{key}]", "unconfined is not allowed")


def _check_tolerations(tolerations: list[Any], at: str) -> None:
    for i, tol in enumerate(map(_dict, tolerations)):
        if not tol.get("key") and tol.get("operator") == "Exists":
            raise _refuse(
                f"{at}[{i}]", "tolerating every taint (operator Exists, no key) is not allowed"
            )
        if tol.get("key") in CONTROL_PLANE_TAINTS:
            raise _refuse(f"{at}[{i}].key", "tolerating the control plane is not allowed")


def _check_volume(vol: dict[str, Any], at: str) -> None:
    kinds = sorted(set(vol) - {"name"})
    refused = [k for k in kinds if k not in VOLUME_TYPES]
    if refused:
        allowed = ", ".join(sorted(VOLUME_TYPES))
        raise _refuse(
            f"{at}.{refused[0]}",
            "this volume type is not allowed",
            f"; allowed: {allowed}; the job's data goes on spec.sharedVolume",
        )
    for j, source in enumerate(_list(_dict(vol.get("projected")).get("sources"))):
        for kind in sorted(set(_dict(source)) - PROJECTED_SOURCES):
            raise _refuse(f"{at}.projected.sources[{j}].{kind}")


def _check_security_context(sc: dict[str, Any], at: str, *, pod: bool) -> None:
    """The fields a pod's and a container's security contexts share (and, with ``pod``,
    the pod's own)."""
    if sc.get("runAsUser") == 0:
        raise _refuse(f"{at}.runAsUser", "0 (root) is not allowed")
    if sc.get("runAsGroup") == 0:
        raise _refuse(f"{at}.runAsGroup", "0 (root) is not allowed")
    if sc.get("runAsNonRoot") is False:
        raise _refuse(f"{at}.runAsNonRoot", "false is not allowed")
    for profile in ("seccompProfile", "appArmorProfile"):
        if _dict(sc.get(profile)).get("type") == "Unconfined":
            raise _refuse(f"{at}.{profile}.type", "Unconfined is not allowed")
    if _dict(sc.get("windowsOptions")).get("hostProcess"):
        raise _refuse(f"{at}.windowsOptions.hostProcess")
    selinux = _dict(sc.get("seLinuxOptions"))
    for key in ("user", "role"):
        if selinux.get(key):
            raise _refuse(f"{at}.seLinuxOptions.{key}")
    if selinux.get("type", "") not in SELINUX_TYPES:
        raise _refuse(f"{at}.seLinuxOptions.type", f"{selinux['type']!r} is not allowed")
    if not pod:
        return
    if sc.get("fsGroup") == 0:
        raise _refuse(f"{at}.fsGroup", "0 (root) is not allowed")
    if 0 in _list(sc.get("supplementalGroups")):
        raise _refuse(f"{at}.supplementalGroups", "group 0 (root) is not allowed")
    for i, sysctl in enumerate(map(_dict, _list(sc.get("sysctls")))):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            raise _refuse(
                f"{at}.sysctls[{i}].name",
                f"{sysctl.get('name')!r} is not allowed",
                " (not a safe sysctl)",
            )


def _check_container(container: dict[str, Any], at: str) -> None:
    sc = _dict(container.get("securityContext"))
    if sc.get("privileged"):
        raise _refuse(f"{at}.securityContext.privileged")
    if sc.get("allowPrivilegeEscalation"):
        raise _refuse(f"{at}.securityContext.allowPrivilegeEscalation")
    if _dict(sc.get("capabilities")).get("add"):
        raise _refuse(f"{at}.securityContext.capabilities.add")
    if sc.get("procMount") not in (None, "Default"):
        raise _refuse(f"{at}.securityContext.procMount", f"{sc['procMount']!r} is not allowed")
    _check_security_context(sc, f"{at}.securityContext", pod=False)
    for i, port in enumerate(map(_dict, _list(container.get("ports")))):
        if port.get("hostPort"):
            raise _refuse(f"{at}.ports[{i}].hostPort")
    for name in PROBES:
        _check_handler(_dict(container.get(name)), f"{at}.{name}")
    lifecycle = _dict(container.get("lifecycle"))
    for name in ("postStart", "preStop"):
        _check_handler(_dict(lifecycle.get(name)), f"{at}.lifecycle.{name}")


def _check_handler(handler: dict[str, Any], at: str) -> None:
    """A probe or lifecycle hook the kubelet runs from the node: only against the pod."""
    for kind in ("httpGet", "tcpSocket"):
        if _dict(handler.get(kind)).get("host"):
            raise _refuse(f"{at}.{kind}.host", "another host is not allowed")
