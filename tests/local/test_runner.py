"""A whole GraphJob through the workflow with the local backend (fake stores and trainers)."""

from __future__ import annotations

import io
import json
import sys
import threading

import pytest

from graphrun.errors import JobFailed, SpecError, UserError
from graphrun.job.hosts import Hosts
from graphrun.job.spec import load_job, parse_job
from graphrun.job.workflow import Phase
from graphrun.local.runner import LocalJob, RunOptions
from graphrun.machine.launch import MachineLaunch, RoleLaunch
from graphrun.names import RoleName
from graphrun.testing.jobs import (
    alone,
    fake_dataset,
    fake_partition,
    fake_store,
    fake_trainer,
    job_yaml,
)

pytestmark = pytest.mark.integration


class FakeRoles(LocalJob):
    """Real processes, but fake store servers and python -c trainers (code per attempt)."""

    def __init__(self, *a, codes: list[dict[int, str]], **kw) -> None:
        super().__init__(*a, **kw)
        self.codes = codes
        self.attempts: list[bool] = []

    def launches(self, hosts: Hosts, resume: bool) -> list[MachineLaunch]:
        code = self.codes[min(len(self.attempts), len(self.codes) - 1)]
        self.attempts.append(resume)
        out = []
        for i, m in enumerate(self.job.spec.machine_names):
            h, port = hosts.endpoint(RoleName.store(i))
            roles: tuple[RoleLaunch, ...] = (
                fake_store(RoleName.store(i), m, port, h),
                fake_trainer(RoleName.trainer(i), m, code.get(i, "pass")),
            )
            out.append(
                MachineLaunch(
                    machine=m,
                    roles=roles,
                    wait_for=alone(*hosts.endpoints.values()),
                    ready_timeout_s=30.0,
                )
            )
        return out


def make(tmp_path, codes, **spec_over):
    # the trainers are fake: an entry point job, whose partitions' columns are not checked
    path = job_yaml(tmp_path, entryPoint="graphrun.testing.jobs:wait")
    fake_partition(tmp_path)
    fake_dataset(tmp_path)
    job = load_job(path)
    if spec_over:
        data = job.model_dump(by_alias=True, exclude_none=True)
        data["spec"]["runPolicy"].update(spec_over)
        job = parse_job(data)
    stop = threading.Event()
    sink = io.StringIO()
    # a done machine waits the grace period for its stores to be stopped by trainer 0, which
    # a fake trainer never does: keep it short
    return FakeRoles(job, path, RunOptions(grace_s=0.5), sink=sink, stop=stop, codes=codes), sink


def test_job_goes_through_the_phases_and_succeeds(tmp_path):
    lj, sink = make(tmp_path, [{}])
    report = lj.run()
    assert report.state.phase is Phase.SUCCEEDED
    assert report.exits[RoleName.trainer(0)] == 0 and report.exits[RoleName.trainer(1)] == 0
    out = sink.getvalue()
    for phase in ("Partitioning", "Distributing", "Serving", "Training", "Succeeded"):
        assert f"phase {phase}" in out
    state = json.loads((tmp_path / "runs" / "t" / "state.json").read_text())
    assert state["phase"] == "Succeeded"
    assert Hosts.read(tmp_path / "runs" / "t" / "hosts.json").store_endpoints().keys() == {0, 1}


def test_failed_trainer_fails_the_job(tmp_path):
    lj, _ = make(tmp_path, [{1: "import sys; sys.exit(3)"}])
    with pytest.raises(JobFailed) as info:
        lj.run()
    assert (info.value.role, info.value.host, info.value.exit_code) == (
        RoleName.trainer(1),
        "m1",
        3,
    )
    assert lj.state.phase is Phase.FAILED


def test_restart_within_backoff_limit_resumes(tmp_path):
    lj, sink = make(tmp_path, [{0: "raise SystemExit(1)"}, {}], backoffLimit=1)
    report = lj.run()
    assert report.state.phase is Phase.SUCCEEDED and report.state.restarts == 1
    assert lj.attempts == [False, True]  # the second attempt resumes from the checkpoint
    assert "phase Restarting" in sink.getvalue()


def test_backoff_limit_exhausted_fails(tmp_path):
    lj, _ = make(tmp_path, [{0: "raise SystemExit(1)"}], backoffLimit=1)
    with pytest.raises(JobFailed, match="trainer:0 on m0"):
        lj.run()
    assert lj.attempts == [False, True] and lj.state.restarts == 1


def test_deadline_fails_the_job(tmp_path):
    lj, _ = make(tmp_path, [{0: "import time; time.sleep(60)"}], activeDeadlineSeconds=3)
    with pytest.raises(JobFailed, match="activeDeadlineSeconds"):
        lj.run()
    assert lj.state.condition("Failed").reason == "DeadlineExceeded"  # type: ignore[union-attr]


def test_missing_dataset_is_refused_up_front(tmp_path):
    path = job_yaml(tmp_path)
    with pytest.raises(SpecError, match=r"spec\.graph\.dataset"):
        LocalJob(load_job(path), path, sink=io.StringIO()).run()


