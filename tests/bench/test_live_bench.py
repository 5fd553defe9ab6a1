"""``graphrun bench live`` at a tiny size on local hosts (no timing asserted)."""

from __future__ import annotations

import json
import os

import pytest

from graphrun.cli import main
from graphrun.machine.trainer_env import TRAINER_OPENMP, sets_waiting

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEYS = (
    "ingest_edges_per_s", "staleness_p50_s", "staleness_p99_s", "epoch_s_ingesting",
    "epoch_s_undisturbed", "lost_acknowledged_writes", "streamed_cut_ratio",
    "compaction_s", "compaction_pause_s", "epochs_s", "epoch_cpu_s", "compactions_in_epochs",
    "epoch_batch", "epochs_batch",
)  # fmt: skip


@pytest.mark.timeout(900)  # five phases, each with real server processes, on a loaded box
def test_live_bench_reports_every_measure_of_the_issue(capsys: pytest.CaptureFixture[str]):
    argv = ["bench", "live", "--nodes", "1000", "--degree", "8", "--batch", "200",
            "--batches", "3", "--probes", "3", "--rate", "2000", "--epoch-batches", "2",
            "--epoch-pairs", "2", "--threads", "1", "--batch-size", "32",
            "--kill-after", "2"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(KEYS) <= set(out)
    assert out["ingest_edges_per_s"] > 0 and out["epoch_s_ingesting"] > 0
    assert 0 < out["staleness_p50_s"] <= out["staleness_p99_s"]
    assert out["ingest_rate_reached_edges_per_s"] > 0  # it ingested while training
    # two pairs in turns, each epoch timed, the trainer's CPU and the servers' counted
    assert [len(v) for v in out["epochs_s"].values()] == [2, 2] and out["epoch_pairs"] == 2
    assert out["trainer_threads"] == 1
    assert out["trainer_omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY", "")
    # its epochs' trainer waits as a job's CPU trainers do (machine.trainer_env)
    own = sets_waiting(os.environ)
    spins = os.environ.get("GOMP_SPINCOUNT", "") if own else TRAINER_OPENMP["GOMP_SPINCOUNT"]
    assert out["trainer_gomp_spincount"] == spins
    cpu = out["epoch_cpu_s"]  # (the servers' and the writer's in clock ticks: maybe 0 here)
    assert cpu["undisturbed"]["trainer"] > 0 and cpu["ingesting"]["trainer"] > 0
    assert all(v[k] >= 0 for v in cpu.values() for k in ("servers", "writer"))
    # each epoch's batches' mean size: nodes and edges sampled (fanouts 10, 5 of 32 seeds)
    sizes = [s for kind in out["epochs_batch"].values() for s in kind]
    assert len(sizes) == 4 and all(32 <= n <= 32 * 61 and e > 0 for n, e in sizes)
    # every acknowledged edge into partition 1 is counted; without a replayed log, some
    # or all of them are lost (the number is reported, whatever it is)
    assert out["acknowledged_into_part1"] >= 2 * 200
    lost = out["lost_acknowledged_writes"]["kill9_part1"]
    assert lost is None or 0 <= lost <= out["acknowledged_into_part1"]
    assert out["streamed_cut_ratio"] > 0
    # both partitions compacted what was ingested while a reader read (kill -9 after it:
    # the restart replays the compacted directory and the rest of the log)
    assert out["compactions"] == [1, 1] and not out["compaction_errors"]
    assert out["compaction_s"] > 0 and out["compaction_pause_s"] >= 0


@pytest.mark.timeout(900)
def test_live_bench_loses_the_sequencer_s_machine_with_replicas_2(
    capsys: pytest.CaptureFixture[str],
):
    argv = ["bench", "live", "--nodes", "1000", "--degree", "8", "--batch", "200",
            "--batches", "2", "--probes", "2", "--rate", "2000", "--epoch-batches", "2",
            "--batch-size", "32", "--kill-after", "3", "--replicas", "2",
            "--lose", "m0", "--epoch-window", "2"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["replicas"] == 2 and "machine_error" not in out
    # the epochs' ingesting process pipelined its batches (submit(), two in flight)
    assert out["epoch_window"] == 2 and out["ingest_rate_reached_edges_per_s"] > 0
    assert 0 < out["epoch_ack_p50_s"] <= out["epoch_ack_p99_s"]  # a few submits later
    # the writer went on through partition 0's replica (the sequencer's copy)
    assert out["failovers"] >= 1 and out["acknowledged_after_loss"] == 3 * 200
    assert out["lost_acknowledged_writes"] == {"machine_m0": 0}
