"""What the loader workers' fork server imports before it forks any of them.

:mod:`graphrun.distributed.workers` (with torch and PyG) is imported once, here, in the
fork server (``multiprocessing``'s ``forkserver``: forked from a CPU trainer as it starts,
:func:`~graphrun.distributed.workers.fork_server_now`, with those imports already made;
elsewhere started by the trainer's first
:class:`~graphrun.distributed.workers.WorkerPool` as a new interpreter that makes them)
instead of in every worker. The fork
server also ignores SIGTERM, as the workers do: a SIGTERM to the trainer's process group
is the trainer's to handle (it checkpoints between steps with batches from the workers),
and with the fork server gone every worker would look dead to the trainer. It ends when
the trainer does (its pipe from the trainer closes), or with SIGKILL. The processes it
forks start with SIGTERM's default action again (a worker ignores it by itself).

Only the fork server imports this module.

Why not the trainers' warm server (:mod:`graphrun.machine.warm`): a loader worker is
the trainer's own child and talks to it in Python objects — its task and result
queues, shared-memory tensors, the :class:`~multiprocessing.Process` whose sentinel the
trainer waits on — which is what ``multiprocessing`` gives and a JSON request over a
socket does not. This fork server belongs to one trainer, on every backend, and takes
``multiprocessing``'s pickled requests from that trainer only (its socket lies in a
directory only this user can enter); the warm server is one per host of the local
backend, shared by the machine workers, and takes nothing but JSON from them. Two
mechanisms, for these reasons (:mod:`graphrun.machine.warm` says why from its side).
"""

from __future__ import annotations

import signal
from multiprocessing import util

import graphrun.distributed.workers  # noqa: F401  (imported for the workers)


def _default_sigterm(_: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


signal.signal(signal.SIGTERM, signal.SIG_IGN)
# multiprocessing holds the key object weakly: this module's function lives as long as it
util.register_after_fork(_default_sigterm, _default_sigterm)
