"""A run directory as the report reads it: one typed :class:`Run`.

What ``graphrun run`` leaves in ``RUN/`` (:mod:`graphrun.machine.roles`) and what each
part gives the report:

=========================  ==========================================================
``state.json``             the phase, conditions and failure (a
                           :class:`~graphrun.job.workflow.RunState`), and ``jobFile``:
                           the spec, whose plan the report compares with
``metrics.jsonl``          one record per epoch (:mod:`graphrun.train.loop`): loss,
                           metrics, epoch time, the step breakdown per trainer
``launch/<m>.json``        which roles machine ``m`` ran (:mod:`graphrun.machine.launch`)
``status/<m>.json``        its state, failure and the roles' CPU seconds and peak memory
                           (:mod:`graphrun.machine.worker`, :mod:`graphrun.machine.usage`)
``<plan>.schedule.json``   beside a ``placement.planFile``: the simulated schedules
                           ``graphrun plan`` wrote (:mod:`graphrun.placement.schedule`)
=========================  ==========================================================

A directory without ``state.json`` is not a run directory, and a run that has not
failed and has no epoch record yet has nothing to show: both are a
:class:`~graphrun.errors.UserError` naming what is missing, and a ``state.json`` that is
not a job status one naming the field. A failed run is read with what exists.

Every file is read as :mod:`.files` reads them (regular files inside the directory,
bounded) and decoded into the types below, which declare what the report reads of
each (of a launch file, :class:`Launched`: its machine and roles, which every version of
:class:`~graphrun.machine.launch.MachineLaunch` has). A file or a
``metrics.jsonl`` line that is not what it should be is skipped with a note naming it
and the field, and the rest is rendered: never a traceback, never a hang.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from graphrun.errors import JOB, RunFileError, SpecError, UserError, WorkflowError
from graphrun.job.spec import MAX_ROLES  # a machine has at most a job's roles
from graphrun.job.workflow import Event, EventKind, JobStatus, Phase, read_run_state
from graphrun.machine.launch import RoleLaunch
from graphrun.names import RoleName
from graphrun.placement.schedule import Schedule, parse_schedules, schedule_file
from graphrun.record import MAX_NAME, EpochRecord, MachineStatus, decode_status, parse_epoch
from graphrun.report import files
from graphrun.report.files import decode_json, read_file
from graphrun.wire import convert

MAX_LINE_NOTES = 20  # notes of skipped lines of metrics.jsonl; the rest are counted


@dataclass(frozen=True)
class Failure:
    role: RoleName | Literal["job"]  # the job as a whole (cancelled, deadline): no role
    machine: str
    exit_code: int | None
    reason: str

    def line(self) -> str:
        code = "" if self.exit_code is None else f", exit code {self.exit_code}"
        where = f"{self.role} on {self.machine}" if self.machine not in ("", "-") else self.role
        return f"{where}{code}: {self.reason}"


@dataclass(frozen=True)
class Machine:
    name: str
    roles: tuple[RoleName, ...]  # in launch order
    state: str | None = None  # the worker's last state
    usage: dict[RoleName, dict[str, float]] = field(default_factory=dict)  # cpu_s, peak


@dataclass(frozen=True)
class Plan:
    """A planned job's plan: the file, and its simulated schedules (none when the plan is
    inline or was written without them); ``note`` says why there are none."""

    source: str
    schedules: tuple[Schedule, ...] = ()
    note: str = ""

    def schedule(self, label: str) -> Schedule | None:
        return next((s for s in self.schedules if s.label == label), None)


class Launched(msgspec.Struct, frozen=True):
    """What the report reads of a launch file: its machine and roles. The rest (what the
    machine waited for, changed in version 2) is left unread, so an older run's file is
    read too."""

    machine: str
    roles: tuple[RoleLaunch, ...]


@dataclass(frozen=True)
class Run:
    path: Path
    name: str
    phase: str
    epochs: tuple[dict[str, Any], ...]  # as written (a task's metrics are the fields it has)
    machines: tuple[Machine, ...]
    records: tuple[EpochRecord, ...] = ()  # the same epochs, as declared
    failure: Failure | None = None
    plan: Plan | None = None
    job_file: Path | None = None
    restarts: int = 0
    notes: tuple[str, ...] = ()  # what could not be read, one line each

    @property
    def task(self) -> str:
        first = self.epochs[0] if self.epochs else {}
        return "link-prediction" if "train_auc" in first else "classification"

    def role_machine(self) -> dict[RoleName, str]:
        return {r: m.name for m in self.machines for r in m.roles}


def _skipped(exc: RunFileError) -> str:
    msg = str(exc)
    return msg if msg.endswith("(not read)") else f"{msg} (skipped)"


def _json(path: Path, run: Path) -> Any:
    """The JSON of ``path`` in the run directory ``run`` (None when there is none)."""
    data = read_file(path, files.JSON_CAP, inside=run)
    return None if data is None else decode_json(data, str(path))


def read_epochs(
    path: Path, run: Path | None = None
) -> tuple[list[tuple[dict[str, Any], EpochRecord]], list[str]]:
    """The epoch records of ``metrics.jsonl`` (its last record per epoch: a resumed run
    appends the epochs it ran again), each as written and as declared, and a note per line
    that is not one. RunFileError when the file cannot be read at all."""
    records: dict[int, tuple[dict[str, Any], EpochRecord]] = {}
    notes: list[str] = []
    rows, dropped, skipped = 0, False, 0
    data = read_file(path, files.METRICS_CAP, inside=run or path.parent)
    lines = [] if data is None else data.decode("utf-8", "replace").splitlines()
    if len(lines) > files.MAX_RECORDS:
        notes.append(f"{path}: over {files.MAX_RECORDS} lines (the first {files.MAX_RECORDS} read)")
    for i, line in enumerate(lines[: files.MAX_RECORDS], 1):
        if not line.strip():
            continue
        where = f"{path}: line {i}"
        try:
            rec = decode_json(line, where)
            epoch = parse_epoch(rec, where, RunFileError)
        except RunFileError as exc:
            skipped += 1
            if skipped <= MAX_LINE_NOTES:
                notes.append(_skipped(exc))
            continue
        rows += len(epoch.trainers)
        if rows > files.MAX_TRAINER_ROWS and epoch.trainers:
            if not dropped:
                notes.append(f"{where}: over {files.MAX_TRAINER_ROWS} trainer rows in all "
                             "(the trainers' part of this and later epochs not read)")  # fmt: skip
            rec, dropped = {k: v for k, v in rec.items() if k != "trainers"}, True
            epoch = msgspec.structs.replace(epoch, trainers=[])
        records[epoch.epoch] = (rec, epoch)
    if skipped > MAX_LINE_NOTES:
        notes.append(f"{path}: {skipped - MAX_LINE_NOTES} more lines skipped")
    return [records[e] for e in sorted(records)], notes


def _failure(status: JobStatus, statuses: list[MachineStatus]) -> Failure | None:
    if status.phase is not Phase.FAILED:
        return None
    f = status.failure or Event(EventKind.FAIL)
    for s in statuses:  # the worker's own words name the role that failed first
        sf = s.failure
        if sf is not None and f.role in (None, sf.role):
            return Failure(sf.role, sf.machine, sf.exit_code, sf.reason)
    reason = f.message or f.reason or "the job failed"
    return Failure(f.role or JOB, f.machine or "-", f.exit_code, reason)


def _files(run: Path, sub: str, notes: list[str]) -> list[Path]:
    cap = files.MAX_FILES
    found = sorted(itertools.islice((run / sub).glob("*.json"), cap + 1))
    if len(found) > cap:
        notes.append(f"{run / sub}: over {cap} files ({cap} of them read)")
    return found[:cap]


def _launch(p: Path, run: Path) -> Launched:
    launch = convert(Launched, _json(p, run), str(p), RunFileError)
    for name in (launch.machine, *(str(r.role) for r in launch.roles)):
        if not 0 < len(name) <= MAX_NAME:
            raise RunFileError(f"{p}: {name[:40]!r}...: not a name of 1 to {MAX_NAME} characters")
    return launch


def _machines(run: Path, notes: list[str]) -> tuple[list[Machine], list[MachineStatus]]:
    machines: dict[str, Machine] = {}
    statuses = []
    for p in _files(run, "launch", notes):
        try:
            launch = _launch(p, run)
        except RunFileError as exc:
            notes.append(_skipped(exc))
            continue
        machines[launch.machine] = Machine(launch.machine, tuple(r.role for r in launch.roles))
    for p in _files(run, "status", notes):
        try:
            data = read_file(p, files.JSON_CAP, inside=run)
            if data is None:
                continue
            st = decode_status(data, str(p), RunFileError)
            if len(st.usage.roles if st.usage else ()) > MAX_ROLES:
                raise RunFileError(f"{p}: usage.roles: over {MAX_ROLES} roles")
        except RunFileError as exc:
            notes.append(_skipped(exc))
            continue
        statuses.append(st)
        name = st.machine
        roles = machines[name].roles if name in machines else tuple(st.roles)
        usage = {
            role: {k: v for k, v in msgspec.structs.asdict(u).items() if v is not None}
            for role, u in (st.usage.roles if st.usage else {}).items()
        }
        machines[name] = Machine(name, roles, st.state, usage)
    return sorted(machines.values(), key=lambda m: _natural(m.name)), statuses


def _natural(name: str) -> tuple:
    digits = "".join(c for c in name if c.isdigit())
    return (name.rstrip("0123456789"), int(digits) if digits else -1, name)


def _plan(job_file: Path | None, notes: list[str]) -> Plan | None:
    """The plan of the job, if it is planned (and the spec can be read)."""
    from graphrun.job.spec import loads_job

    try:
        text = None if job_file is None else read_file(job_file, files.JSON_CAP)
        if job_file is None or text is None:
            return None
        job = loads_job(text.decode("utf-8", "replace"), str(job_file))
    except RunFileError as exc:
        notes.append(f"the job file: {exc}")
        return None
    except UserError:
        return None
    p = job.spec.placement
    if p.plan is not None:
        return Plan("spec.placement.plan (inline)", note="an inline plan carries no schedule")
    if p.plan_file is None:
        return None
    plan_file = job_file.parent / p.plan_file
    sched = schedule_file(plan_file)
    try:
        data = read_file(sched, files.JSON_CAP)
        if data is None:
            return Plan(str(plan_file), note=f"{sched.name} is missing (run graphrun plan again)")
        return Plan(str(plan_file), tuple(parse_schedules(data, str(sched))))
    except SpecError as exc:  # a RunFileError too
        return Plan(str(plan_file), note=str(exc))


def read_run(path: Path) -> Run:
    """The run in ``path``; UserError naming what is missing when there is nothing to show
    (or, one line, what is wrong with its ``state.json``)."""
    path = Path(path)
    state = _json(path / "state.json", path) if path.is_dir() else None
    if not isinstance(state, dict) or "phase" not in state:
        what = "is not a directory" if not path.is_dir() else "has no readable state.json"
        raise UserError(f"{path}: not a run directory ({what}; graphrun run writes one)")
    try:
        status = read_run_state(state, where=str(path / "state.json"))
    except WorkflowError as exc:
        raise UserError(str(exc)) from None
    try:
        read, notes = read_epochs(path / "metrics.jsonl", path)
    except RunFileError as exc:
        read, notes = [], [str(exc)]
    epochs = [rec for rec, _ in read]
    machines, statuses = _machines(path, notes)
    failure = _failure(status, statuses)
    if not epochs and failure is None:
        unread = next((n for n in notes if n.startswith(str(path / "metrics.jsonl"))), None)
        raise UserError(
            unread if unread and unread.endswith("(not read)") else
            f"{path}: no metrics yet ({path / 'metrics.jsonl'} has no epoch record; "
            f"the job is {status.phase.value})"
        )  # fmt: skip
    job_file = Path(status.job_file) if status.job_file is not None else None
    return Run(
        path=path,
        name=path.name,
        phase=status.phase.value,
        epochs=tuple(epochs),
        machines=tuple(machines),
        records=tuple(epoch for _, epoch in read),
        failure=failure,
        plan=_plan(job_file, notes),
        job_file=job_file,
        restarts=status.restarts,
        notes=tuple(notes),
    )
