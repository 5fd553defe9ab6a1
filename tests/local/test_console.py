"""What a person sees of a running job (``graphrun run`` and ``graphrun demo``)."""

from __future__ import annotations

import io
import json

from graphrun.local.console import Console
from graphrun.record import Reformed, event_text


def test_people_see_phases_progress_and_one_line_per_epoch() -> None:
    out = io.StringIO()
    c = Console(out)
    rec = {"epoch": 1, "loss": 0.12345, "train_acc": 0.9, "val_acc": 0.91, "test_acc": 0.925,
           "epoch_s": 1.234, "seeds_per_s": 8130.2, "steps": 4}  # fmt: skip
    c.write("[graphrun] phase Serving (Distributed)\n")
    c.write("[store:0@m0] 2026-11-24 06:29:54,150 graphrun.store INFO store:0 serving\n")
    c.write('[trainer:0@m0] {"event": "joined", "rank": 0}\n')
    c.write("[trainer:1@m1] epoch 1: 100% 4/4 batches, 4,000 seeds/s\n")
    c.write("[trainer:0@m0] epoch 1: 100% 4/4 batches, 8,000 seeds/s\n[trainer:0@m0] ")
    c.write(json.dumps(rec) + "\n")
    c.write("[trainer:0@m0] my own print\n")
    assert out.getvalue().splitlines() == [
        "[graphrun] phase Serving (Distributed)",
        "[trainer:0@m0] epoch 1: 100% 4/4 batches, 8,000 seeds/s",
        "[trainer:0@m0] epoch 1: loss 0.1235  train 0.900  val 0.910  test 0.925  "
        "(1.23 s, 8,130 seeds/s)",  # README: every line says its role and machine
        "[trainer:0@m0] my own print",
    ]


def test_progress_seeds_per_second_is_the_jobs_not_one_trainers() -> None:
    # rank 0's progress showed half of the JSON's seeds/s with 2 trainers
    import time

    import pytest

    from graphrun.train.metrics import Progress

    p = Progress(2, "epoch 0", out=io.StringIO(), trainers=2)
    p.update(1000)
    p.t0 = time.perf_counter() - 10.0  # ten seconds into the epoch
    assert p.seeds_per_s == pytest.approx(2 * 1000 / 10.0, rel=1e-3)


def test_a_dying_roles_traceback_stays_in_its_log() -> None:
    out = io.StringIO()
    c = Console(out)
    c.write("[trainer:0@m0] epoch 1: 100% 4/4 batches, 8,000 seeds/s\n")
    c.write("[trainer:0@m0] [rank0]: Traceback (most recent call last):\n")
    c.write('[trainer:0@m0] [rank0]:   File "x.py", line 1, in <module>\n')
    c.write("[trainer:0@m0] [rank0]: RuntimeError: Connection reset by peer\n")
    c.write("[trainer:0@m0] Traceback (most recent call last):\n")
    c.write("[trainer:0@m0] RuntimeError: Connection reset by peer\n")
    c.write("[graphrun] trainer:1 on m1 failed first (killed by SIGKILL); its log: x.log\n")
    assert out.getvalue().splitlines() == [
        "[trainer:0@m0] epoch 1: 100% 4/4 batches, 8,000 seeds/s",
        "[graphrun] trainer:1 on m1 failed first (killed by SIGKILL); its log: x.log",
    ]


def test_sampler_workers_starting_and_ready_are_announced() -> None:
    out = io.StringIO()
    c = Console(out)
    for role in ("trainer:1@m1", "trainer:0@m0"):
        c.write(f'[{role}] {{"event": "samplers_starting", "rank": 0, "workers": 4}}\n')
    c.write(
        '[trainer:0@m0] {"event": "samplers_ready", "rank": 0, "workers": 4, "start_s": 9.84}\n'
    )
    assert out.getvalue().splitlines() == [
        "[trainer:0@m0] starting 4 sampler worker(s) per trainer "
        "(runtime.samplerWorkersPerTrainer): the first epoch waits for them",
        "[trainer:0@m0] sampler workers ready in 9.8 s",
    ]


def test_after_trainer_0s_machine_is_lost_the_new_rank_0_is_shown() -> None:
    # an elastic group re-formed without m0: its new rank 0 (trainer 1) prints the
    # "reformed" event and the epoch records from then on (issue 40, item 7)
    out = io.StringIO()
    c = Console(out)
    rec = {"epoch": 2, "loss": 0.5, "train_acc": 0.8, "epoch_s": 1.0}
    reformed = Reformed(
        generation=1, epoch=2, step=5, lost_trainers=[0], lost_machines=["m0"], world_size=2,
        machines=["m1", "m2"], paused_s=1.5, time=1e9,
    )  # fmt: skip
    # a line that only starts as the event did is not the event: trainer 0 stays shown
    c.write('[trainer:1@m1] {"event": "reformed", "generation": 1, "lost_machines": ["m0"]}\n')
    c.write(f"[trainer:0@m0] {json.dumps(rec)}\n")
    c.write(f"[trainer:1@m1] {event_text(reformed)}\n")
    c.write(f"[trainer:1@m1] {json.dumps(rec)}\n[trainer:2@m2] {json.dumps(rec)}\n")
    c.write(f"[trainer:0@m0] {json.dumps(rec)}\n")
    assert out.getvalue().splitlines() == [
        "[trainer:0@m0] epoch 2: loss 0.5000  train 0.800  (1.00 s)",
        "[trainer:1@m1] epoch 2: loss 0.5000  train 0.800  (1.00 s)",
    ]
