"""The spec's run policy: restarts, deadlines, clean-up, gang scheduling, and the
Kubernetes replica groups' success and failure policies."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from graphrun.job.spec.base import MAX_RESTARTS, MAX_ROLES, MAX_SECONDS, SpecModel


class SchedulingPolicy(SpecModel):
    """Gang scheduling: the operator emits a PodGroup for Volcano or scheduler-plugins, or
    a Workload and its PodGroups (scheduling.k8s.io/v1alpha2, Kubernetes 1.35+)."""

    provider: Literal["volcano", "scheduler-plugins", "workload-api"] = Field(
        default="volcano", description="the gang scheduler"
    )
    min_available: int | None = Field(
        default=None, gt=0, le=MAX_ROLES,
        description="pods that must be scheduled together (default: all)",
    )  # fmt: skip
    queue: str | None = Field(default=None, description="Volcano queue")
    priority_class: str | None = Field(
        default=None, description="the pods' PriorityClass (not a system one)"
    )
    schedule_timeout_seconds: int | None = Field(
        default=None, gt=0, le=MAX_SECONDS,
        description="scheduler-plugins: seconds the group may wait to be scheduled",
    )  # fmt: skip


ReplicaGroup = Literal["partitioner", "worker", "launcher"]
TargetGroup = Literal["worker", "launcher"]


def _all_targets() -> list[TargetGroup]:
    return ["worker", "launcher"]


class SuccessPolicy(SpecModel):
    """Which role groups' completion means the job succeeded (Kubernetes, as JobSet's)."""

    target_replicas: list[TargetGroup] = Field(
        default_factory=_all_targets,
        min_length=1,
        description="the job succeeds once every pod of these groups succeeded (the "
        "others still running are stopped by cleanPodPolicy); default: the workers and "
        "the launcher, if any",
    )


class FailurePolicy(SpecModel):
    """Restart budgets per role group (Kubernetes), within backoffLimit."""

    restart_limits: dict[ReplicaGroup, int] = Field(
        default_factory=dict,
        description="restarts a failure of this group may cause (partitioner, worker, "
        "launcher); once spent, its next failure fails the job (RestartLimitExceeded)",
    )

    @model_validator(mode="after")
    def _non_negative(self) -> FailurePolicy:
        for group, n in self.restart_limits.items():
            if not 0 <= n <= MAX_RESTARTS:
                raise ValueError(f"restartLimits.{group}: {n} is not in [0, {MAX_RESTARTS}]")
        return self


class RunPolicy(SpecModel):
    """What happens on failure, how long a job may run and what is cleaned up."""

    backoff_limit: int = Field(
        default=0, ge=0, le=MAX_RESTARTS, description="restarts from the last checkpoint"
    )
    active_deadline_seconds: int | None = Field(
        default=None, gt=0, le=MAX_SECONDS, description="longest the job may run, from its start"
    )
    clean_pod_policy: Literal["Running", "All", "None"] = Field(
        default="Running",
        description="pods deleted when the job finishes: still running ones, all, or none",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=MAX_SECONDS,
        description="delete the finished job after this long (Kubernetes)",
    )
    suspend: bool = Field(
        default=False,
        description="true: stop every pod and keep the partitions; false again resumes",
    )
    startup_deadline_seconds: int = Field(
        default=600,
        gt=0,
        le=MAX_SECONDS,
        description="longest a pod may stay pending or pulling its image",
    )
    scheduling_policy: SchedulingPolicy | None = None
    success_policy: SuccessPolicy | None = None
    failure_policy: FailurePolicy | None = None
