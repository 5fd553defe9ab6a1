"""``graphrun worker`` as a process, for machines a placement plan leaves without stores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphrun.job.hosts import free_ports
from graphrun.machine.launch import MachineLaunch, RoleLaunch, Servers
from graphrun.machine.stopmark import write_mark
from graphrun.names import Endpoint, RoleName
from graphrun.record import read_status
from graphrun.testing.jobs import alone, fake_store, fake_trainer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def at(port: int) -> Endpoint:
    return Endpoint("127.0.0.1", port)


def run_worker(
    tmp_path: Path, launch: MachineLaunch, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    plan = launch.write(tmp_path / f"{launch.machine}.json")
    argv = [sys.executable, "-m", "graphrun", "worker", "--plan", str(plan)]
    argv += ["--status-dir", str(tmp_path / "status"), "--grace", "1"]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)


def test_trainer_only_machine_exits_0_when_its_trainers_are_done(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    store = fake_store(RoleName.store(0), "m0", port)  # machine m0's store, run here as a stand-in
    with subprocess.Popen(store.argv, stdout=subprocess.DEVNULL) as server:
        try:
            trainer = fake_trainer(RoleName.trainer(0), "m1", "print('trained')")
            launch = MachineLaunch(machine="m1", roles=(trainer,), wait_for=alone(at(port)))
            out = run_worker(tmp_path, launch)
        finally:
            server.kill()
    assert out.returncode == 0, out.stderr
    assert "trained" in out.stdout
    status = read_status(tmp_path / "status" / "m1.json")
    assert status is not None and status.state == "done"
    assert status.roles[RoleName.trainer(0)].exit_code == 0
    # what it used is keyed by its RoleName too, read once with the file
    assert status.usage is not None and list(status.usage.roles) == [RoleName.trainer(0)]


def test_a_replica_stands_in_for_a_primary_that_is_not_up(tmp_path: Path) -> None:
    """Partition 1's primary is gone (nothing listens) and its replica is up: the
    trainers start. With neither up, the timeout names the partition and its servers."""
    port, dead, never = free_ports(3)
    replica = fake_store(RoleName.store(1, replica=1), "m0", port)
    with subprocess.Popen(replica.argv, stdout=subprocess.DEVNULL) as server:
        try:
            trainer = fake_trainer(RoleName.trainer(0), "m0", "print('trained')")
            part = Servers(of="partition 1", main=(at(dead),), replicas=(at(port),))
            launch = MachineLaunch(machine="m0", roles=(trainer,), wait_for=(part,))
            out = run_worker(tmp_path, launch)
            assert out.returncode == 0, out.stderr
            assert "trained" in out.stdout
            lost = Servers(of="partition 1", main=(at(dead),), replicas=(at(never),))
            launch = MachineLaunch(
                machine="m1", roles=(trainer,), wait_for=(part, lost), ready_timeout_s=1.0
            )
            out = run_worker(tmp_path, launch)
        finally:
            server.kill()
    assert out.returncode != 0 and "trained" not in out.stdout
    status = read_status(tmp_path / "status" / "m1.json")
    assert status is not None and status.failure is not None
    assert status.failure.reason == (
        "timed out after 1s waiting for the store servers of other machines "
        f"(partition 1: 127.0.0.1:{dead}, replica 127.0.0.1:{never})"
    )


def test_a_cpu_trainer_spins_less_unless_the_worker_s_environment_says_how_to_wait(
    tmp_path: Path,
) -> None:
    code = "import os; print('waits', *map(os.environ.get, ('GOMP_SPINCOUNT', 'OMP_WAIT_POLICY')))"
    launch = MachineLaunch(machine="m1", roles=(fake_trainer(RoleName.trainer(0), "m1", code),))
    plain = {k: v for k, v in os.environ.items()
             if k != "OMP_WAIT_POLICY" and not k.startswith("GOMP_")}  # fmt: skip
    out = run_worker(tmp_path, launch, plain)
    assert out.returncode == 0, out.stderr
    assert "waits 20000 None" in out.stdout  # machine.trainer_env.TRAINER_OPENMP
    # a pod's (or the launcher's shell's) own waiting is the trainer's
    out = run_worker(tmp_path, launch, {**plain, "OMP_WAIT_POLICY": "PASSIVE"})
    assert "waits None PASSIVE" in out.stdout, out.stderr
    out = run_worker(tmp_path, launch, {**plain, "GOMP_SPINCOUNT": "100"})
    assert "waits 100 None" in out.stdout, out.stderr


def test_machine_without_roles_exits_0(tmp_path: Path) -> None:
    out = run_worker(tmp_path, MachineLaunch(machine="m2", roles=()))
    assert out.returncode == 0, out.stderr
    status = read_status(tmp_path / "status" / "m2.json")
    assert status is not None and status.state == "done"


def test_a_stopped_trainer_is_named_within_the_stall_timeout(tmp_path: Path) -> None:
    # SIGSTOP: the process is alive but the job cannot go on; gloo would time out in the
    # *other* trainer minutes later, so the worker that started it names it
    code = "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"
    trainers = (fake_trainer(RoleName.trainer(0), "m0", "import time; time.sleep(30)"),
                fake_trainer(RoleName.trainer(1), "m0", code))  # fmt: skip
    out = run_worker(tmp_path, MachineLaunch(machine="m0", roles=trainers, stall_timeout_s=2.0))
    assert out.returncode != 0
    status = read_status(tmp_path / "status" / "m0.json")
    assert status is not None and status.state == "failed"
    assert status.failure.role == RoleName.trainer(1) and status.failure.machine == "m0"
    assert "stopped (SIGSTOP)" in status.failure.reason


def test_stall_timeout_travels_in_the_launch_file(tmp_path: Path) -> None:
    launch = MachineLaunch(machine="m0", roles=(), stall_timeout_s=7.5)
    assert MachineLaunch.read(launch.write(tmp_path / "m0.json")).stall_timeout_s == 7.5


# a worker told to stop gives its stores the whole grace period to be stopped by trainer 0,
# which these fake trainers never do: the grace is the test's wait, 4 s (its trainers need
# ~0.6 s after SIGTERM)
GRACE = "4"

TRAINER_CHECKPOINTS_ON_SIGTERM = """
import signal, socket, sys, time
port, out = int(sys.argv[1]), sys.argv[2]
def on_term(*_):
    time.sleep(0.5)  # writing the checkpoint takes a while; the store must still serve
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    open(out, "w").write("checkpoint written while the store served")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
print("training", flush=True)
while True:
    time.sleep(0.05)
