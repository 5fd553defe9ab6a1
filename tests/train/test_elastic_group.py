"""Regroup.reform with real processes: 3 gloo trainers, one dies, two go on."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _trainer(rank: int, rdv: str, die: bool, out: mp.Queue) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch

    from graphrun.train.config import ElasticConfig
    from graphrun.train.ddp import DDPConfig, all_sum, process_group
    from graphrun.train.elastic import BelowMinimum, Regroup, peer_lost

    torch.set_num_threads(1)
    ddp = DDPConfig(rank, 3, rdv, timeout_s=60)
    minimum = 3 if die else 2
    cfg = ElasticConfig(min_machines=minimum, timeout_s=20, settle_s=1.0)
    with process_group(ddp) as store:
        reg = Regroup(ddp, cfg, ("m0", "m1", "m2"), store)
        all_sum([1.0], ddp)
        if rank == 2:
            os._exit(0)  # the lost machine
        try:
            for _ in range(1000):
                all_sum([1.0], ddp)
                time.sleep(0.01)
            out.put((rank, "no error"))
            return
        except RuntimeError as exc:
            if not peer_lost(exc):
                out.put((rank, f"not a lost peer: {exc}"))
                return
        try:
            new = reg.reform()
        except BelowMinimum as exc:
            out.put((rank, f"below: {exc}"))
            return
        total = all_sum([float(reg.ident)], new)[0]
        out.put((rank, (new.rank, new.world_size, total, reg.generation, reg.members)))


def _run(tmp_path, die: bool) -> dict[int, object]:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    rdv = f"file://{tmp_path / 'rdv'}"
    procs = [ctx.Process(target=_trainer, args=(r, rdv, die, out)) for r in range(3)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in range(2))
    for p in procs:
        p.join(30)
    return got


@pytest.mark.timeout(200)
def test_the_survivors_re_form_with_new_ranks(tmp_path):
    got = _run(tmp_path, die=False)
    # ranks 0 and 1 of 2, the sum of their first-group ranks, generation 1, members (0, 1)
    assert got == {0: (0, 2, 1.0, 1, (0, 1)), 1: (1, 2, 1.0, 1, (0, 1))}


@pytest.mark.timeout(200)
def test_below_min_machines_nobody_re_forms(tmp_path):
    got = _run(tmp_path, die=True)
    assert set(got) == {0, 1}
    assert all(str(v).startswith("below: lost machine(s) m2: 2 left") for v in got.values())
