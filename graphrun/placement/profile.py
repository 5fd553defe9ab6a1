"""Job profiles: per-iteration compute times and data volumes as empirical distributions.

Runtime metrics (what the training layer emits)
-----------------------------------------------
Each trainer appends one JSON object per mini-batch to a metrics file (JSON lines,
one object per line). The schema, version 1, is :class:`BatchRecord`::

    {"kind": "batch",
     "sample_s": 0.021,         # seconds to sample this batch (in the sampler)
     "fetch_s": 0.008,          # seconds the trainer spent pulling features
     "structure_bytes": {"0": 5200000, "1": 900000},  # graph structure bytes the sampler
                                                       # pulled from each partition
     "feature_bytes": {"0": 41000000, "1": 12000000}, # feature bytes the trainer pulled
                                                       # from each partition
     "cache_bytes": 9000000,    # feature bytes served by the remote-feature cache (not
                                # in feature_bytes: they crossed no network)
     "v": 1,
     "rank": 0,                 # trainer rank
     "partition": 0,            # the partition that trainer trains on (its "own")
     "iteration": 17,           # iteration number within the run
     "compute_s": 0.013,        # seconds of forward + backward + optimizer step
     "batch_bytes": 7800000,    # bytes of the sampled batch sent sampler -> trainer
     "grad_bytes": 1600000,     # bytes of dense gradients per step (= parameter bytes)
     "sample_cpu_s": 0.018,     # CPU seconds of the trainer's process while it sampled and
     "compute_cpu_s": 0.011,    # fetched, and while it computed, and its intra-op threads
     "threads": 1}              # (optional: what a placement on slower or shared CPUs scales)

The first five fields are a :class:`BatchCost`, what building the batch cost (the
loaders measure it); a reader takes the fields by name, in any order (lines written
before the record was declared as a ``msgspec.Struct`` put ``v`` second), and ignores
fields it does not know.
Lines whose ``kind`` is not ``"batch"`` are ignored, so the same file can carry other
metrics. ``BatchRecord.to_json()`` writes exactly this line.

A store server run with ``--profile FILE`` appends one :class:`ServeRecord` when it
stops: ``{"kind": "serve", "v": 1, "part": 0, "cpu_s": 1.49, "reply_bytes": 160000000}``
(CPU seconds spent serving, bytes it sent). Their ratio over every server is the
profile's ``serve_cpu_s_per_byte``. A parameter server run with ``--profile FILE``
appends one :class:`PSRecord`:
``{"kind": "ps", "v": 1, "index": 0, "cpu_s": 0.44, "pushes": 100, "trainers": 2}``
(CPU seconds from ready to stop, gradients pushed to it, the job's trainers): each
server's ``cpu_s * trainers / pushes``, its CPU seconds for one step of every trainer
(receiving the gradients, the update, sending the parameters), is a sample of the
profile's ``ps_update_s``, which is 0 without them.

Profile file (JSON)
-------------------
``{"format": "graphrun-profile", "version": 1, "name": ..., "quantities": {q: [samples]}}``
for every quantity in :data:`QUANTITIES`. Bytes from partitions are split into the
trainer's own partition (``*_own``) and each other partition (``*_other``), so a profile
recorded with one partition count can drive a plan for another. Synthetic
``products`` and ``papers100m`` profiles ship with the package (:func:`builtin_profile`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import numpy as np

from graphrun.errors import SpecError
from graphrun.placement._io import read_json, write_file
from graphrun.wire import check_header, convert, to_builtins

FORMAT = "graphrun-profile"
VERSION = 1
RECORD_VERSION = 1


class Quantities(msgspec.Struct, omit_defaults=True):
    """A profile file's ``quantities``: samples of each, the optional ones None when not
    measured (see the module docstring)."""

    sample_s: list[float]
    fetch_s: list[float]
    compute_s: list[float]
    ps_update_s: list[float]
    structure_own: list[float]
    structure_other: list[float]
    feature_own: list[float]
    feature_other: list[float]
    batch_bytes: list[float]
    grad_bytes: list[float]
    # CPU seconds of the trainer's process and its intra-op threads: with them, a placement
    # scales a trainer's sampling and compute to the CPU share its machine gives it
    # (graphrun.placement.workload); profiles without them (the built-ins) are not scaled
    sample_cpu_s: list[float] | None = None
    compute_cpu_s: list[float] | None = None
    threads: list[float] | None = None
    # a store server's CPU seconds per byte it sends (measured on the stores): with it,
    # a placement charges serving to the store's machine
    serve_cpu_s_per_byte: list[float] | None = None

    def __post_init__(self) -> None:
        for q in self.__struct_fields__:
            v = getattr(self, q)
            if v is not None and (not v or min(v) < 0):
                raise ValueError(f"{q}: expected a non-empty list of numbers >= 0")


_FIELDS = msgspec.structs.fields(Quantities)
QUANTITIES = tuple(f.name for f in _FIELDS if f.required)
OPTIONAL = tuple(f.name for f in _FIELDS if not f.required)
CPU_QUANTITIES = OPTIONAL[:3]
SERVE = OPTIONAL[3]


class ProfileFile(msgspec.Struct, kw_only=True):
    """The profile file (see the module docstring)."""

    format: str = FORMAT
    version: int = VERSION
    name: str | None = None
    quantities: Quantities


BUILTIN = ("products", "papers100m")
_MAX_SAMPLES = 256
R = TypeVar("R", "BatchRecord", "ServeRecord", "PSRecord")


@dataclass(frozen=True)
class Empirical:
    """An empirical distribution: sorted samples, drawn from uniformly."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values or any(not np.isfinite(v) or v < 0 for v in self.values):
            raise SpecError("profile: a distribution needs finite samples >= 0")

    @classmethod
    def of(cls, samples: Iterable[float]) -> Empirical:
        """Sorted samples, thinned to at most 256 evenly spaced quantiles."""
        a = np.sort(np.asarray(list(samples), dtype=float))
        if a.size > _MAX_SAMPLES:
            a = np.quantile(a, np.linspace(0, 1, _MAX_SAMPLES))
        return cls(tuple(float(x) for x in a))

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.asarray(self.values)[rng.integers(0, len(self.values), size=n)]