"""


def test_told_to_stop_the_worker_stops_its_trainers_before_its_stores(tmp_path: Path) -> None:
    """The trainers' checkpoint on SIGTERM reads the store (embedding state): the worker
    used to SIGTERM every role at once, and the store was gone before the trainer got
    to it."""
    (port,) = free_ports(1)
    done = tmp_path / "checkpoint"
    store = fake_store(RoleName.store(0), "m0", port)
    code = TRAINER_CHECKPOINTS_ON_SIGTERM
    trainer = RoleLaunch(
        "trainer", RoleName.trainer(0), (sys.executable, "-c", code, str(port), str(done))
    )
    launch = MachineLaunch(machine="m0", roles=(store, trainer), wait_for=alone(at(port)))
    plan = launch.write(tmp_path / "m0.json")
    argv = [sys.executable, "-m", "graphrun", "worker", "--plan", str(plan), "--grace", GRACE]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "training" in line:
            break
    proc.terminate()
    proc.communicate(timeout=60)
    assert done.read_text() == "checkpoint written while the store served"


def _start_and_terminate(
    tmp_path: Path, launch: MachineLaunch, extra: list[str], env: dict[str, str] | None = None
) -> tuple[int, str]:
    plan = launch.write(tmp_path / "m0.json")
    argv = [sys.executable, "-m", "graphrun", "worker", "--plan", str(plan), "--grace", GRACE]
    argv += ["--status-dir", str(tmp_path / "status"), *extra]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "training" in line:
            break
    proc.terminate()
    out = proc.communicate(timeout=60)[0]
    return proc.returncode, out


def _elastic_machine(tmp_path: Path, done: Path) -> MachineLaunch:
    (port,) = free_ports(1)
    store = fake_store(RoleName.store(0), "m0", port)
    code = TRAINER_CHECKPOINTS_ON_SIGTERM
    trainer = RoleLaunch(
        "trainer", RoleName.trainer(0), (sys.executable, "-c", code, str(port), str(done))
    )
    return MachineLaunch(
        machine="m0", roles=(store, trainer), wait_for=alone(at(port)), elastic=True
    )


def test_elastic_worker_told_to_stop_without_the_mark_leaves_alone(tmp_path: Path) -> None:
    """A pod deleted alone (no graphrun.io/stop mark): its trainers are killed at once and
    never enter the stop agreement, so the other machines go on instead of checkpointing."""
    done = tmp_path / "checkpoint"
    launch = _elastic_machine(tmp_path, done)
    mark = tmp_path / "annotations"
    mark.write_text('graphrun.io/roles="store:0,trainer:0"\n')  # annotations, not the mark
    code, out = _start_and_terminate(
        tmp_path, launch, ["--stop-mark", str(mark), "--stop-mark-wait", "0.5"]
    )
    assert code == 143
    assert not done.exists()  # no SIGTERM reached the trainer: killed
    status = read_status(tmp_path / "status" / "m0.json")
    assert status is not None and status.state == "left"
    assert status.roles[RoleName.trainer(0)].exit_code == -9
    assert '"event": "machine_leaving"' in out


def test_elastic_worker_told_to_stop_with_the_mark_checkpoints(tmp_path: Path) -> None:
    done = tmp_path / "checkpoint"
    launch = _elastic_machine(tmp_path, done)
    mark = tmp_path / "annotations"
    write_mark(mark)
    code, _ = _start_and_terminate(tmp_path, launch, ["--stop-mark", str(mark)])
    assert code == 143
    assert done.read_text() == "checkpoint written while the store served"
    status = read_status(tmp_path / "status" / "m0.json")
    assert status is not None and status.state == "stopped"


def test_joining_worker_runs_only_its_trainers(tmp_path: Path) -> None:
    """A lost machine's replacement (GRAPHRUN_ELASTIC_JOIN=1): its store server is not
    started again (its replica serves), and its trainers do not wait for it."""
    port, lost = free_ports(2)
    store = fake_store(RoleName.store(0), "m0", port)
    code = "import os; print('joined', os.environ['GRAPHRUN_ELASTIC_JOIN'])"
    trainer = fake_trainer(RoleName.trainer(0), "m0", code)
    launch = MachineLaunch(  # its own store and another lost machine's: neither is up
        machine="m0", roles=(store, trainer), elastic=True, ready_timeout_s=5.0,
        wait_for=alone(at(port), at(lost)),
    )  # fmt: skip
    plan = launch.write(tmp_path / "m0.json")
    argv = [sys.executable, "-m", "graphrun", "worker", "--plan", str(plan)]
    argv += ["--status-dir", str(tmp_path / "status")]
    env = {**os.environ, "GRAPHRUN_ELASTIC_JOIN": "1"}
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert "joined 1" in out.stdout
    status = read_status(tmp_path / "status" / "m0.json")
    assert status is not None and status.state == "done"
    assert list(status.roles) == [RoleName.trainer(0)]


STORE_STOPPED_BY_THE_JOB = """
import os, socket, sys, time
port, done = int(sys.argv[1]), sys.argv[2]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
while not os.path.exists(done):  # trainer 0 stops the job's stores once all are done
    time.sleep(0.05)
