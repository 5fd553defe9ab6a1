"""The run record: events, a machine's status and epoch records, one writer and one reader."""

from __future__ import annotations

import io
import json
import typing

import msgspec
import pytest

from graphrun.errors import RunFileError
from graphrun.names import RoleName
from graphrun.record import (
    UNSET,
    EpochRecord,
    FeatureCache,
    FirstStep,
    JoinClosed,
    Joined,
    MachineLeaving,
    MachineLost,
    MachineStatus,
    Model,
    Reformed,
    Rejoined,
    Relaunched,
    Resumed,
    RoleFailure,
    RoleStatus,
    SamplersReady,
    SamplersStarting,
    StoreLost,
    Suspended,
    TookOver,
    Traffic,
    console_events,
    decode_status,
    emit,
    event_text,
    parse_epoch,
    parse_event,
    read_events,
    read_status,
    role_event,
    write_status,
)
from graphrun.record import Event as EventType

REFORMED = Reformed(
    generation=1, epoch=2, step=7, phase="evaluation", lost_trainers=[1], lost_machines=["m1"],
    world_size=2, machines=["m0", "m2"], paused_s=1.25, time=1e9, rest_seeds=40,
)  # fmt: skip
EVENTS = [
    Joined(rank=0, local_parts=[0, 1]),
    Model(task="node-classification", model="GraphSAGE", params=1234, precision="bf16"),
    Resumed(from_epoch=3),
    Resumed(from_epoch=3, at_step=12),
    FirstStep(time=1e9),
    FeatureCache(rank=1, rows=500, budget_mb=64, plan_s=0.25),
    SamplersStarting(rank=0, workers=2),
    SamplersReady(rank=0, workers=2, start_s=3.5),
    Suspended(epoch=2, step=9),
    Traffic(rank=0, received={"1": {"pull": 4096}}),
    REFORMED,
    Rejoined(
        machine="m1",
        trainers=[1],
        generation=2,
        epoch=3,
        world_size=3,
        machines=["m0", "m1", "m2"],
        waited_s=0.5,
        time=1e9,
    ),
    JoinClosed(trainer=1, reason="the trainers finished"),
    StoreLost(
        role=RoleName.store(0, replica=1),
        machine="m1",
        exit_code=-9,
        reason="killed",
        time=1e9,
        took_over="its replica (clients fail over)",
    ),
    MachineLeaving(machine="m1", time=1e9),
    MachineLost(machine="m1", exit_code=None, time=1e9, took_over=TookOver({}, ["m0"])),
    MachineLost(
        machine="m1",
        exit_code=-9,
        time=1e9,
        took_over=TookOver({"partition 1": "store:1:r on m2"}, ["m0", "m2"]),
        fenced="the trainers re-formed without it",
    ),
    Relaunched(machine="m1", rejoin=1, max_rejoins=2, roles="trainers", time=1e9),
]


def test_every_kind_of_event_has_a_case_here():
    kinds = {type(e) for e in EVENTS}
    assert kinds == set(typing.get_args(EventType))


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_an_event_is_one_json_line_read_back_as_itself(event):
    out = io.StringIO()
    emit(event, out)
    line = out.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    tag = type(event).__struct_config__.tag
    assert line.startswith(f'{{"event": "{tag}"')  # as the lines were written before
    assert parse_event(line.rstrip("\n")) == event
    assert json.loads(line)["event"] == tag


def test_optional_fields_are_left_out_when_unset():
    assert event_text(Resumed(from_epoch=3)) == '{"event": "resumed", "from_epoch": 3}'
    assert "fenced" not in event_text(EVENTS[-3]) and "fenced" in event_text(EVENTS[-2])
    assert Resumed(from_epoch=1).at_step is UNSET
    # a default is written: readers of the line (and older ones) find every field
    training = msgspec.structs.replace(REFORMED, phase="training")
    assert json.loads(event_text(training))["phase"] == "training"
    assert json.loads(event_text(Model(task="t", model="m", params=1)))["precision"] == "fp32"


@pytest.mark.parametrize(
    "text",
    [
        "epoch 1: 100% 4/4 batches",  # a progress line
        '{"epoch": 1, "loss": 0.5}',  # an epoch record
        '{"event": "graph_applied", "version": 3}',  # a kind this graphrun does not know
        '{"event": "reformed", "generation": 1, "lost_machines": ["m1"]}',  # fields missing
        '{"event": "joined", "rank": "zero", "local_parts": []}',  # a field of another type
        '{"event": "store_lost", "role": "store", "machine": "m0", "exit_code": 1, '
        '"reason": "", "time": 1.0, "took_over": ""}',  # not a role name
        '{"event": "joined", "rank": 0, "local_parts": [0',  # cut short
        '{"event": ' + " " * (1 << 20) + "}",  # too long
        "",
    ],
)
def test_a_line_that_is_no_declared_event_is_none_never_an_error(text):
    assert parse_event(text) is None


