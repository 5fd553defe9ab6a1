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
from graphrun.job.workflow import Phase, progress, rfc3339
from graphrun.names import RoleName
from graphrun.operator import builders as B
from graphrun.operator import layout as L
from graphrun.operator.plan import Create, Delete, Emit, Run
from graphrun.operator.status import LostHow, LostMachine
from graphrun.record import TookOver

REPLACED = (
    "made again once gone, with GRAPHRUN_ELASTIC_JOIN=1: its trainers join at the next "
    "epoch boundary; its store servers are not started again (the replicas serve)"
)
NOT_REPLACED = "not made again (runtime.elastic.maxRejoins reached): the job goes on without it"


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


def took_over(
    job: GraphJob, machine: str, lost: list[str], back: list[str] | None = None
) -> TookOver:
    """What serves the lost machine's partitions and which machines' trainers go on, by
    the job core's rule (:func:`graphrun.job.elastic.took_over`), as the ``machine_lost``
    event of ``graphrun run`` says it (``lost``: every machine lost so far in the
    attempt, this one included; ``back``: those of them made again, whose trainers are
    back but not their store servers)."""
    placement = resolve_placement(job)
    trainers = [placement[r.id] for r in job_roles(job.spec) if r.id.kind == "trainer"]
    away = set(lost) - set(back or ())
    return rule.took_over(store_machines(job), trainers, machine, lost, away)


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


class Elastic:
    """The elastic hook: while the job trains, a lost worker pod the job survives is
    noted (:func:`note_lost_machines`) and made again (:func:`replace_lost_machines`)
    before the phase's handler looks at the pods."""

    def stops(self, run: Run) -> bool:
        return False

    def before(self, run: Run) -> None:
        if run.state.phase is Phase.TRAINING:
            note_lost_machines(run)

    def after(self, run: Run) -> None:
        pass


def lost_indices(run: Run) -> set[int]:
    """The worker indices of machines lost and not made again (yet)."""
    names = run.job.spec.machine_names
    return {names.index(m) for m in lost_now(run.lost) if m in names}


def note_lost_machines(run: Run) -> None:
    """runtime.elastic: a worker pod that failed, is being deleted or disappeared while
    the job trains is a lost machine the others go on without, when :mod:`.elastic`
    allows it (recorded in ``status.lostMachines``, an event and the Running condition;
    the pod is made again once gone: :func:`replace_lost_machines`). Any other loss is
    left to fail the attempt."""
    elastic = run.job.spec.runtime.elastic
    if elastic is None:
        return
    have, lost = run.observed.workers(), lost_indices(run)
    indices = L.worker_indices(run.job)
    for i in indices:
        pod = have.get(i)
        if i in lost or (pod is not None and pod.phase != "Failed" and not pod.deleting):
            continue
        machine = run.job.spec.machine_names[i]
        stores_gone = [e.machine for e in run.lost]
        why = why_not_survived(run.job, machine, len(indices), len(lost), stores_gone)
        if why is not None:
            continue
        how: LostHow
        if pod is None:
            name, how, code = L.worker_name(run.owner.name, i), "disappeared", None
        else:
            how = "failed" if pod.phase == "Failed" else "deleted"
            name, code = pod.name, pod.exit_code
        gone = [*dict.fromkeys(e.machine for e in run.lost), machine]
        back = [m for m in gone if m not in lost_now(run.lost) and m != machine]
        entry = lost_entry(run.job, name, machine, how, code, rfc3339(run.now), gone, back)
        rejoin = rule.may_rejoin(elastic, replaced_count(run.lost, machine))
        run.lost.append(entry)
        lost.add(i)
        message = describe(entry, len(indices), len(lost), elastic.min_machines, rejoin)
        run.actions.append(Emit("Warning", "MachineLost", message))
        run.state = progress(run.state, message)
    replace_lost_machines(run)


def replace_lost_machines(run: Run) -> None:
    """Make a lost machine's pod again once the lost one is gone (a failed pod is
    deleted first), under the same name (its DNS name in the hosts file), in join mode
    (:func:`graphrun.operator.builders.build_worker`): its trainers join at the next
    epoch boundary; its store servers are not started again."""
    have = run.observed.workers()
    lost = lost_indices(run)
    if any(p.phase == "Failed" for i, p in have.items() if i not in lost):
        return  # a loss the job does not survive: the attempt fails (_pod_problems)
    names = run.job.spec.machine_names
    resume = run.state.resumes
    elastic = run.job.spec.runtime.elastic
    for n, entry in enumerate(run.lost):
        if entry.replaced:
            continue
        if not rule.may_rejoin(elastic, replaced_count(run.lost[:n], entry.machine)):
            continue  # runtime.elastic.maxRejoins reached: it stays lost
        i = names.index(entry.machine)
        pod = have.get(i)
        if pod is not None:
            if not pod.deleting:  # failed: its logs go with it (the event keeps the why)
                run.actions.append(Delete("v1", "Pod", pod.name))
            continue
        obj = B.build_worker(run.job, run.owner, run.config, i, resume, join=True)
        run.actions.append(Create(obj))
        entry.replaced, entry.replacement = True, obj["metadata"]["name"]
        run.replacing.add(i)
        message = describe_replacement(entry)
        run.actions.append(Emit("Normal", "MachineReplaced", message))
        run.state = progress(run.state, message)
