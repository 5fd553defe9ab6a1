"""The launcher's side of elastic trainers: which losses a job survives, and what it says."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from graphrun.errors import JobFailed
from graphrun.job.spec.runtime import ElasticSpec
from graphrun.local.elastic import machine_lost_event
from graphrun.local.machines import LocalMachines
from graphrun.machine.launch import MachineLaunch, RoleKind, RoleLaunch
from graphrun.machine.process import RoleCommand, RoleExit
from graphrun.names import Endpoint, RoleName
from graphrun.record import Reformed, TookOver, event_text, parse_event

REFORMED = event_text(
    Reformed(
        generation=1, epoch=0, step=3, lost_trainers=[1], lost_machines=["m1"], world_size=2,
        machines=["m0", "m2"], paused_s=0.5, time=1e9,
    )
)  # fmt: skip


def _launch(machine: str, *roles: tuple[RoleKind, str]) -> MachineLaunch:
    launches = tuple(RoleLaunch.of(k, RoleName.parse(r), ("true",)) for k, r in roles)
    return MachineLaunch(machine=machine, roles=launches)


LAUNCHES = [
    _launch("m0", ("store", "store:0"), ("store", "store:2:r"), ("trainer", "trainer:0")),
    _launch("m1", ("store", "store:1"), ("store", "store:0:r"), ("trainer", "trainer:1")),
    _launch("m2", ("store", "store:2"), ("store", "store:1:r"), ("trainer", "trainer:2")),
]


def _elastic(min_machines: int, max_rejoins: int = 0) -> ElasticSpec:
    return ElasticSpec(min_machines=min_machines, max_rejoins=max_rejoins)


def test_the_event_names_what_took_over():
    event = machine_lost_event("m1", LAUNCHES, -9, ["m1"])
    assert event.machine == "m1" and event.exit_code == -9
    assert event.took_over == TookOver({"partition 1": "store:1:r on m2"}, ["m0", "m2"])
    assert parse_event(event_text(event)) == event


def _exit(machine: str, code: int) -> RoleExit:
    return RoleExit(RoleName.worker(machine), machine, code)


def test_a_dead_worker_is_a_lost_machine_only_while_enough_are_left(tmp_path):
    sink = io.StringIO()
    machines = LocalMachines(tmp_path, sink, elastic=_elastic(2))
    states = {"m0": "training", "m1": "training", "m2": "training"}
    assert machines._survive(LAUNCHES, states, [_exit("m1", -9)]) == []
    assert machines.lost == ["m1"]
    assert json.loads(sink.getvalue())["event"] == "machine_lost"
    fatal = machines._survive(LAUNCHES, states, [_exit("m2", -9)])  # one left: below 2
    assert [ex.role for ex in fatal] == [RoleName.worker("m2")]
    # a worker that ends before its trainers start fails the attempt; so does any without
    # elastic
    starting = {"m0": "serving", "m1": "serving", "m2": "serving"}
    assert LocalMachines(tmp_path, sink, elastic=_elastic(2))._survive(
        LAUNCHES, starting, [_exit("m1", 1)]
    )
    assert LocalMachines(tmp_path, sink)._survive(LAUNCHES, states, [_exit("m1", -9)])


def test_a_machine_lost_while_another_still_starts_fails_the_attempt(tmp_path):
    # m0 still waits for the store servers, m1's among them: going on without m1 would
    # leave m0 waiting until its ready timeout (a CI run's 60 s deadline passed so)
    machines = LocalMachines(tmp_path, io.StringIO(), elastic=_elastic(2))
    states = {"m0": "serving", "m1": "training", "m2": "training"}
    fatal = machines._survive(LAUNCHES, states, [_exit("m1", -9)])
    assert [ex.role for ex in fatal] == [RoleName.worker("m1")] and machines.lost == []


def test_reformed_events_name_the_machines_to_fence():
    from graphrun.local.elastic import Fencing, reformed_without

    line = f"[trainer:0@m0] {REFORMED}"
    assert reformed_without(line) == ["m1"]
    assert reformed_without(f"[store:0@m0] {REFORMED}") == []  # only a trainer's counts
    assert reformed_without(f"[trainer:0@m0] {REFORMED[:-20]}") == []  # cut short
    # a line that only looks like one: the text, not the event
    assert reformed_without('[trainer:0@m0] {"event": "reformed", "lost_machines": ["m1"]}') == []
    assert reformed_without('[trainer:0@m0] step 3 {"event": "reformed"') == []
    sink = io.StringIO()
    fencing = Fencing(sink)
    fencing.write("[trainer:1@m1] step 3\n" + line + "\n")
    assert sink.getvalue() == "[trainer:1@m1] step 3\n" + line + "\n"  # passed on unchanged
    assert fencing.take() == ["m1"] and fencing.take() == []


def _fake_launches(tmp_path, codes: dict[int, str]) -> list[MachineLaunch]:
    from graphrun.job.hosts import free_ports
    from graphrun.testing.jobs import alone, fake_store, fake_trainer

    ports = free_ports(6)  # a primary and the previous partition's replica on each
    stores = tuple(Endpoint("127.0.0.1", p) for p in ports)
    return [
        MachineLaunch(
            machine=f"m{i}",
            roles=(
                fake_store(RoleName.store(i), f"m{i}", ports[i]),
                fake_store(RoleName.store((i - 1) % 3, replica=1), f"m{i}", ports[3 + i]),
                fake_trainer(RoleName.trainer(i), f"m{i}", codes[i]),
            ),
            wait_for=alone(*stores),
        )
        for i in range(3)
    ]


def _wait_go(go: Path) -> str:
    """A trainer's code that waits for the file ``go``."""
    return f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"


