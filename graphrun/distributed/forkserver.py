"""What the loader workers' fork server imports before it forks any of them.

:mod:`graphrun.distributed.workers` (with torch and PyG) is imported once, here, in the
fork server (``multiprocessing``'s ``forkserver``, started by the trainer's first
:class:`~graphrun.distributed.workers.WorkerPool`) instead of in every worker. The fork
server also ignores SIGTERM, as its workers do: a SIGTERM to the trainer's process group
is the trainer's to handle (it checkpoints between steps with batches from the workers),
and a fork server gone would make every worker look dead to the trainer. It ends when
the trainer does (its pipe from the trainer closes), or with SIGKILL.

Only the fork server imports this module.
"""

from __future__ import annotations

import signal

import graphrun.distributed.workers  # noqa: F401  (imported for the workers)

signal.signal(signal.SIGTERM, signal.SIG_IGN)