@dataclass(frozen=True)
class Profile:
    name: str
    quantities: dict[str, Empirical]

    def __post_init__(self) -> None:
        missing = [q for q in QUANTITIES if q not in self.quantities]
        if missing:
            raise SpecError(f"profile {self.name}: quantities.{missing[0]}: missing")

    def __getitem__(self, q: str) -> Empirical:
        return self.quantities[q]

    @property
    def cpu_seconds(self) -> bool:
        """Whether the profile carries the CPU seconds a placement scales (``OPTIONAL``)."""
        return all(q in self.quantities for q in CPU_QUANTITIES)

    def to_dict(self) -> dict[str, Any]:
        qs = {q: list(e.values) for q, e in self.quantities.items()}
        return to_builtins(ProfileFile(name=self.name, quantities=Quantities(**qs)))


def profile_from_dict(data: Any, where: str) -> Profile:
    check_header(data, where, FORMAT, VERSION)
    f = convert(ProfileFile, data, where)
    qs = {q: Empirical.of(v) for q in (*QUANTITIES, *OPTIONAL) if (v := getattr(f.quantities, q))}
    return Profile(name=f.name or Path(where).stem, quantities=qs)


def load_profile(path: str | Path) -> Profile:
    return profile_from_dict(read_json(path), str(path))


def save_profile(profile: Profile, path: str | Path) -> Path:
    return write_file(path, json.dumps(profile.to_dict(), indent=1) + "\n")


