"""What a running job says about itself, declared once: events, machine status, epoch records.

Three records cross from the processes of a job to the launcher, the console, the report
and the tests; each is a ``msgspec.Struct`` here, with one writer and one reader:

* **Events** — one JSON line each on a role's stdout (so in ``RUN/logs/<role>.log``, and
  on the launcher's console behind the ``[role@machine]`` prefix)::

      [trainer:0@m0] {"event": "reformed", "generation": 1, "epoch": 2, ...}

  :data:`Event` is the tagged union (tag field ``event``) of every kind; :func:`emit`
  is the writer (one line, ``json.dumps``'s spacing, as the lines always were) and
  :func:`parse_event` / :func:`role_event` the reader: a line that is not an event of a
  known kind is None (a consumer passes it over), never an exception. A new kind is one
  class here, added to :data:`Event`.
* **A machine's status** — ``STATUS_DIR/<machine>.json``, rewritten atomically by its
  worker on every change (:class:`MachineStatus`; :func:`write_status`,
  :func:`read_status`).
* **Epoch records** — one line per epoch in ``RUN/metrics.jsonl``
  (:class:`EpochRecord`: what the readers rely on; :mod:`graphrun.train.loop` writes
  more, the per-split metrics a task has); :func:`parse_epoch` reads one.

The run's own state (``RUN/state.json``) is the workflow's status,
:class:`graphrun.job.workflow.RunState`, declared beside the status it extends. Roles
are :class:`~graphrun.names.RoleName` fields: written as their text, parsed once when the
line or file is read.

Like :mod:`graphrun.wire`, this module sits at the bottom: every layer writes or reads
these records.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, TypeVar

import msgspec

from graphrun.errors import GraphrunError
from graphrun.files import write_atomic
from graphrun.names import MAX_TRAINERS, RoleName
from graphrun.wire import dec_hook, decoder, describe, to_builtins

T = TypeVar("T")

MAX_NAME = 253  # characters of a machine or role name (a DNS name's)
MAX_LINE = 1 << 20  # bytes of one event line read: longer ones are not events

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME)]
Count = Annotated[int, msgspec.Meta(ge=0, le=1_000_000_000)]
Number = float | None  # a loss or metric: NaN (a diverged loss) and inf are shown as such
# seconds, CPU seconds, MiB: bounded, so that the report's sums and axes stay finite
Amount = Annotated[float, msgspec.Meta(ge=0, le=1e9)] | None
Unset = msgspec.UnsetType
UNSET = msgspec.UNSET


class _Event(msgspec.Struct, tag_field="event", kw_only=True):
    """An event line; its class's tag (the snake-case kind) is the ``event`` field. Every
    field is written, defaults too; an optional one (``UNSET``) only when it is set."""


# --- a trainer's -------------------------------------------------------------------------


class Joined(_Event, tag="joined"):
    """A trainer joined the job's store; ``local_parts``: those it reads through shared
    memory."""

    rank: int
    local_parts: list[int]


class Model(_Event, tag="model"):
    """Trainer 0's model: task, class, parameters, precision."""

    task: str
    model: str
    params: int
    precision: str = "fp32"


class Resumed(_Event, tag="resumed"):
    """Training resumed from a checkpoint (``at_step``: mid-epoch)."""

    from_epoch: int
    at_step: int | Unset = UNSET


class FirstStep(_Event, tag="first_step"):
    time: float


class FeatureCache(_Event, tag="feature_cache"):
    """A trainer's remote-feature cache, planned."""

    rank: int
    rows: int
    budget_mb: int
    plan_s: float


class SamplersStarting(_Event, tag="samplers_starting"):
    rank: int
    workers: int


class SamplersReady(_Event, tag="samplers_ready"):
    rank: int
    workers: int
    start_s: float


class Suspended(_Event, tag="suspended"):
    """The trainers stopped before ``step`` of ``epoch``; the checkpoint is written."""

    epoch: int
    step: int


class Traffic(_Event, tag="traffic"):
    """Bytes a trainer's client got from each partition's servers, by operation."""

    rank: int
    received: dict[str, dict[str, int]]


class Reformed(_Event, tag="reformed", kw_only=True):
    """An elastic group re-formed without lost trainers, in ``phase`` (``training`` or
    ``evaluation``) at ``step`` of ``epoch``; ``rest_seeds``: the epoch's seeds left."""

    generation: int
    epoch: int
    step: int
    phase: str = "training"  # records written before evaluation re-formed have none
    lost_trainers: list[int]
    lost_machines: list[str]
    world_size: int
    machines: list[str]
    paused_s: float
    time: float
    rest_seeds: int | Unset = UNSET


