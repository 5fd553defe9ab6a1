"""A run directory as the report reads it: one typed :class:`Run`.

What ``graphrun run`` leaves in ``RUN/`` (:mod:`graphrun.machine.roles`) and what each
part gives the report:

=========================  ==========================================================
``state.json``             the phase, conditions and failure (a
                           :class:`~graphrun.job.workflow.JobStatus`), and ``jobFile``:
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
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphrun.errors import SpecError, UserError, WorkflowError
from graphrun.job.workflow import Event, EventKind, JobStatus, Phase, state_from_dict
from graphrun.placement.schedule import Schedule, read_schedules, schedule_file


@dataclass(frozen=True)
class Failure:
    role: str
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
    roles: tuple[str, ...]  # in launch order
    state: str | None = None  # the worker's last state
    usage: dict[str, dict[str, float]] = field(default_factory=dict)  # role -> cpu_s, peak


@dataclass(frozen=True)
class Plan:
    """A planned job's plan: the file, and its simulated schedules (none when the plan is
    inline or was written without them); ``note`` says why there are none."""

    source: str
    schedules: tuple[Schedule, ...] = ()
    note: str = ""

    def schedule(self, label: str) -> Schedule | None:
        return next((s for s in self.schedules if s.label == label), None)


@dataclass(frozen=True)
class Run:
    path: Path
    name: str
    phase: str
    epochs: tuple[dict[str, Any], ...]
    machines: tuple[Machine, ...]
    failure: Failure | None = None
    plan: Plan | None = None
    job_file: Path | None = None
    restarts: int = 0
    notes: tuple[str, ...] = ()  # what could not be read, one line each

    @property
    def task(self) -> str:
        first = self.epochs[0] if self.epochs else {}
        return "link-prediction" if "train_auc" in first else "classification"

    def role_machine(self) -> dict[str, str]:
        return {r: m.name for m in self.machines for r in m.roles}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_epochs(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The epoch records of ``metrics.jsonl`` (its last record per epoch: a resumed run
    appends the epochs it ran again) and a note per line that is not one."""
    records: dict[int, dict[str, Any]] = {}
    notes: list[str] = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return [], []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            notes.append(f"{path}: line {i}: not JSON (skipped)")
            continue
        if isinstance(rec, dict) and isinstance(rec.get("epoch"), int) and "loss" in rec:
            records[rec["epoch"]] = rec
        else:
            notes.append(f"{path}: line {i}: not an epoch record (skipped)")
    return [records[e] for e in sorted(records)], notes


def _failure(status: JobStatus, statuses: list[dict[str, Any]]) -> Failure | None:
    if status.phase is not Phase.FAILED:
        return None
    f = status.failure or Event(EventKind.FAIL)
    for s in statuses:  # the worker's own words name the role that failed first
        sf = s.get("failure")
        if isinstance(sf, dict) and f.role in (None, sf.get("role")):
            return Failure(
                str(sf.get("role", "?")), str(sf.get("machine", "?")), sf.get("exit_code"),
                str(sf.get("reason", "")),
            )  # fmt: skip
    reason = f.message or f.reason or "the job failed"
    return Failure(f.role or "job", f.machine or "-", f.exit_code, reason)


def _machines(run: Path) -> tuple[list[Machine], list[dict[str, Any]]]:
    machines: dict[str, Machine] = {}
    statuses = []
    for p in sorted((run / "launch").glob("*.json")):
        d = _json(p)
        if isinstance(d, dict) and isinstance(d.get("roles"), list):
            roles = tuple(str(r.get("role")) for r in d["roles"] if isinstance(r, dict))
            machines[str(d.get("machine", p.stem))] = Machine(str(d.get("machine", p.stem)), roles)
    for p in sorted((run / "status").glob("*.json")):
        d = _json(p)
        if not isinstance(d, dict):
            continue
        statuses.append(d)
        name = str(d.get("machine", p.stem))
        usage = (d.get("usage") or {}).get("roles") or {}
        roles = machines[name].roles if name in machines else tuple(d.get("roles") or ())
        machines[name] = Machine(name, roles, d.get("state"), dict(usage))
    return sorted(machines.values(), key=lambda m: _natural(m.name)), statuses


def _natural(name: str) -> tuple:
    digits = "".join(c for c in name if c.isdigit())
    return (name.rstrip("0123456789"), int(digits) if digits else -1, name)


def _plan(job_file: Path | None) -> Plan | None:
    """The plan of the job, if it is planned (and the spec can be read)."""
    if job_file is None or not job_file.is_file():
        return None
    from graphrun.job.spec import load_job

    try:
        job = load_job(job_file)
    except UserError:
        return None
    p = job.spec.placement
    if p.plan is not None:
        return Plan("spec.placement.plan (inline)", note="an inline plan carries no schedule")
    if p.plan_file is None:
        return None
    plan_file = job_file.parent / p.plan_file
    sched = schedule_file(plan_file)
    if not sched.is_file():
        return Plan(str(plan_file), note=f"{sched.name} is missing (run graphrun plan again)")
    try:
        return Plan(str(plan_file), tuple(read_schedules(sched)))
    except SpecError as exc:
        return Plan(str(plan_file), note=str(exc))


def read_run(path: Path) -> Run:
    """The run in ``path``; UserError naming what is missing when there is nothing to show."""
    path = Path(path)
    state = _json(path / "state.json")
    if not isinstance(state, dict) or "phase" not in state:
        what = "is not a directory" if not path.is_dir() else "has no readable state.json"
        raise UserError(f"{path}: not a run directory ({what}; graphrun run writes one)")
    try:
        status = state_from_dict(state, where=str(path / "state.json"))
    except WorkflowError as exc:
        raise UserError(str(exc)) from None
    epochs, notes = read_epochs(path / "metrics.jsonl")
    machines, statuses = _machines(path)
    failure = _failure(status, statuses)
    if not epochs and failure is None:
        raise UserError(
            f"{path}: no metrics yet ({path / 'metrics.jsonl'} has no epoch record; "
            f"the job is {status.phase.value})"
        )
    job_file = Path(state["jobFile"]) if isinstance(state.get("jobFile"), str) else None
    return Run(
        path=path,
        name=path.name,
        phase=status.phase.value,
        epochs=tuple(epochs),
        machines=tuple(machines),
        failure=failure,
        plan=_plan(job_file),
        job_file=job_file,
        restarts=status.restarts,
        notes=tuple(notes),
    )
