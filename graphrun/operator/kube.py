"""The operator's only contact with the Kubernetes API (the official client).

Responses are read as plain JSON (``_preload_content=False``), so reconcile sees the
same dicts the API sent. API errors become :class:`KubeError`; "already exists" on
create and "not found" on delete are what the caller wanted anyway and pass silently.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from graphrun.errors import KubeError
from graphrun.job.workflow import rfc3339
from graphrun.operator import crd
from graphrun.operator import layout as L
from graphrun.operator import queueing as Q

# What this module asks of the API for the objects that a GraphJob owns besides its
# pods, batch Job, Secret, ConfigMap and Service: the operator's ClusterRole and Role
# grant exactly these verbs (tests/operator/test_deploy.py). Created with an owner
# reference, they are removed by the garbage collector, so none is deleted here.
RIGHTS: dict[tuple[str, str], frozenset[str]] = {
    # patch: the stop mark on an elastic job's worker pods (annotate_pod)
    ("", "pods"): frozenset({"get", "list", "watch", "create", "delete", "patch"}),
    ("networking.k8s.io", "networkpolicies"): frozenset({"list", "create"}),  # list_children
    ("scheduling.k8s.io", "workloads"): frozenset({"list", "create"}),  # workload-api gang
    ("scheduling.k8s.io", "podgroups"): frozenset({"list", "create"}),
    ("kueue.x-k8s.io", "workloads"): frozenset({"get"}),  # _kueue_workload: why queued
}

# custom objects the operator makes: (apiVersion, kind) -> plural
CUSTOM_PLURALS = {
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): "podgroups",
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): "podgroups",
    ("scheduling.k8s.io/v1alpha2", "Workload"): "workloads",
    ("scheduling.k8s.io/v1alpha2", "PodGroup"): "podgroups",
}
# the gang scheduler's objects, per runPolicy.schedulingPolicy.provider
GANG_OBJECTS = {
    "volcano": [("scheduling.volcano.sh/v1beta1", "PodGroup")],
    "scheduler-plugins": [("scheduling.x-k8s.io/v1alpha1", "PodGroup")],
    "workload-api": [
        ("scheduling.k8s.io/v1alpha2", "Workload"),
        ("scheduling.k8s.io/v1alpha2", "PodGroup"),
    ],
}


def _body(resp: Any) -> dict[str, Any] | None:
    """The JSON object a call answered (None for anything else)."""
    body = json.loads(resp.data or b"null")
    return body if isinstance(body, dict) else None


def _object(resp: Any, what: str) -> dict[str, Any]:
    """The object a get answered; a KubeError naming it for any other answer."""
    body = _body(resp)
    if body is None:
        raise KubeError(f"get {what}: the answer is not an object")
    return body


@dataclass
class Kube:
    """Calls for one operator process; ``api`` is built at the edge (CLI or test)."""

    api: client.ApiClient

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.networking = client.NetworkingV1Api(self.api)

    # --- the GraphJob ---

    def get_graphjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _object(
                self.custom.get_namespaced_custom_object(
                    crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name, _preload_content=False
                ),
                f"GraphJob {namespace}/{name}",
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise KubeError(f"get GraphJob {namespace}/{name}: {exc.status} {exc.reason}") from exc

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object_status(
                crd.GROUP,
                crd.VERSION,
                namespace,
                crd.PLURAL,
                name,
                {"status": status},
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status == 404:
                return  # deleted meanwhile
            raise KubeError(f"patch status of GraphJob {namespace}/{name}: {exc.status}") from exc

    def delete_graphjob(self, namespace: str, name: str) -> None:
        self._quiet_delete(
            lambda: self.custom.delete_namespaced_custom_object(
                crd.GROUP,
                crd.VERSION,
                namespace,
                crd.PLURAL,
                name,
                propagation_policy="Background",
                _preload_content=False,
            ),
            f"GraphJob {namespace}/{name}",
        )

    # --- children ---

    def list_children(
        self, namespace: str, job: str, gang: str | None = None, kueue_group: str | None = None
    ) -> list[dict[str, Any]]:
        """Every object labelled with the job's name, each with its ``kind`` set
        (PodGroups of the ``gang`` scheduler too, when given; Kueue's Workload of the
        pod group ``kueue_group``, when given and readable)."""
        selector = f"{L.LABEL_JOB}={job}"
        calls = [
            ("Pod", self.core.list_namespaced_pod),
            ("Secret", self.core.list_namespaced_secret),
            ("ConfigMap", self.core.list_namespaced_config_map),
            ("Service", self.core.list_namespaced_service),
            ("Job", self.batch.list_namespaced_job),
            ("NetworkPolicy", self.networking.list_namespaced_network_policy),
        ]
        out: list[dict[str, Any]] = []
        for kind, call in calls:
            try:
                items = _body(call(namespace, label_selector=selector, _preload_content=False))
            except ApiException as exc:
                raise KubeError(f"list {kind}s in {namespace}: {exc.status} {exc.reason}") from exc
            out += [{**item, "kind": kind} for item in (items or {}).get("items") or []]
        for api_version, kind in GANG_OBJECTS.get(gang or "", []):
            group, version = api_version.split("/")
            plural = CUSTOM_PLURALS[api_version, kind]
            try:
                items = _body(
                    self.custom.list_namespaced_custom_object(
                        group,
                        version,
                        namespace,
                        plural,
                        label_selector=selector,
                        _preload_content=False,
                    )
                )
            except ApiException:
                items = {}  # that scheduler is not installed: creating it will say so
            out += [{**item, "kind": kind} for item in (items or {}).get("items") or []]
        if kueue_group is not None:
            out += self._kueue_workload(namespace, kueue_group)
        return out

    def _kueue_workload(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """Kueue's Workload of a pod group (why it is not admitted), if there is one and
        the operator may read it (Kueue not installed, or no RBAC: nothing)."""
        group, version, plural = Q.WORKLOAD_API
        try:
            wl = _body(
                self.custom.get_namespaced_custom_object(
                    group, version, namespace, plural, name, _preload_content=False
                )
            )
        except ApiException:
            return []
        return [{**wl, "kind": "Workload"}] if isinstance(wl, dict) else []

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods with labels matching ``selector`` (``key=value``)."""
        try:
            body = _body(
                self.core.list_namespaced_pod(
                    namespace, label_selector=selector, _preload_content=False
                )
            )
        except ApiException as exc:
            raise KubeError(f"list pods in {namespace}: {exc.status} {exc.reason}") from exc
        return list((body or {}).get("items") or [])

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A batch Job, or None when there is none of that name."""
        try:
            return _object(
                self.batch.read_namespaced_job(name, namespace, _preload_content=False),
                f"Job {namespace}/{name}",
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise KubeError(f"get Job {namespace}/{name}: {exc.status} {exc.reason}") from exc

    def create(self, namespace: str, obj: dict[str, Any]) -> None:
        kind = obj["kind"]
        creators: dict[str, Callable[..., Any]] = {
            "Pod": self.core.create_namespaced_pod,
            "Secret": self.core.create_namespaced_secret,
            "ConfigMap": self.core.create_namespaced_config_map,
            "Service": self.core.create_namespaced_service,
            "Job": self.batch.create_namespaced_job,
            "NetworkPolicy": self.networking.create_namespaced_network_policy,
        }
        try:
            if kind in creators:
                creators[kind](namespace, obj, _preload_content=False)
            else:
                group, version = obj["apiVersion"].split("/")
                self.custom.create_namespaced_custom_object(
                    group,
                    version,
                    namespace,
                    CUSTOM_PLURALS[obj["apiVersion"], kind],
                    obj,
                    _preload_content=False,
                )
        except ApiException as exc:
            if exc.status == 409:
                return  # made by an earlier pass
            name = obj["metadata"]["name"]
            raise KubeError(f"create {kind} {namespace}/{name}: {exc.status} {exc.reason}") from exc

    def delete(self, namespace: str, kind: str, name: str) -> None:
        deleters: dict[str, Callable[..., Any]] = {
            "Pod": self.core.delete_namespaced_pod,
            "Job": self.batch.delete_namespaced_job,
            "ConfigMap": self.core.delete_namespaced_config_map,
            "Service": self.core.delete_namespaced_service,
            "Secret": self.core.delete_namespaced_secret,
        }
        self._quiet_delete(
            lambda: deleters[kind](
                name, namespace, propagation_policy="Background", _preload_content=False
            ),
            f"{kind} {namespace}/{name}",
        )

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge ``annotations`` into pod ``name``'s (a pod already gone: nothing to do)."""
        body = {"metadata": {"annotations": annotations}}
        try:
            self.core.patch_namespaced_pod(
                name, namespace, body, _content_type="application/merge-patch+json",
                _preload_content=False,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status != 404:
                raise KubeError(
                    f"annotate Pod {namespace}/{name}: {exc.status} {exc.reason}"
                ) from exc

    def _quiet_delete(self, call: Any, what: str) -> None:
        try:
            call()
        except ApiException as exc:
            if exc.status != 404:
                raise KubeError(f"delete {what}: {exc.status} {exc.reason}") from exc

    # --- events ---

    def event(self, owner: L.Owner, type_: str, reason: str, message: str, now: datetime) -> None:
        """A Kubernetes event on the GraphJob (best effort: never fails the reconcile)."""
        stamp = rfc3339(now)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{owner.name}.{secrets.token_hex(8)}",
                "namespace": owner.namespace,
                "labels": L.labels(owner.name),
            },
            "involvedObject": {
                "apiVersion": f"{crd.GROUP}/{crd.VERSION}",
                "kind": "GraphJob",
                "name": owner.name,
                "namespace": owner.namespace,
                "uid": owner.uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "source": {"component": "graphrun-operator"},
            "reportingComponent": "graphrun-operator",
        }
        with contextlib.suppress(ApiException):
            self.core.create_namespaced_event(
                owner.namespace, cast(Any, body), _preload_content=False
            )