class Rejoined(_Event, tag="rejoined"):
    """A machine's trainers let into the group at the boundary before ``epoch``."""

    machine: str
    trainers: list[int]
    generation: int
    epoch: int
    world_size: int
    machines: list[str]
    waited_s: float
    time: float


class JoinClosed(_Event, tag="join_closed"):
    """A joiner that was not let in (the trainers finished, or it was told to stop)."""

    trainer: int
    reason: str


# --- a worker's and the launcher's --------------------------------------------------------


class StoreLost(_Event, tag="store_lost"):
    """A replicated store server died; the job goes on (``took_over``: who serves)."""

    role: RoleName
    machine: str
    exit_code: int | None
    reason: str
    time: float
    took_over: str


class MachineLeaving(_Event, tag="machine_leaving"):
    """This machine leaves an elastic job alone (its pod deleted, evicted, drained)."""

    machine: str
    time: float


class TookOver(msgspec.Struct, frozen=True):
    """What serves a lost machine's partitions (``partition P`` -> ``store:P:r on M``)
    and which machines' trainers go on: a ``machine_lost`` event's, and a GraphJob's
    ``status.lostMachines`` entry's."""

    partitions: dict[str, str]
    trainers: list[str]


class MachineLost(_Event, tag="machine_lost"):
    """The launcher counts ``machine`` lost and the job goes on without it; ``fenced``:
    why a machine whose processes still ran was declared lost (they were killed)."""

    machine: str
    exit_code: int | None
    time: float
    took_over: TookOver
    fenced: str | Unset = UNSET


class Relaunched(_Event, tag="relaunched"):
    """A lost machine started again (its trainers only) to re-join."""

    machine: str
    rejoin: int
    max_rejoins: int
    roles: str
    time: float


Event = (
    Joined | Model | Resumed | FirstStep | FeatureCache | SamplersStarting | SamplersReady
    | Suspended | Traffic | Reformed | Rejoined | JoinClosed
    | StoreLost | MachineLeaving | MachineLost | Relaunched
)  # fmt: skip

_EVENTS: msgspec.json.Decoder[Event] = msgspec.json.Decoder(Event, dec_hook=dec_hook)


def event_text(event: Event) -> str:
    """The event's line (without its newline): ``{"event": "<kind>", ...}``."""
    return json.dumps(to_builtins(event))