def _when_all_train(run_dir: Path, then: Callable[[], None]) -> threading.Thread:
    """A thread that calls ``then`` once every machine's trainers started (its status
    says training or done; 60 s at most)."""
    from graphrun.record import read_status

    def wait() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = [read_status(run_dir / "status" / f"m{i}.json") for i in range(3)]
            if all(s is not None and s.state in ("training", "done") for s in states):
                break
            time.sleep(0.05)
        then()

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


def _alive(pids: list[int]) -> list[int]:
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            continue
    return out


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_stopped_machine_the_trainers_re_formed_without_is_fenced(tmp_path):
    # m1 stops (SIGSTOP, every process): its worker never ends by itself. Once a trainer
    # says the group re-formed without m1, the launcher counts m1 lost and kills what is
    # left of it; the attempt ends when the others are done (it waited for m1 before)
    go = tmp_path / "go"
    reformed = REFORMED
    wait_go = _wait_go(go)
    codes = {
        0: wait_go + f"print({reformed!r}, flush=True)",
        1: "import time; time.sleep(600)",
        2: wait_go,
    }
    launches = _fake_launches(tmp_path, codes)
    sink = io.StringIO()
    machines = LocalMachines(tmp_path / "run", sink, grace_s=2.0, elastic=_elastic(2))
    stopped: list[int] = []

    def chaos() -> None:
        from graphrun.local.elastic import stop_machine

        stopped.extend(stop_machine("m1"))
        go.write_text("")

    thread = _when_all_train(tmp_path / "run", chaos)
    try:
        result = machines.run(launches, deadline=time.monotonic() + 60)
    finally:
        thread.join()
        go.write_text("")
    assert stopped, "m1 was never stopped"
    assert result.states["m0"] == "done" and result.states["m2"] == "done"
    assert machines.lost == ["m1"]
    [lost] = [json.loads(x) for x in sink.getvalue().splitlines() if '"machine_lost"' in x]
    assert lost["machine"] == "m1" and lost["fenced"] == "the trainers re-formed without it"
    assert lost["took_over"]["trainers"] == ["m0", "m2"]
    assert _alive(stopped) == []  # fenced: none of m1's processes is left


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_failed_trainer_of_an_elastic_job_loses_its_machine_not_the_attempt(tmp_path):
    # a trainer that gives up (cut off) or crashes: its machine is lost, the others go on
    # (without elastic, or one loss too many, it fails the attempt as before). Trainer 1
    # gives up once every machine trains: a loss while one still starts fails the attempt
    go = tmp_path / "go"
    cut_off = _wait_go(go) + "raise SystemExit('cut off')"
    codes = {0: "import time; time.sleep(1.5)", 1: cut_off, 2: "pass"}
    sink = io.StringIO()
    machines = LocalMachines(tmp_path / "run", sink, grace_s=2.0, elastic=_elastic(2))
    thread = _when_all_train(tmp_path / "run", lambda: go.write_text(""))
    try:
        result = machines.run(_fake_launches(tmp_path, codes), deadline=time.monotonic() + 60)
    finally:
        go.write_text("")
        thread.join()
    assert result.states["m0"] == "done" and machines.lost == ["m1"]
    [lost] = [json.loads(x) for x in sink.getvalue().splitlines() if '"machine_lost"' in x]
    assert lost["fenced"].startswith("trainer:1 failed: cut off"), lost
    strict = LocalMachines(tmp_path / "run2", io.StringIO(), grace_s=2.0, elastic=_elastic(3))
    with pytest.raises(JobFailed, match="cut off"):
        strict.run(_fake_launches(tmp_path, codes), deadline=time.monotonic() + 60)


