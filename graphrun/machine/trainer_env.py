"""How a CPU trainer's OpenMP threads wait for work: :data:`TRAINER_OPENMP`.

Torch runs a CPU trainer's operators on OpenMP threads (libgomp). Between parallel
regions an idle thread spins, by libgomp's default some 300,000 rounds, before it
sleeps. A trainer's machine also runs its store servers (and, on a live graph, the
writes they take): while one of them holds a core, the trainer's other thread spins
in the barrier instead of giving its core back, and the step waits for the thread
that was preempted. ``GOMP_SPINCOUNT=20000`` spins 15 times less, then sleeps: in
turns on one pair of stores (``benchmarks/live_epoch_cpu.py``, ``POLICIES``) and in
``graphrun bench live`` it cut the trainer's CPU an epoch and made both undisturbed
and ingesting epochs faster (benchmarks/README.md, "epoch42d"). ``OMP_WAIT_POLICY=
PASSIVE`` (no spinning at all) made undisturbed epochs slower: waking a sleeping
thread at every parallel region costs time when the cores are free.

A job that sets its own waiting (``OMP_WAIT_POLICY`` or any ``GOMP_*`` variable, in the
job's environment or the one its machine's worker inherits: a pod's, the launcher's
shell) keeps it, and gets nothing of this. ``OMP_NUM_THREADS`` and the like say nothing
about waiting and do not count. GPU trainers are left alone.

Read by libgomp when torch is imported, so it is set where a trainer's environment is
made: a machine's worker (:meth:`graphrun.machine.launch.MachineLaunch.with_trainer_openmp`),
the host's warm server, whose imports the trainers it forks share
(:mod:`graphrun.machine.warm`), and ``graphrun bench live``'s measuring process (its
epochs' trainer). A leaf module: the machine worker imports it, and imports no zmq.
"""

from __future__ import annotations

from collections.abc import Mapping

#: what a CPU trainer's environment holds unless its job sets its own waiting
TRAINER_OPENMP: Mapping[str, str] = {"GOMP_SPINCOUNT": "20000"}


def sets_waiting(env: Mapping[str, str]) -> bool:
    """Whether ``env`` says how OpenMP's threads wait (``OMP_WAIT_POLICY``, ``GOMP_*``)."""
    return any(k == "OMP_WAIT_POLICY" or k.startswith("GOMP_") for k in env)


def trainer_openmp(env: Mapping[str, str]) -> dict[str, str]:
    """What a CPU trainer whose environment is ``env`` gets added: :data:`TRAINER_OPENMP`,
    or nothing where ``env`` sets its own waiting."""
    return {} if sets_waiting(env) else dict(TRAINER_OPENMP)