"""


def test_elastic_worker_whose_stores_the_job_stopped_ends_done_not_left(tmp_path: Path) -> None:
    """Only a SIGTERM asks whether the machine leaves alone: a machine that ends because
    the job stopped its stores (trainers done) exits 0 as ever. It used to take that end
    for a leave (state left, exit 143) and fail the job."""
    (port,) = free_ports(1)
    done = tmp_path / "trained"
    argv = (sys.executable, "-c", STORE_STOPPED_BY_THE_JOB, str(port), str(done))
    store = RoleLaunch("store", RoleName.store(0), argv, ready=at(port))
    trainer = fake_trainer(RoleName.trainer(0), "m0", f"open({str(done)!r}, 'w').close()")
    launch = MachineLaunch(
        machine="m0", roles=(store, trainer), wait_for=alone(at(port)), elastic=True
    )
    plan = launch.write(tmp_path / "m0.json")
    argv2 = [sys.executable, "-m", "graphrun", "worker", "--plan", str(plan)]
    argv2 += ["--status-dir", str(tmp_path / "status"), "--stop-mark", str(tmp_path / "none")]
    out = subprocess.run(argv2, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    status = read_status(tmp_path / "status" / "m0.json")
    assert status is not None and status.state == "done"


@pytest.mark.parametrize("wait", ["-1", "nan"])
def test_a_bad_stop_mark_wait_is_one_line(tmp_path: Path, wait: str) -> None:
    plan = MachineLaunch(machine="m0", roles=()).write(tmp_path / "m0.json")
    argv = [sys.executable, "-m", "graphrun", "worker", "--plan", str(plan)]
    out = subprocess.run([*argv, "--stop-mark-wait", wait], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"graphrun: error: argument --stop-mark-wait: {wait} is not in [0, ")


def test_a_worker_does_not_import_the_store_s_client_or_server() -> None:
    """A machine worker needs the store's shared-memory module only (to clean its
    stores' segments); the package's client, server and zmq were 0.1 CPU-s of every
    worker's start."""
    code = "import sys, graphrun.cli.worker, graphrun.machine.worker; "
    code += "print(sorted(m for m in ('graphrun.store.client', 'graphrun.store.server', 'zmq') "
    code += "if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