def test_a_lost_machine_is_started_again_to_rejoin_at_most_max_rejoins_times(tmp_path):
    sink = io.StringIO()
    machines = LocalMachines(tmp_path, sink, elastic=_elastic(2, max_rejoins=2))
    machines.rejoins.delay_s = 0.0
    states = {"m0": "training", "m1": "training", "m2": "training"}
    for n in (1, 2):
        assert machines._survive(LAUNCHES, states, [_exit("m1", -9)]) == []
        # not before the trainers re-formed without it (their re-form's fencing would
        # take its new worker for the lost one), nor while its old worker runs
        assert machines.rejoins.due(LAUNCHES, sink) == []
        machines.rejoins.seen(["m1"])
        assert machines.rejoins.due(LAUNCHES, sink, busy=[RoleName.worker("m1")]) == []
        [back] = machines.rejoins.due(LAUNCHES, sink)
        assert back.machine == "m1"
        machines.lost.remove("m1")  # as run() does: its worker's exit matters again
        event = json.loads(sink.getvalue().splitlines()[-1])
        assert event["event"] == "relaunched" and event["rejoin"] == n
        # started again, it may die before its trainers start: still a lost machine
        states["m1"] = "starting"
    assert machines._survive(LAUNCHES, states, [_exit("m1", 1)]) == []
    machines.rejoins.seen(["m1"])
    assert machines.rejoins.due(LAUNCHES, sink) == []  # twice is the most
    assert machines.rejoins.skip(machines.lost) == {"m1"}  # its reported failure: no end
    # without rejoins a lost machine stays lost
    alone = LocalMachines(tmp_path, sink, elastic=_elastic(2))
    alone.rejoins.delay_s = 0.0
    assert alone._survive(LAUNCHES, states | {"m1": "training"}, [_exit("m1", -9)]) == []
    alone.rejoins.seen(["m1"])
    assert alone.rejoins.due(LAUNCHES, sink) == []


def test_a_machine_back_runs_its_trainers_only_in_join_mode():
    back = LAUNCHES[1].joining()
    assert [r.role for r in back.roles] == [RoleName.trainer(1)]
    assert back.roles[0].argv[-1] == "--join" and back.wait_for == ()


def test_a_machine_back_that_never_came_in_is_stopped_once_the_others_are_done(tmp_path):
    from graphrun.local.elastic import Rejoins
    from graphrun.machine.process import Supervisor

    rejoins = Rejoins(_elastic(1, max_rejoins=1), grace_s=0.0)
    rejoins.started.add("m1")
    with Supervisor[RoleName](tmp_path / "logs", io.StringIO(), grace_s=1.0) as sup:
        sup.start(RoleCommand(RoleName.worker("m1"), "m1", ("sleep", "60")))
        states = {"m0": "training", "m1": "training", "m2": "done"}
        lost: list[str] = []
        assert not rejoins.finished(states, lost, sup)  # m0 still trains
        states["m0"] = "done"
        assert not rejoins.finished(states, lost, sup)  # m1 gets wait_s more
        rejoins.wait_s = 0.0
        assert rejoins.finished(states, lost, sup)
        assert lost == ["m1"] and RoleName.worker("m1") in sup.exits()
        # every machine done: finished at once
        assert Rejoins(_elastic(1, max_rejoins=1), 0.0).finished(
            dict.fromkeys(states, "done"), [], sup
        )