def test_a_console_line_is_the_role_machine_and_event():
    line = f"[trainer:1@m1] {event_text(REFORMED)}"
    assert role_event(line) == (RoleName.trainer(1), "m1", REFORMED)
    assert role_event(event_text(REFORMED)) is None  # no prefix
    assert role_event(f"[nobody@m1] {event_text(REFORMED)}") is None  # no role
    assert role_event("[trainer:1@m1] epoch 2: loss 0.5") is None
    text = f"[graphrun] phase Training\n{line}\n[store:0@m0] {event_text(EVENTS[0])}\n"
    assert console_events(text) == [REFORMED, EVENTS[0]]
    assert list(read_events(["x\n", event_text(REFORMED) + "\n"])) == [REFORMED]


def test_a_machine_status_is_written_and_read_back_with_typed_roles(tmp_path):
    status = MachineStatus(
        machine="m0",
        state="failed",
        roles={
            RoleName.store(0): RoleStatus(11, None),
            RoleName.trainer(0): RoleStatus(12, 1, True),
        },
        failure=RoleFailure(RoleName.trainer(0), "m0", 1, "boom", 1e9),
        time=1e9,
    )
    path = tmp_path / "m0.json"
    write_status(path, status)
    data = json.loads(path.read_text())
    assert data["roles"] == {
        "store:0": {"pid": 11, "exit_code": None, "warm": False},
        "trainer:0": {"pid": 12, "exit_code": 1, "warm": True},
    }
    assert data["failure"]["role"] == "trainer:0"
    back = read_status(path)
    assert back == status
    assert back.pids() == {RoleName.store(0): 11, RoleName.trainer(0): 12}


def test_a_status_that_is_not_one_is_none_to_the_launcher_and_one_line_to_the_report(tmp_path):
    path = tmp_path / "m0.json"
    assert read_status(path) is None  # not written yet
    bad = {"machine": "m0", "state": "training", "roles": {"trainer:x": {"pid": 1}}}
    path.write_text(json.dumps(bad))
    assert read_status(path) is None
    with pytest.raises(RunFileError, match=r"m0.json: .*'trainer:x' is not a role name"):
        decode_status(path.read_bytes(), str(path), RunFileError)
    bad = {"machine": "m0", "state": "sleeping"}
    with pytest.raises(RunFileError, match=r"^m0.json: state: Invalid enum value 'sleeping'$"):
        decode_status(json.dumps(bad).encode(), "m0.json", RunFileError)
    with pytest.raises(RunFileError, match="not JSON"):
        decode_status(b"{", "m0.json", RunFileError)


def test_an_epoch_record_carries_its_re_forms_typed():
    rec = {"epoch": 2, "loss": 0.5, "val_acc": 0.9, "reforms": [msgspec.to_builtins(REFORMED)]}
    epoch = parse_epoch(rec, "metrics.jsonl: line 3", RunFileError)
    assert isinstance(epoch, EpochRecord) and epoch.reforms == [REFORMED]
    rec["reforms"] = [{"event": "rejoined"}]
    with pytest.raises(
        RunFileError, match=r"^metrics.jsonl: line 3: reforms\[0\].event: Invalid value 'rejoined'$"
    ):
        parse_epoch(rec, "metrics.jsonl: line 3", RunFileError)
    with pytest.raises(RunFileError, match="not an epoch record"):
        parse_epoch([1], "metrics.jsonl: line 3", RunFileError)


def test_an_epoch_record_of_as_many_trainers_as_a_job_may_have_is_read():
    """The record allowed 256 trainers while the spec allows 4096: a larger job's epochs
    were dropped by the console and refused by the report."""
    from graphrun.job.spec import MAX_TRAINERS

    rec = {"epoch": 0, "loss": 0.5, "trainers": [{"rank": r} for r in range(MAX_TRAINERS)]}
    epoch = parse_epoch(rec, "metrics.jsonl: line 1", RunFileError)
    assert [t.rank for t in epoch.trainers] == list(range(MAX_TRAINERS))
    with pytest.raises(RunFileError, match=r"^metrics.jsonl: line 1: trainers: "):
        parse_epoch(
            {**rec, "trainers": [{"rank": 0}] * (MAX_TRAINERS + 1)},
            "metrics.jsonl: line 1",
            RunFileError,
        )


def test_an_epoch_record_declares_the_disk_feature_fields():
    """`disk_hit_rate` and `disk_bytes` were written by the loop but not declared, so the
    record's one reader passed them through unchecked."""
    rec = {"epoch": 0, "loss": 0.5, "disk_hit_rate": 0.47, "disk_bytes": 247_000_000_000}
    epoch = parse_epoch(rec, "metrics.jsonl: line 1", RunFileError)
    assert (epoch.disk_hit_rate, epoch.disk_bytes) == (0.47, 247_000_000_000)
    with pytest.raises(RunFileError, match=r"^metrics.jsonl: line 1: disk_bytes: "):
        parse_epoch({**rec, "disk_bytes": -1}, "metrics.jsonl: line 1", RunFileError)
