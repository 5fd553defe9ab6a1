"""kopf handlers: thin shells around :func:`graphrun.operator.reconcile.reconcile`.

Every trigger — the GraphJob created, resumed or its spec changed, a periodic timer,
any event of one of its pods — runs the same :func:`reconcile_job`: read the GraphJob
and its children from the API, compute the plan, carry it out, write the status. One
job is reconciled by one thread at a time (a lock per job in :class:`OperatorContext`),
so two triggers never act on the same observation twice.

An invalid spec is reported as a ``Failed`` condition (reason ``InvalidSpec``, the
field named in the message) and, from the create/update handlers, as a
``kopf.PermanentError``: kopf does not retry it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
import urllib3

from graphrun.errors import KubeError, SpecError
from graphrun.job.gpus import split_document
from graphrun.job.spec import parse_job
from graphrun.machine.stopmark import JOB_WIDE, STOP_ANNOTATION, STOP_AT_ANNOTATION
from graphrun.operator import crd
from graphrun.operator import layout as L
from graphrun.operator import queueing as Q
from graphrun.operator.builders import check_supported
from graphrun.operator.keys import curve_keypair
from graphrun.operator.kube import Kube
from graphrun.operator.observe import observe
from graphrun.operator.plan import Create, Delete, DeleteGraphJob, Emit, MarkStop, Plan
from graphrun.operator.reconcile import reconcile, reject
from graphrun.operator.status import read_status, settled

log = logging.getLogger("graphrun.operator")


@dataclass
class OperatorContext:
    """Everything the handlers need, built once at the edge (``graphrun operator``)."""

    kube: Kube
    config: L.OperatorConfig = field(default_factory=L.OperatorConfig)
    resync_seconds: float = 10.0
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    _running: set[tuple[str, str]] = field(default_factory=set)
    _again: set[tuple[str, str]] = field(default_factory=set)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _wakeups: dict[tuple[str, str], threading.Timer] = field(default_factory=dict)

    def claim(self, key: tuple[str, str]) -> bool:
        """True: the caller reconciles ``key`` now. False: another thread is doing it
        and will run once more when it is done (bursts of triggers coalesce)."""
        with self._guard:
            if key in self._running:
                self._again.add(key)
                return False
            self._running.add(key)
            return True

    def release(self, key: tuple[str, str]) -> bool:
        """Done with ``key``; True if a trigger came meanwhile and it must run again."""
        with self._guard:
            if key in self._again:
                self._again.discard(key)
                return True
            self._running.discard(key)
            return False

    def wake_up(self, key: tuple[str, str], delay: float | None) -> None:
        """Reconcile ``key`` again after ``delay`` seconds (a deadline, a TTL), sooner
        than the periodic resync would. Replaces the job's earlier wake-up."""
        with self._guard:
            old = self._wakeups.pop(key, None)
            if old is not None:
                old.cancel()
            if delay is None or delay >= self.resync_seconds:
                return  # the resync timer comes first
            timer = threading.Timer(max(delay, 0.0) + 0.05, self._woken, args=key)
            timer.daemon = True
            self._wakeups[key] = timer
            timer.start()

    def _woken(self, namespace: str, name: str) -> None:
        with self._guard:
            self._wakeups.pop((namespace, name), None)
        try:
            reconcile_soon(self, namespace, name)
        except Exception as exc:  # the API server is away: the next trigger retries
            log.warning("GraphJob %s/%s: %s", namespace, name, exc)

    def close(self) -> None:
        """Cancel the pending wake-ups (the operator is stopping)."""
        with self._guard:
            for timer in self._wakeups.values():
                timer.cancel()
            self._wakeups.clear()


def reconcile_soon(ctx: OperatorContext, namespace: str, name: str) -> None:
    """Reconcile now, or leave it to the thread already reconciling this job; then
    arrange the wake-up the plan asks for (``Plan.requeue_after``)."""
    key = (namespace, name)
    if not ctx.claim(key):
        return
    try:
        while True:
            plan = reconcile_job(ctx, namespace, name)
            if not ctx.release(key):
                ctx.wake_up(key, plan.requeue_after if plan else None)
                return
    except BaseException:
        while ctx.release(key):
            pass
        raise


def on_spec_change(ctx: OperatorContext, namespace: str, name: str) -> None:
    """A GraphJob was created, resumed or its spec changed: reconcile it. An invalid
    spec is permanent (kopf does not retry); the API server failing or out of reach is
    temporary: kopf retries in 5 s instead of its default minute."""
    try:
        reconcile_soon(ctx, namespace, name)
    except SpecError as exc:
        raise kopf.PermanentError(str(exc)) from exc
    except (KubeError, urllib3.exceptions.HTTPError, OSError) as exc:
        raise kopf.TemporaryError(str(exc), delay=min(5.0, ctx.resync_seconds)) from exc


def _job_document(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in obj}