def test_a_worker_joins_with_join_or_the_environment_variable():
    from graphrun.cli import build_parser
    from graphrun.cli.worker import JOIN_ENV, joins

    plain = build_parser().parse_args(["worker", "--plan", "m1.json"])
    flag = build_parser().parse_args(["worker", "--plan", "m1.json", "--join"])
    assert JOIN_ENV == "GRAPHRUN_ELASTIC_JOIN"  # what the operator sets on a replacement pod
    assert not joins(plain, {}) and joins(flag, {})
    assert joins(plain, {JOIN_ENV: "1"}) and not joins(plain, {JOIN_ENV: "0"})


def test_a_loss_that_takes_a_partitions_last_copy_fails_the_attempt(tmp_path):
    # partition 0: primary on m0, replica on m1. Losing m1 and then m0 leaves it no copy;
    # minMachines 1 allowed both (the launcher counted machines only)
    machines = LocalMachines(tmp_path, io.StringIO(), elastic=_elastic(1))
    states = {"m0": "training", "m1": "training", "m2": "training"}
    assert machines._survive(LAUNCHES, states, [_exit("m1", -9)]) == []
    fatal = machines._survive(LAUNCHES, states, [_exit("m0", -9)])
    assert [ex.role for ex in fatal] == [RoleName.worker("m0")] and machines.lost == ["m1"]


def test_a_machine_back_from_a_loss_holds_no_copy(tmp_path):
    # m1 lost and started again runs its trainers only: partition 1 (primary on m1) lives
    # on m2's replica alone, so losing m2 then fails the attempt
    machines = LocalMachines(tmp_path, io.StringIO(), elastic=_elastic(1, max_rejoins=1))
    machines.rejoins.delay_s = 0.0
    states = {"m0": "training", "m1": "training", "m2": "training"}
    assert machines._survive(LAUNCHES, states, [_exit("m1", -9)]) == []
    machines.rejoins.seen(["m1"])
    [back] = machines.rejoins.due(LAUNCHES, io.StringIO())
    machines.lost.remove(back.machine)
    fatal = machines._survive(LAUNCHES, states, [_exit("m2", -9)])
    assert [ex.role for ex in fatal] == [RoleName.worker("m2")]


def _survivor_failed(status: Path, machine: str, rank: int) -> None:
    failure = {
        "role": f"trainer:{rank}", "machine": machine, "exit_code": 1, "time": time.time(),
        "reason": "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:6049",
    }  # fmt: skip
    (status / f"{machine}.json").write_text(
        json.dumps({"machine": machine, "state": "failed", "failure": failure})
    )


def test_the_machine_that_died_is_blamed_not_a_survivor_that_noticed_it(tmp_path):
    # every process of m1 killed: its worker writes no failure; the survivors' trainers
    # fail on "Connection closed by peer" and report it (issue 40, item 7a)
    _survivor_failed(tmp_path, "m2", 2)
    _survivor_failed(tmp_path, "m0", 0)
    dead = RoleExit(RoleName.worker("m1"), "m1", -9)
    got = LocalMachines._failure(tmp_path, [dead])
    assert (got.role, got.host, got.exit_code) == (RoleName.worker("m1"), "m1", -9)
    # a machine the others first went on without (elastic), then could not
    got = LocalMachines._failure(tmp_path, [], lost={"m1": -9})
    assert (got.role, got.host, got.exit_code) == (RoleName.worker("m1"), "m1", -9)
    assert "machine was lost" in got.reason
    # a survivor that failed by itself is still the cause
    (tmp_path / "m0.json").write_text(json.dumps({"machine": "m0", "state": "failed",
        "failure": {"role": "trainer:0", "machine": "m0", "exit_code": 1, "time": 1.0,
                    "reason": "ValueError: bad feature"}}))  # fmt: skip
    assert LocalMachines._failure(tmp_path, [dead]).role == RoleName.trainer(0)
    # nothing reported: a lost machine the others go on without fails nothing
    for p in tmp_path.glob("*.json"):
        p.unlink()
    assert LocalMachines._failure(tmp_path, [], lost={"m1": -9}) is None
