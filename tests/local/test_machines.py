"""The local backend with real worker and role processes (fake stores, python -c trainers)."""

from __future__ import annotations

import io
import signal
import threading
import time

import msgspec
import pytest

from graphrun.errors import JobFailed
from graphrun.local.machines import LocalMachines
from graphrun.names import Endpoint, RoleName
from graphrun.testing.jobs import alone, kill_when_training, no_children, two_machines

pytestmark = pytest.mark.integration


def machines(tmp_path, sink=None):
    # a done machine waits the grace period for its stores to be stopped by trainer 0, which
    # a fake trainer never does: keep it short
    return LocalMachines(tmp_path, sink=sink or io.StringIO(), grace_s=0.5)


def test_two_machines_succeed_and_report_role_exits(tmp_path):
    sink = io.StringIO()
    res = machines(tmp_path, sink).run(two_machines({0: "print('trained')"}))
    assert res.exits[RoleName.trainer(0)] == 0 and res.exits[RoleName.trainer(1)] == 0
    assert res.exits[RoleName.store(0)] == -signal.SIGTERM  # stopped at the end, as asked
    assert "[trainer:0@m0] trained" in sink.getvalue()
    assert (tmp_path / "logs" / "m0" / "trainer-0.log").read_text() == "trained\n"
    no_children()


def test_raising_trainer_fails_the_job_naming_it(tmp_path):
    code = "import time; time.sleep(0.5); raise RuntimeError('boom')"
    with pytest.raises(JobFailed) as info:
        machines(tmp_path).run(two_machines({1: code, 0: "import time; time.sleep(60)"}))
    exc = info.value
    assert (exc.role, exc.host, exc.exit_code) == (RoleName.trainer(1), "m1", 1)
    assert "RuntimeError: boom" in str(exc)
    no_children()


def test_killed_store_fails_the_job(tmp_path):
    launches = two_machines({0: "import time; time.sleep(60)", 1: "import time; time.sleep(60)"})
    lm = machines(tmp_path)

    kill_when_training(tmp_path / "status" / "m1.json", RoleName.store(1), timeout=30)
    with pytest.raises(JobFailed) as info:
        lm.run(launches)
    assert (info.value.role, info.value.host, info.value.exit_code) == (RoleName.store(1), "m1", -9)
    no_children()


def test_deadline_stops_everything(tmp_path):
    launches = two_machines({0: "import time; time.sleep(60)"})
    with pytest.raises(JobFailed, match="activeDeadlineSeconds"):
        machines(tmp_path).run(launches, deadline=time.monotonic() + 3)
    no_children()


def test_stop_event_stops_everything(tmp_path):
    stop = threading.Event()
    threading.Timer(3.0, stop.set).start()
    with pytest.raises(JobFailed, match="stopped by a signal"):
        machines(tmp_path).run(two_machines({1: "import time; time.sleep(60)"}), stop=stop)
    no_children()


def test_store_never_ready_times_out(tmp_path):
    launches = two_machines({}, ready_timeout_s=1.0)
    # machine m1 waits for an endpoint nobody serves
    nobody = Endpoint("127.0.0.1", 1)
    bad = msgspec.structs.replace(launches[1], wait_for=(*launches[1].wait_for, *alone(nobody)))
    with pytest.raises(JobFailed, match="timed out"):
        machines(tmp_path).run([launches[0], bad])
    no_children()


def test_a_role_that_only_lost_a_peer_is_blamed_last(tmp_path) -> None:
    # trainer 0 noticed trainer 1's death (gloo: connection reset) before trainer 1's
    # worker reported it: the killed trainer is the cause
    import json

    reset = "RuntimeError: [gloo/pair.cc:537] Read error: Connection reset by peer."
    for machine, role, code, reason, t in (
        ("m0", "trainer:0", 1, reset, 1.0),
        ("m1", "trainer:1", -9, "killed by SIGKILL", 2.0),
    ):
        failure = {"role": role, "machine": machine, "exit_code": code, "reason": reason}
        (tmp_path / f"{machine}.json").write_text(
            json.dumps({"machine": machine, "state": "failed", "failure": {**failure, "time": t}})
        )
    first = LocalMachines._failure(tmp_path, [], only_status=True)
    assert first is not None and (first.role, first.exit_code) == (RoleName.trainer(1), -9)


def test_a_role_that_lost_a_server_is_blamed_before_one_that_lost_its_rank(tmp_path) -> None:
    # trainer 0 failed on a request to a killed store; trainer 1's gloo all-reduce then
    # saw trainer 0 close, and its worker reported first: trainer 0 is nearer the cause
    import json

    closed = "RuntimeError: [gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:8928."
    lost = "graphrun.errors.RpcError: stats to tcp://127.0.0.1:1: connection lost"
    for machine, role, reason, t in (
        ("m0", "trainer:0", lost, 2.0),
        ("m1", "trainer:1", closed, 1.0),
    ):
        failure = {"role": role, "machine": machine, "exit_code": 1, "reason": reason}
        (tmp_path / f"{machine}.json").write_text(
            json.dumps({"machine": machine, "state": "failed", "failure": {**failure, "time": t}})
        )
    first = LocalMachines._failure(tmp_path, [], only_status=True)
    assert first is not None and first.role == RoleName.trainer(0)