class Out(Protocol):
    """Where event lines go: a text stream, or the launcher's sink."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


def emit(event: Event, out: Out | None = None) -> None:
    """Write ``event`` as one line to ``out`` (stdout by default) and flush it."""
    out = sys.stdout if out is None else out
    out.write(event_text(event) + "\n")
    out.flush()


def parse_event(text: str) -> Event | None:
    """The event a line (a role's output, without its prefix) is; None when it is none
    of the declared kinds (another line, a malformed or unknown event)."""
    if not text.startswith('{"event"') or len(text) > MAX_LINE:
        return None
    try:
        return _EVENTS.decode(text)
    except msgspec.DecodeError:  # a ValidationError too: an unknown kind, a bad field
        return None


def role_event(line: str) -> tuple[RoleName, str, Event] | None:
    """``(role, machine, event)`` of a launcher's console line ``[role@machine] {...}``;
    None for any other line."""
    if not line.startswith("["):
        return None
    head, sep, text = line[1:].partition("] ")
    role, at, machine = head.partition("@")
    event = parse_event(text) if sep and at and RoleName.is_valid(role) else None
    return None if event is None else (RoleName.parse(role), machine, event)


def console_events(text: str) -> list[Event]:
    """The events of the launcher's console ``text`` (``[role@machine]`` lines)."""
    return [got[2] for line in text.splitlines() if (got := role_event(line)) is not None]


def read_events(lines: Iterable[str]) -> Iterator[Event]:
    """The events among ``lines`` (a role's log), other lines passed over."""
    for line in lines:
        event = parse_event(line.rstrip("\n"))
        if event is not None:
            yield event


# --- a machine's status ------------------------------------------------------------------


class RoleStatus(msgspec.Struct, omit_defaults=False):
    pid: int | None = None
    exit_code: int | None = None
    warm: bool = False  # forked by the host's warm server, not a new interpreter


class RoleFailure(msgspec.Struct):
    """The role that failed a machine first, as its worker saw it."""

    role: RoleName
    machine: str
    exit_code: int | None
    reason: str
    time: float = 0.0


class RoleUsage(msgspec.Struct):
    cpu_s: Amount = None
    peak_rss_mb: Amount = None


class Usage(msgspec.Struct):
    roles: dict[RoleName, RoleUsage] = {}
    cpu_s: Amount = None
    peak_rss_mb: Amount = None


State = Literal["starting", "serving", "training", "done", "failed", "stopped", "left"]


class MachineStatus(msgspec.Struct):
    """``STATUS_DIR/<machine>.json`` (:mod:`graphrun.machine.worker`)::

    {"machine": "m0", "state": "training",
     "roles": {"store:0": {"pid": 123, "exit_code": null, "warm": false}, ...},
     "failure": {"role": "trainer:0", "machine": "m0", "exit_code": 1,
                 "reason": "...", "time": 1790000000.0} | null,
     "usage": {"roles": {"store:0": {"cpu_s": 3.1, "peak_rss_mb": 412.0}}, ...},
     "time": 1790000000.0}
    """

    machine: Name
    state: State
    roles: dict[RoleName, RoleStatus] = {}
    failure: RoleFailure | None = None
    usage: Usage | None = None
    time: float = 0.0

    def pids(self) -> dict[RoleName, int]:
        return {r: s.pid for r, s in self.roles.items() if s.pid}


def write_status(path: Path, status: MachineStatus) -> None:
    write_atomic(path, json.dumps(to_builtins(status)) + "\n")


_STATUS = decoder(MachineStatus)


def decode_status(data: bytes, where: str, error: type[GraphrunError]) -> MachineStatus:
    """The status in ``data`` (a status file's bytes); ``error``, one line naming
    ``where`` and the field, when it is not one."""
    try:
        return _STATUS.decode(data)
    except msgspec.ValidationError as exc:
        raise error(f"{where}: {describe(exc)}") from None
    except msgspec.DecodeError as exc:
        raise error(f"{where}: not JSON ({exc})") from None


def read_status(path: Path) -> MachineStatus | None:
    """The status in ``path``; None when there is none yet, or it is not one (a worker
    that died mid-write leaves none: it is written atomically)."""
    try:
        return _STATUS.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return None


# --- epoch records -----------------------------------------------------------------------


class TrainerRecord(msgspec.Struct):
    """A trainer's part of an epoch record."""

    rank: Annotated[int, msgspec.Meta(ge=0, lt=MAX_TRAINERS)]
    machine: Name | None = None
    epoch_s: Amount = None
    sample_s: Amount = None
    fetch_s: Amount = None
    compute_s: Amount = None
    allreduce_s: Amount = None
    cpu_s: Amount = None
    peak_rss_mb: Amount = None
    cache_hit_rate: Number = None


def _metric(name: str) -> Any:
    return msgspec.field(default=None, name=name)


class EpochRecord(msgspec.Struct):
    """A ``metrics.jsonl`` line, as its readers rely on it (:mod:`graphrun.train.loop`
    writes it, with more fields: the rest is shown as written). ``reforms`` and
    ``rejoins``: the :class:`Reformed` and :class:`Rejoined` events of an elastic
    group in the epoch."""

    epoch: Count
    loss: Number
    train_acc: Number = None
    val_acc: Number = None
    test_acc: Number = None
    train_auc: Number = None
    val_auc: Number = None
    test_auc: Number = None
    val_mrr: Number = None
    test_mrr: Number = None
    val_hits10: Number = _metric("val_hits@10")
    test_hits10: Number = _metric("test_hits@10")
    epoch_s: Amount = None
    eval_s: Amount = None
    seeds_per_s: Amount = None
    steps: Count | None = None
    cache_hit_rate: Number = None
    # runtime.storeFeatures disk (graphrun.store.disk.epoch_fields): the share of pulled
    # feature bytes the hot-row cache served, and the bytes read from the files
    disk_hit_rate: Number = None
    disk_bytes: Annotated[int, msgspec.Meta(ge=0)] | None = None
    trainers: Annotated[list[TrainerRecord], msgspec.Meta(max_length=MAX_TRAINERS)] = []
    reforms: list[Reformed] = []
    rejoins: list[Rejoined] = []


def parse_epoch(data: Any, where: str, error: type[GraphrunError]) -> EpochRecord:
    """The epoch record of ``data`` (a decoded ``metrics.jsonl`` line); ``error``, one
    line naming ``where`` and the field, when it is not one."""
    if not isinstance(data, dict):
        raise error(f"{where}: not an epoch record")
    try:
        return msgspec.convert(data, EpochRecord, str_keys=True)
    except msgspec.ValidationError as exc:
        raise error(f"{where}: {describe(exc)}") from None
