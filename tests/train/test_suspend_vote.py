"""The stop vote before each step: the same answer on every trainer, no wait of its own."""

from __future__ import annotations

import socket
import time
from multiprocessing import get_context
from typing import Any

import torch.distributed as dist

from graphrun.train.ddp import DDPConfig, process_group
from graphrun.train.suspend import StopFlag, StopVote

STEPS, STOP_AT, LATE_S = 8, 3, 1.0


def _trainer(rank: int, port: int, out: Any) -> None:
    """Steps of an all-reduce job: the vote, then the step's gradient all-reduce. Trainer 1
    is told to stop at step STOP_AT and comes to each vote LATE_S late from then on."""
    flag = StopFlag()
    with process_group(DDPConfig(rank, 2, f"127.0.0.1:{port}", backend="gloo", timeout_s=60)):
        vote = StopVote(flag, DDPConfig(rank, 2, f"127.0.0.1:{port}", backend="gloo"))
        waits, stopped = [], None
        for i in range(STEPS):
            if rank == 1 and i >= STOP_AT:
                time.sleep(LATE_S)
            t = time.perf_counter()
            if vote.agreed():
                stopped = i
                break
            waits.append(time.perf_counter() - t)
            vote.send()
            if rank == 1 and i == STOP_AT:
                flag.set()
            dist.barrier()  # the step's gradient all-reduce
        vote.close()
        out.put((rank, stopped, waits))


def test_every_trainer_stops_before_the_same_step_and_no_vote_waits_for_a_late_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_trainer, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = {r: (stopped, waits) for r, stopped, waits in (out.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(30)
    # told at step 3, sent before step 4, read before step 5: the same step on both
    assert got[0][0] == got[1][0] == STOP_AT + 2
    # trainer 0 reads each vote at once although trainer 1 comes to it a second late
    # (a blocking vote waited that second at steps 3 and 4)
    assert max(got[0][1]) < LATE_S / 2, got[0][1]