def builtin_profile(name: str) -> Profile:
    """The synthetic ``products`` or ``papers100m`` profile shipped with the package."""
    if name not in BUILTIN:
        raise SpecError(f"profile: {name!r} is not a built-in profile ({', '.join(BUILTIN)})")
    text = resources.files("graphrun.placement").joinpath(f"profiles/{name}.json").read_text()
    return profile_from_dict(json.loads(text), f"builtin:{name}")


def resolve_profile(ref: str, base: Path | None = None) -> Profile:
    """A built-in profile name, or a path to a profile JSON (relative to ``base``)."""
    if ref in BUILTIN:
        return builtin_profile(ref)
    path = Path(ref)
    if base is not None and not path.is_absolute():
        path = base / path
    return load_profile(path)


class BatchCost(msgspec.Struct, kw_only=True, frozen=True):
    """What building one mini-batch cost: seconds sampling (feature pulls excepted) and
    pulling features, and bytes read from each partition — graph structure (sampling,
    edge and degree queries) and features, remote or from shared memory alike (placement
    decides which of them cross the network). The batch builder measures it
    (``graphrun.distributed.batches``), a trainer's :class:`Batch` carries it, and it is
    the first part of a :class:`BatchRecord`: declared here, once."""

    sample_s: float = 0.0
    fetch_s: float = 0.0
    structure_bytes: dict[int, int] = {}
    feature_bytes: dict[int, int] = {}
    cache_bytes: int = 0  # feature bytes the remote-feature cache served (not in the above)
    # features on disk read in this process (co-located partitions; graphrun.store.disk;
    # None, left out of the line: none read)
    disk_hit_bytes: int | None = None  # the bytes the server's shared cache served
    disk_bytes: int | None = None  # ... and those read from the files


class BatchRecord(BatchCost, kw_only=True, frozen=True, tag_field="kind", tag="batch"):
    """One line of the runtime metrics file (see the module docstring): a batch's
    :class:`BatchCost` and the trainer's step."""

    v: int = RECORD_VERSION
    rank: int
    partition: int
    iteration: int
    compute_s: float
    batch_bytes: int = 0
    grad_bytes: int = 0
    sample_cpu_s: float | None = None  # process CPU seconds while sampling and fetching
    compute_cpu_s: float | None = None  # process CPU seconds while computing
    threads: int | None = None  # the trainer's intra-op threads

    def to_json(self) -> str:
        """The record's line (the CPU fields left out when not measured)."""
        return _line(self)

    def counts(self) -> tuple[float, ...]:
        """Its times and byte counts (none may be negative)."""
        return (self.sample_s, self.fetch_s, self.compute_s, self.batch_bytes, self.grad_bytes,
                self.sample_cpu_s or 0.0, self.compute_cpu_s or 0.0, self.threads or 0)  # fmt: skip


class ServeRecord(msgspec.Struct, kw_only=True, frozen=True, tag_field="kind", tag="serve"):
    """What a store server spent serving (see the module docstring)."""

    v: int = RECORD_VERSION
    part: int
    cpu_s: float
    reply_bytes: int

    def to_json(self) -> str:
        return _line(self)

    def counts(self) -> tuple[float, ...]:
        return (self.cpu_s, self.reply_bytes)


class PSRecord(msgspec.Struct, kw_only=True, frozen=True, tag_field="kind", tag="ps"):
    """What a parameter server spent (see the module docstring)."""

    v: int = RECORD_VERSION
    index: int
    cpu_s: float
    pushes: int
    trainers: int

    def to_json(self) -> str:
        return _line(self)

    def counts(self) -> tuple[float, ...]:
        # trainers: at least 1 (it divides); a non-finite cpu_s counts as negative
        finite = self.cpu_s if np.isfinite(self.cpu_s) else -1.0
        return (finite, self.pushes, self.trainers - 1)

    @property
    def cpu_s_per_step(self) -> float | None:
        """CPU seconds for one step of every trainer (None: nothing was pushed)."""
        return self.cpu_s * self.trainers / self.pushes if self.pushes else None