def reconcile_job(ctx: OperatorContext, namespace: str, name: str) -> Plan | None:
    """Read, reconcile and act for one GraphJob. Raises SpecError for an invalid spec
    (after recording it in the status). Callers make sure one job is reconciled by one
    thread at a time (:func:`reconcile_soon`)."""
    obj = ctx.kube.get_graphjob(namespace, name)
    if obj is None or obj.get("metadata", {}).get("deletionTimestamp"):
        return None
    now = ctx.clock()
    raw = obj.get("status") or {}
    status = read_status(raw)
    owner = L.Owner(name, namespace, obj["metadata"]["uid"])
    try:
        doc = split_document(_job_document(obj), ctx.config.gpus_per_node)
        job = parse_job(doc, source=f"GraphJob {namespace}/{name}")
        check_supported(job)
    except SpecError as exc:
        plan = reject(status, "InvalidSpec", str(exc), now)
        _carry_out(ctx, owner, raw, plan, now)
        raise
    if settled(job, status) or not L.managed_here(job):
        return None  # finished and clean, or another controller's (spec.managedBy)
    gang = job.spec.run_policy.scheduling_policy
    queued = Q.group_name(job) if Q.queue_name(job) else None
    children = ctx.kube.list_children(namespace, name, gang.provider if gang else None, queued)
    seen = observe(children, name, owner.uid)
    plan = reconcile(job, owner, ctx.config, status, seen, now, curve_keypair())
    _carry_out(ctx, owner, raw, plan, now)
    return plan


def _carry_out(
    ctx: OperatorContext, owner: L.Owner, old: dict[str, Any], plan: Plan, now: datetime
) -> None:
    kube, ns = ctx.kube, owner.namespace
    for action in plan.actions:
        if isinstance(action, Create) and action.obj["kind"] in ("PodGroup", "Workload"):
            try:
                kube.create(ns, action.obj)
            except KubeError as exc:  # that gang scheduler (or API) is not installed
                kube.event(owner, "Warning", "PodGroupNotCreated", str(exc), now)
        elif isinstance(action, Create):
            kube.create(ns, action.obj)
        elif isinstance(action, Delete):
            kube.delete(ns, action.kind, action.name)
        elif isinstance(action, MarkStop):
            marks = {STOP_ANNOTATION: JOB_WIDE, STOP_AT_ANNOTATION: action.at}
            kube.annotate_pod(ns, action.name, marks)
        elif isinstance(action, Emit):
            kube.event(owner, action.type, action.reason, action.message, now)
    if plan.status != {k: old.get(k) for k in plan.status}:
        kube.patch_status(ns, owner.name, plan.status)
    if any(isinstance(a, DeleteGraphJob) for a in plan.actions):
        log.info("GraphJob %s/%s: ttlSecondsAfterFinished passed, deleting", ns, owner.name)
        kube.delete_graphjob(ns, owner.name)


def connection_info(cfg: Any) -> kopf.ConnectionInfo:
    """kopf logs in exactly as the operator's client does (same kubeconfig or service
    account; a rotated service-account token is re-read on every login)."""
    auth = cfg.get_api_key_with_prefix("authorization") or ""
    scheme, _, token = auth.partition(" ")
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert or None,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=(scheme or None) if token else None,
        token=token or None,
        certificate_path=cfg.cert_file or None,
        private_key_path=cfg.key_file or None,
    )


def register(registry: kopf.OperatorRegistry, ctx: OperatorContext) -> None:
    """Add the handlers to ``registry``."""
    res = (crd.GROUP, crd.VERSION, crd.PLURAL)

    @kopf.on.cleanup(registry=registry)
    def cleanup(**_: Any) -> None:
        ctx.close()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(ctx.kube.api.configuration)

    @kopf.on.create(*res, registry=registry)
    @kopf.on.resume(*res, registry=registry)
    @kopf.on.update(*res, field="spec", registry=registry)
    def changed(name: str, namespace: str | None, **_: Any) -> None:
        on_spec_change(ctx, namespace or "default", name)

    @kopf.timer(*res, interval=ctx.resync_seconds, registry=registry)
    def resync(name: str, namespace: str | None, **_: Any) -> None:
        # An invalid spec is recorded as Failed; the create/update handler raised it.
        with contextlib.suppress(SpecError):
            reconcile_soon(ctx, namespace or "default", name)

    @kopf.on.event(
        "v1", "pods", labels={L.LABEL_JOB: kopf.PRESENT, **L.MANAGED_BY}, registry=registry
    )
    @kopf.on.event(
        "batch", "v1", "jobs", labels={L.LABEL_JOB: kopf.PRESENT, **L.MANAGED_BY}, registry=registry
    )
    def child_changed(labels: Mapping[str, str], namespace: str | None, **_: Any) -> None:
        # A pod's phase or a partitioner Job's condition: the Job is Complete only after
        # its pod Succeeded, so both are watched (else the next resync moves the job on).
        with contextlib.suppress(SpecError):
            reconcile_soon(ctx, namespace or "default", labels[L.LABEL_JOB])
