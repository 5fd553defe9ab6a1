"""graphrun's loaders behave like torch's: persistent_workers, prefetch_factor, pin_memory;
iterating twice, breaking out and closing leave no worker process behind."""

import os
import time

import pytest
import torch

from graphrun.distributed import DistGraph, DistNodeDataLoader, initialize
from graphrun.errors import ArgumentError

pytestmark = pytest.mark.integration


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def gone(pids, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_torch_options_are_checked(served) -> None:
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        with pytest.raises(ArgumentError, match="prefetch_factor: only with num_workers > 0"):
            DistNodeDataLoader(dg, torch.arange(10), [2], batch_size=5, prefetch_factor=2)
        loader = DistNodeDataLoader(
            dg, torch.arange(10), [2], batch_size=5, num_workers=2, prefetch_factor=3
        )
        assert loader.prefetch == 6 and loader.worker_pids == []  # nothing started yet
        pinned = DistNodeDataLoader(dg, torch.arange(10), [2], batch_size=5, pin_memory=True)
        plain = DistNodeDataLoader(dg, torch.arange(10), [2], batch_size=5)
        for a, b in zip(pinned, plain, strict=True):
            assert torch.equal(a.x, b.x)
            assert a.x.is_pinned() == torch.cuda.is_available()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_workers_stop_after_each_epoch_unless_persistent(served) -> None:
    with initialize(served.servers, heartbeat_interval=0) as ctx:
        dg = DistGraph(ctx)
        ids = torch.arange(40)
        # one worker a pool: each start is a spawned process importing torch (~4 CPU-s);
        # a pool of two is test_loader.py's
        kw = {"batch_size": 10, "seed": 3, "num_workers": 1}
        inline = list(DistNodeDataLoader(dg, ids, [2], batch_size=10, seed=3))

        loader = DistNodeDataLoader(dg, ids, [2], persistent_workers=False, **kw)
        pids = []
        for _ in loader:  # break out after one batch: the workers stop
            pids = list(loader.worker_pids)
            break
        assert len(pids) == 1 and gone(pids) and loader.worker_pids == []
        got = []
        for b in loader:  # a whole epoch: new workers, stopped at its end
            pids = list(loader.worker_pids)
            got.append(b)
        assert gone(pids) and loader.worker_pids == []
        assert all(torch.equal(a.n_id, b.n_id) for a, b in zip(inline, got, strict=True))

        with DistNodeDataLoader(dg, ids, [2], **kw) as persistent:
            first = list(persistent)
            pids = list(persistent.worker_pids)
            for _ in persistent:  # break out: the persistent workers stay
                break
            assert persistent.worker_pids == pids and not gone(pids, timeout=0.5)
            second = list(persistent)  # iterate again: the same workers, the same batches
            assert persistent.worker_pids == pids
            for a, b in zip(first, second, strict=True):
                assert torch.equal(a.n_id, b.n_id) and torch.equal(a.x, b.x)
        assert gone(pids) and persistent.worker_pids == []  # closed by the with block


TRAINER = """
import signal, sys, time
import torch
from graphrun.distributed import DistGraph, DistNodeDataLoader, initialize

terms = []
signal.signal(signal.SIGTERM, lambda *_: terms.append(1))
if sys.argv[1] == "forked":  # as a trainer starts (graphrun.machine.trainer)
    from graphrun.distributed.workers import fork_server_now

    fork_server_now()
ctx = initialize(sys.argv[2:], heartbeat_interval=0)
loader = DistNodeDataLoader(DistGraph(ctx), torch.arange(40), [2], batch_size=10, num_workers=2)
print("batches", sum(1 for _ in loader), *loader.worker_pids, flush=True)
while not terms:
    time.sleep(0.05)
print("batches after SIGTERM", sum(1 for _ in loader), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", ["spawned", "forked"])
def test_workers_outlive_a_sigterm_to_the_trainers_group_and_end_with_the_trainer(
    served, tmp_path, server
) -> None:
    """A SIGTERM to a trainer's process group is the trainer's to handle (it checkpoints
    with batches from its workers): the workers and their fork server stay. A trainer
    killed with SIGKILL takes its workers and their fork server with it. The fork server
    either ``multiprocessing``'s new interpreter or forked from the trainer as it
    started (``fork_server_now``, what a CPU trainer does): the same either way."""
    import signal
    import subprocess
    import sys

    import psutil

    from graphrun.testing.procs import child_env

    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    proc = subprocess.Popen(
        [sys.executable, str(script), server, *served.servers],
        stdout=subprocess.PIPE, text=True, env=child_env(), start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        words = proc.stdout.readline().split()
        assert words[:2] == ["batches", "4"], words
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert {int(w) for w in words[2:]} <= {p.pid for p in tree} and len(words) == 4
        workers = {int(w) for w in words[2:]}
        (fork_server,) = [p for p in tree if p.ppid() == proc.pid and p.pid not in workers
                          and "resource_tracker" not in " ".join(p.cmdline())]  # fmt: skip
        spawned = "multiprocessing.forkserver" in " ".join(fork_server.cmdline())
        assert spawned == (server == "spawned")  # forked: the trainer's command line
        assert {p.ppid() for p in tree if p.pid in workers} == {fork_server.pid}
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.stdout.readline().split() == ["batches", "after", "SIGTERM", "4"]
        # the fork server too (a dead one is a zombie: the trainer does not reap it)
        assert all(p.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) for p in tree)
        proc.kill()
        proc.wait(10)
        assert gone([p.pid for p in tree], timeout=10)
    finally:
        proc.kill()
        proc.wait(10)