# what a store server or a parameter server writes when it stops
ServerRecord = ServeRecord | PSRecord


def _line(record: msgspec.Struct) -> str:
    d = {k: v for k, v in to_builtins(record).items() if v is not None}
    return json.dumps(d, separators=(",", ":"))


def _record(kind: type[R], d: dict[str, Any], where: str) -> R:
    if d.get("v") != RECORD_VERSION:
        raise SpecError(f"{where}: v: {d.get('v')!r} is not {RECORD_VERSION}")
    rec = convert(kind, d, where)
    if min(rec.counts()) < 0:
        raise SpecError(f"{where}: a time or count is negative (a PS's trainers: at least 1)")
    return rec


def _lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSON-lines file with their line numbers."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not a UTF-8 text file (byte {exc.start}): not metrics") from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}:{i}: not valid JSON: {exc.msg}") from exc
        if isinstance(d, dict):
            out.append((i, d))
    return out


def read_metrics(paths: Iterable[str | Path]) -> tuple[list[BatchRecord], list[ServerRecord]]:
    """The batch records of the trainers' files and the records of the store servers'
    and the parameter servers' among ``paths``; at least one batch record is needed."""
    batches: list[BatchRecord] = []
    serves: list[ServerRecord] = []
    names = []
    for path in map(Path, paths):
        names.append(str(path))
        for i, d in _lines(path):
            if d.get("kind") == "batch":
                batches.append(_record(BatchRecord, d, f"{path}:{i}"))
            elif d.get("kind") == "serve":
                serves.append(_record(ServeRecord, d, f"{path}:{i}"))
            elif d.get("kind") == "ps":
                serves.append(_record(PSRecord, d, f"{path}:{i}"))
    if not batches:
        raise SpecError(f'{", ".join(names)}: no batch records (lines with "kind": "batch")')
    return batches, serves


def read_records(path: str | Path) -> list[BatchRecord]:
    """The batch records of a JSON-lines metrics file."""
    return read_metrics([path])[0]


def profile_from_records(
    records: list[BatchRecord], name: str, serves: Iterable[ServerRecord] = ()
) -> Profile:
    """Pool the records into empirical distributions (own vs other partitions split);
    the store servers' records give ``serve_cpu_s_per_byte``, the parameter servers'
    ``ps_update_s``."""
    s: dict[str, list[float]] = {q: [] for q in QUANTITIES}
    for r in records:
        s["sample_s"].append(r.sample_s)
        s["fetch_s"].append(r.fetch_s)
        s["compute_s"].append(r.compute_s)
        s["batch_bytes"].append(r.batch_bytes)
        s["grad_bytes"].append(r.grad_bytes)
        for kind, per_part in (("structure", r.structure_bytes), ("feature", r.feature_bytes)):
            s[f"{kind}_own"].append(per_part.get(r.partition, 0))
            s[f"{kind}_other"].extend(v for p, v in per_part.items() if p != r.partition)
    servers = list(serves)
    ps_steps = [p.cpu_s_per_step for p in servers if isinstance(p, PSRecord)]
    s["ps_update_s"] = [x for x in ps_steps if x is not None] or [0.0]  # 0: not measured
    if all(r.sample_cpu_s is not None and r.compute_cpu_s is not None and r.threads
           for r in records):  # fmt: skip
        s["sample_cpu_s"] = [r.sample_cpu_s or 0.0 for r in records]
        s["compute_cpu_s"] = [r.compute_cpu_s or 0.0 for r in records]
        s["threads"] = [float(r.threads or 1) for r in records]
    served = [r for r in servers if isinstance(r, ServeRecord)]
    sent = sum(r.reply_bytes for r in served)
    if sent > 0:
        s[SERVE] = [sum(r.cpu_s for r in served) / sent]
    for q in ("structure_other", "feature_other"):
        if not s[q]:
            s[q] = [0.0]
    return Profile(name=name, quantities={q: Empirical.of(v) for q, v in s.items()})
