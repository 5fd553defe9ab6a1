"""A trainer's environment: what its launcher sets for it (:mod:`graphrun.machine.roles`
for both backends, a warm server before its imports, ``graphrun bench live``'s measuring
process). Read by OpenMP when torch is imported, so it cannot be set by the trainer
itself. No imports: the machine worker, which must not import zmq or torch, reads it.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Unless the job's environment (or, for a warm server and ``graphrun bench live``, the
#: launcher's) sets them: torch's OpenMP threads sleep when they have no work instead of
#: spinning for it first (libgomp's default spins some 300,000 iterations). A trainer's
#: machine also runs store servers, and a live graph's writers: a spinning thread holds a
#: core they need, and the trainer then waits for their answers, or for its own thread
#: they preempted (benchmarks/README.md, "the epoch while ingesting, OpenMP's waiting").
TRAINER_ENV: Mapping[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}
