"""Lost worker pods of an elastic job (``runtime.elastic``, docs/elastic.md) (pure).

With ``runtime.replicas: 2`` and ``runtime.elastic.minMachines: K``, a worker pod that
fails, is being deleted or disappears while the job trains is a *lost machine* the job
goes on without, as under ``graphrun run`` (:mod:`graphrun.local.elastic`): the
partitions it served are served by their replicas, the other machines' trainers re-form
their group by themselves (:mod:`graphrun.train.elastic`). Only if

* at least K worker machines are left after it (lost ones not counted), and
* the pod does not run trainer 0, which serves the job's TCP rendezvous (losing it
  loses the rendezvous the survivors re-form at).

Otherwise the loss fails the attempt as without elastic (the restart policy applies).

The lost pod is **not made again** while the job runs: a new pod's trainers could not
join the running group (the trainers do not re-admit a machine), and its store servers
would load their partitions from the files without the tensors written since
(docs/replication.md). It comes back with every other pod at the next attempt, if any.
"""

from __future__ import annotations

from typing import Any

from graphrun.job.spec import GraphJob, job_roles, resolve_placement
from graphrun.names import MAIN_TRAINER

NOT_REPLACED = (
    "not replaced while the job runs: the trainers do not re-admit a machine, and new "
    "store servers would miss the tensors written since (docs/elastic.md)"
)


def rendezvous_machine(job: GraphJob) -> str:
    """The machine of trainer 0, which serves the job's TCP rendezvous."""
    names = job.spec.machine_names
    return resolve_placement(job).get(MAIN_TRAINER, names[0])


def why_not_survived(job: GraphJob, machine: str, machines: int, lost: int) -> str | None:
    """Why losing ``machine`` fails the attempt (None: the others go on without it).
    ``machines``: the job's worker machines; ``lost``: how many were lost before."""
    elastic = job.spec.runtime.elastic
    if elastic is None:
        return "runtime.elastic is not set"
    if machine == rendezvous_machine(job):
        return f"{machine} runs trainer 0, which serves the rendezvous"
    left = machines - lost - 1
    if left < elastic.min_machines:
        return f"{left} machines would be left, fewer than runtime.elastic.minMachines"
    return None


def took_over(job: GraphJob, machine: str, lost: list[str]) -> dict[str, Any]:
    """What serves the lost machine's partitions (``partition P`` -> ``store:P:r on M``)
    and which machines' trainers go on (``lost``: every machine lost so far, this one
    included), as the ``machine_lost`` event of ``graphrun run`` says it."""
    placement = resolve_placement(job)
    roles = [r.id for r in job_roles(job.spec)]
    primaries = {
        r.index for r in roles
        if r.kind == "store" and r.replica == 0 and r.sub == 0 and placement[r] == machine
    }  # fmt: skip
    partitions = {
        f"partition {r.index}": f"{r} on {placement[r]}"
        for r in roles
        if r.kind == "store" and r.replica > 0 and r.index in primaries
        and placement[r] not in lost
    }  # fmt: skip
    trainers = sorted({placement[r] for r in roles if r.kind == "trainer"} - set(lost))
    return {"partitions": dict(sorted(partitions.items())), "trainers": trainers}


def lost_entry(
    job: GraphJob, pod: str, machine: str, how: str, exit_code: int | None, time: str,
    lost: list[str],
) -> dict[str, Any]:  # fmt: skip
    """One entry of ``status.lostMachines``."""
    return {
        "machine": machine,
        "pod": pod,
        "how": how,  # "failed", "deleted" (being deleted) or "disappeared"
        "exitCode": exit_code,
        "time": time,
        "tookOver": took_over(job, machine, lost),
        "replaced": False,
        "note": NOT_REPLACED,
    }


def describe(entry: dict[str, Any], machines: int, lost: int, min_machines: int) -> str:
    """The event's and the Running condition's message for a lost machine."""
    code = entry["exitCode"]
    how = entry["how"] + (f" (exit code {code})" if code is not None else "")
    over = entry["tookOver"]
    served = "; ".join(f"{p} served by {by}" for p, by in over["partitions"].items())
    return (
        f"machine {entry['machine']} lost: pod {entry['pod']} {how}; "
        f"{served or 'it served no primary'}; trainers on {', '.join(over['trainers'])} go on "
        f"({machines - lost} of {machines} machines, minMachines {min_machines}); the pod is "
        f"{NOT_REPLACED}"
    )
