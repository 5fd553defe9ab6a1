"""Lost worker pods of an elastic job (``runtime.elastic``, docs/elastic.md) (pure).

With ``runtime.replicas: 2`` and ``runtime.elastic.minMachines: K``, a worker pod that
fails, is being deleted or disappears while the job trains is a *lost machine* the job
goes on without, as under ``graphrun run`` (:mod:`graphrun.local.elastic`): the
partitions it served are served by their replicas, the other machines' trainers re-form
their group by themselves (:mod:`graphrun.train.elastic`). Whether it may is the job
core's rule, the same for both backends (:func:`graphrun.job.elastic.why_not_survived`:
``minMachines`` left, every partition with a copy on a machine whose store servers are
not gone); otherwise the loss fails the attempt as without elastic (the restart policy
applies).
Trainer 0's machine is lost like any other: the job's rendezvous, where the survivors
re-form, is served by its own pod (:mod:`.rendezvous`), not by trainer 0; losing that
pod fails the attempt.

Once the lost pod is gone (a failed one is deleted first), the operator makes it again,
``runtime.elastic.maxRejoins`` times an attempt at most
(:func:`graphrun.job.elastic.may_rejoin`; past that it stays lost),
under the same name — the name is the machine's DNS name in the job's hosts file — with
``GRAPHRUN_ELASTIC_JOIN=1`` (:func:`graphrun.operator.builders.build_worker`, ``join``):
its worker runs only the machine's trainers, which ask to be admitted at the next epoch
boundary. Its store servers are not started again: their partitions' replicas serve,
and a new primary would miss the tensors written since it was lost (docs/elastic.md).
A replacement that is lost again is a lost machine again, and made again while it
has re-joins left.
"""

from __future__ import annotations

from graphrun.job import elastic as rule
from graphrun.job.spec import GraphJob, job_roles, resolve_placement
from graphrun.names import RoleName
from graphrun.operator import queueing as Q
from graphrun.operator.status import LostHow, LostMachine, TookOver

REPLACED = (
    "made again once gone, with GRAPHRUN_ELASTIC_JOIN=1: its trainers join at the next "
    "epoch boundary; its store servers are not started again (the replicas serve)"
)
NOT_REPLACED = "not made again (runtime.elastic.maxRejoins reached): the job goes on without it"


def uses_stop_mark(job: GraphJob) -> bool:
    """Whether the job's worker pods tell a one-pod deletion from a stop of the whole job
    (:mod:`graphrun.machine.stopmark`): with ``runtime.elastic``, the operator annotates
    the pods ``graphrun.io/stop: job`` before it deletes them all (suspend, restart), and
    a worker whose pod is deleted without it leaves alone, so the others go on. Not for a
    job queued by Kueue: Kueue deletes the pods of an eviction itself, unannounced, and
    its trainers must then checkpoint, so every SIGTERM there stops the whole job."""
    return job.spec.runtime.elastic is not None and Q.queue_name(job) is None


def why_not_survived(
    job: GraphJob, machine: str, machines: int, lost: int, stores_gone: list[str]
) -> str | None:
    """Why losing ``machine`` fails the attempt (None: the others go on without it), by
    the job core's rule (:func:`graphrun.job.elastic.why_not_survived`). ``machines``:
    the job's worker machines; ``lost``: how many are lost (not replaced) now;
    ``stores_gone``: the machines lost in the attempt (a replacement starts no store
    server)."""
    return rule.why_not_survived(
        job.spec.runtime.elastic, machine, machines, lost, store_machines(job), stores_gone
    )


def store_machines(job: GraphJob) -> dict[RoleName, str]:
    """Every store server role of the job and its machine."""
    placement = resolve_placement(job)
    return {r.id: placement[r.id] for r in job_roles(job.spec) if r.id.kind == "store"}


def primaries(job: GraphJob, machine: str) -> list[int]:
    """The partitions whose primary store server runs on ``machine``."""
    return sorted({
        r.index for r, m in store_machines(job).items()
        if r.replica == 0 and r.sub == 0 and m == machine
    })  # fmt: skip


def took_over(
    job: GraphJob, machine: str, lost: list[str], back: list[str] | None = None
) -> TookOver:
    """What serves the lost machine's partitions (``partition P`` -> ``store:P:r on M``)
    and which machines' trainers go on (``lost``: every machine lost so far in the
    attempt, this one included; ``back``: those of them made again, whose trainers are
    back but not their store servers), as the ``machine_lost`` event of ``graphrun run``
    says it."""
    placement = resolve_placement(job)
    roles = [r.id for r in job_roles(job.spec)]
    served = set(primaries(job, machine))
    partitions = {
        f"partition {r.index}": f"{r} on {placement[r]}"
        for r in roles
        if r.kind == "store" and r.replica > 0 and r.index in served
        and placement[r] not in lost
    }  # fmt: skip
    away = set(lost) - set(back or ())
    trainers = sorted({placement[r] for r in roles if r.kind == "trainer"} - away)
    return TookOver(dict(sorted(partitions.items())), trainers)


def lost_entry(
    job: GraphJob, pod: str, machine: str, how: LostHow, exit_code: int | None, time: str,
    lost: list[str], back: list[str] | None = None,
) -> LostMachine:  # fmt: skip
    """One entry of ``status.lostMachines`` (``lost``, ``back``: as for :func:`took_over`)."""
    over = took_over(job, machine, lost, back)
    return LostMachine(
        machine=machine, pod=pod, how=how, exit_code=exit_code, time=time, took_over=over
    )


def lost_now(entries: list[LostMachine]) -> list[str]:
    """The machines lost and not (yet) made again, from ``status.lostMachines``."""
    return [e.machine for e in entries if not e.replaced]


def replaced_count(entries: list[LostMachine], machine: str) -> int:
    return sum(1 for e in entries if e.machine == machine and e.replaced)


def describe(entry: LostMachine, machines: int, lost: int, min_machines: int, rejoin: bool) -> str:
    """The event's and the Running condition's message for a lost machine (``rejoin``:
    whether its pod is made again, :func:`graphrun.job.elastic.may_rejoin`)."""
    code = entry.exit_code
    how = entry.how + (f" (exit code {code})" if code is not None else "")
    over = entry.took_over
    served = "; ".join(f"{p} served by {by}" for p, by in over.partitions.items())
    return (
        f"machine {entry.machine} lost: pod {entry.pod} {how}; "
        f"{served or 'it served no primary'}; trainers on {', '.join(over.trainers)} go on "
        f"({machines - lost} of {machines} machines, minMachines {min_machines}); the pod is "
        f"{REPLACED if rejoin else NOT_REPLACED}"
    )


def describe_replacement(entry: LostMachine) -> str:
    """The event's and the Running condition's message for a replacement pod made."""
    return (
        f"machine {entry.machine} replaced: pod {entry.replacement} made again with "
        f"GRAPHRUN_ELASTIC_JOIN=1; its trainers join at the next epoch boundary; its store "
        f"servers are not started again (the replicas serve their partitions)"
    )