def test_missing_dataset_is_refused_even_with_old_partitions(tmp_path):
    # partitions left in the output by an earlier run cannot be told current without it
    path = job_yaml(tmp_path, entryPoint="graphrun.testing.jobs:wait")
    fake_partition(tmp_path)
    with pytest.raises(SpecError, match=r"spec\.graph\.dataset: .*data does not exist"):
        LocalJob(load_job(path), path, sink=io.StringIO()).run()


def test_partition_of_another_size_is_refused(tmp_path):
    path = job_yaml(tmp_path)
    fake_partition(tmp_path, parts=3)
    fake_dataset(tmp_path)
    with pytest.raises(SpecError, match="has 3 parts, the job needs 2"):
        LocalJob(load_job(path), path, sink=io.StringIO()).run()


def test_partition_of_another_version_is_refused(tmp_path):
    path = job_yaml(tmp_path)
    meta = fake_partition(tmp_path) / "partition.json"
    meta.write_text(meta.read_text().replace('"version": 1', '"version": 2'))
    fake_dataset(tmp_path)
    with pytest.raises(UserError, match=r"partition\.json: field 'version' is 2; this graphrun"):
        LocalJob(load_job(path), path, sink=io.StringIO()).run()


if sys.platform != "linux":  # pragma: no cover
    pytest.skip("process groups and /dev/shm are Linux", allow_module_level=True)


def test_a_role_refusing_its_input_is_not_restarted(tmp_path):
    # exit code 2 (USER_ERROR_EXIT): a bad entry point or a corrupt checkpoint; a restart
    # cannot help, so the backoff limit is not spent on it
    lj, _ = make(tmp_path, [{1: "import sys; sys.exit(2)"}, {}], backoffLimit=2)
    with pytest.raises(JobFailed) as info:
        lj.run()
    assert (info.value.role, info.value.exit_code) == (RoleName.trainer(1), 2)
    assert lj.state.restarts == 0 and lj.attempts == [False]
    assert lj.state.condition("Failed").reason == "NotRetriable"


@pytest.mark.parametrize("machines", [1, 2])
def test_the_trainers_of_a_local_job_share_the_hosts_cores_with_its_store_servers(
    tmp_path, machines
):
    """Every machine of a local job runs on this host: a trainer gets its share of the
    cores beside every other trainer and store server (it got cores // trainers: with a
    store server beside it, a thread too many, spinning in OpenMP's barriers)."""
    import os

    from graphrun.machine.roles import plan_hosts

    path = job_yaml(tmp_path, entryPoint="graphrun.testing.jobs:wait")
    fake_partition(tmp_path, parts=machines)
    fake_dataset(tmp_path)
    data = load_job(path).model_dump(by_alias=True, exclude_none=True)
    data["spec"]["runtime"]["machines"] = data["spec"]["partition"]["parts"] = machines
    job = parse_job(data)
    local = LocalJob(job, path, RunOptions(), sink=io.StringIO())
    launches = local.launches(plan_hosts(job, local.roles), resume=False)
    rt = job.spec.runtime
    processes = rt.machines * (rt.trainers_per_machine + rt.store_servers_per_machine)
    want = max(1, len(os.sched_getaffinity(0)) // processes)
    for m in launches:
        for role in m.roles:
            if role.kind == "trainer":
                argv = list(role.argv)
                assert argv[argv.index("--threads") + 1] == str(want), argv


def test_a_run_after_a_killed_one_starts_once_the_killed_runs_workers_are_gone(
    tmp_path, monkeypatch
):
    """`graphrun run` killed with -9 leaves its workers stopping their roles and writing
    into the run's status directory: the next run used to start beside them (`--resume`
    once failed with "status: File exists")."""
    import subprocess

    from graphrun.local import runner
    from graphrun.testing.procs import child_env

    path = job_yaml(tmp_path, entryPoint="graphrun.testing.jobs:wait")
    fake_partition(tmp_path)
    fake_dataset(tmp_path)
    job = load_job(path)
    local = LocalJob(job, path, RunOptions(), sink=io.StringIO())
    run_dir = local.paths.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(10)
    state = {"phase": "Training", "conditions": [], "restarts": 0}
    lost = json.dumps({**state, "launcher": {"pid": dead.pid, "start": 1}})
    # a worker of the killed run, still stopping: its command line names the status dir
    code = "import time; time.sleep(float(__import__('sys').argv[-1]))"
    argv = [sys.executable, "-c", code, "worker", "--status-dir", str(run_dir / "status")]
    lingering = subprocess.Popen([*argv, "1.5"], env=child_env())
    stuck = None
    try:
        local.paths.state_file.write_text(lost)
        local._after_a_lost_run()
        assert lingering.poll() is not None  # waited for it
        assert "was lost in phase Training" in local.state.conditions[-1].message

        stuck = subprocess.Popen([*argv, "60"], env=child_env())
        local.paths.state_file.write_text(lost)
        monkeypatch.setattr(runner, "LOST_RUN_WAIT_S", 0.5)
        with pytest.raises(SpecError, match=rf"pids {stuck.pid}\); stop them first"):
            local._after_a_lost_run()
    finally:
        for p in (lingering, stuck):
            if p is not None:
                p.kill()
                p.wait(10)
