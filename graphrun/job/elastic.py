"""May an elastic job go on without a lost machine? One rule for both backends (pure).

``graphrun run`` (:mod:`graphrun.local.elastic`) and the operator
(:mod:`graphrun.operator.elastic`) lose machines differently — a worker process ends, a
worker pod fails or disappears — but decide the same two questions with these
functions, so a spec means the same on both (docs/elastic.md):

* :func:`why_not_survived`: the job goes on without machine ``m`` only while at least
  ``runtime.elastic.minMachines`` machines are left and every partition still has a
  store server on a machine whose servers are not gone. A machine lost earlier in the
  attempt counts as gone for its stores even once it is back: a machine started again
  (re-joined, a replacement pod) runs its trainers only.
* :func:`took_over`: what the ``machine_lost`` event (and the operator's
  ``status.lostMachines``) says: the replicas that serve the lost machine's partitions
  and the machines whose trainers go on.
* :func:`may_rejoin`: a lost machine is started again, to join at an epoch boundary, at
  most ``runtime.elastic.maxRejoins`` times an attempt; past that it stays lost (the
  job goes on without it, as long as :func:`why_not_survived` allows).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from graphrun.job.spec.runtime import ElasticSpec
from graphrun.names import RoleName
from graphrun.record import TookOver


def why_not_survived(
    elastic: ElasticSpec | None,
    machine: str,
    machines: int,
    lost: int,
    stores: Mapping[RoleName, str],
    stores_gone: Collection[str] = (),
    starting: Collection[str] = (),
) -> str | None:
    """Why losing ``machine`` fails the attempt (None: the others go on without it).

    ``machines``: the job's machines; ``lost``: how many of them are lost (and not back)
    before this one; ``stores``: every store server role of the job and its machine;
    ``stores_gone``: the machines whose store servers are gone already (every machine
    lost earlier in the attempt, back or not); ``starting``: the other machines still
    waiting for the store servers before their trainers start (that wait names every
    server, ``machine``'s too: it would end only at its timeout). The operator notes
    losses only once every worker was ready (phase Training): none is starting."""
    if elastic is None:
        return "runtime.elastic is not set"
    waiting = sorted(set(starting) - {machine})
    if waiting:
        return f"{waiting[0]} was still starting (it waits for every store server)"
    gone = {*stores_gone, machine}
    partitions = {role.index for role in stores}
    kept = {role.index for role, m in stores.items() if m not in gone}
    orphans = sorted(partitions - kept)
    if orphans:
        return f"partition {orphans[0]} would have no copy left"
    left = machines - lost - 1
    if left < elastic.min_machines:
        return f"{left} machines would be left, fewer than runtime.elastic.minMachines"
    return None


def took_over(
    stores: Mapping[RoleName, str],
    trainers: Iterable[str],
    machine: str,
    stores_gone: Collection[str],
    away: Collection[str],
) -> TookOver:
    """Who serves lost ``machine``'s partitions (``partition P`` -> ``store:P:r on M``):
    the replicas of those whose primary it ran, on machines whose store servers are not
    gone (``stores_gone``: every machine lost in the attempt, back or not); and the
    machines whose trainers go on (``trainers``: the machines that run trainers, less
    those ``away``: lost and not back). ``stores``: as for :func:`why_not_survived`."""
    served = {r.index for r, m in stores.items() if m == machine and r.replica == r.sub == 0}
    partitions = {
        f"partition {r.index}": f"{r} on {m}"
        for r, m in stores.items()
        if r.replica > 0 and r.index in served and m not in stores_gone
    }
    return TookOver(dict(sorted(partitions.items())), sorted(set(trainers) - set(away)))


def may_rejoin(elastic: ElasticSpec | None, times: int) -> bool:
    """Whether a lost machine started again ``times`` times already in the attempt is
    started again once more (``runtime.elastic.maxRejoins``)."""
    return elastic is not None and times < elastic.max_rejoins
