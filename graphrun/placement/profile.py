"""Job profiles: per-iteration compute times and data volumes as empirical distributions.

Runtime metrics (what the training layer emits)
-----------------------------------------------
Each trainer appends one JSON object per mini-batch to a metrics file (JSON lines,
one object per line). The schema, version 1, is :class:`BatchRecord`::

    {"kind": "batch", "v": 1,
     "rank": 0,                 # trainer rank
     "partition": 0,            # the partition that trainer trains on (its "own")
     "iteration": 17,           # iteration number within the run
     "sample_s": 0.021,         # seconds to sample this batch (in the sampler)
     "fetch_s": 0.008,          # seconds the trainer spent pulling features
     "compute_s": 0.013,        # seconds of forward + backward + optimizer step
     "structure_bytes": {"0": 5200000, "1": 900000},  # graph structure bytes the sampler
                                                       # pulled from each partition
     "feature_bytes": {"0": 41000000, "1": 12000000}, # feature bytes the trainer pulled
                                                       # from each partition
     "batch_bytes": 7800000,    # bytes of the sampled batch sent sampler -> trainer
     "grad_bytes": 1600000,     # bytes of dense gradients per step (= parameter bytes)
     "cache_bytes": 9000000,    # feature bytes served by the remote-feature cache (not
                                # in feature_bytes: they crossed no network)
     "sample_cpu_s": 0.018,     # CPU seconds of the trainer's process while it sampled and
     "compute_cpu_s": 0.011,    # fetched, and while it computed, and its intra-op threads
     "threads": 1}              # (optional: what a placement on slower or shared CPUs scales)

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
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from graphrun.errors import SpecError
from graphrun.placement._io import read_json, write_file

FORMAT = "graphrun-profile"
VERSION = 1
RECORD_VERSION = 1
QUANTITIES = (
    "sample_s",
    "fetch_s",
    "compute_s",
    "ps_update_s",
    "structure_own",
    "structure_other",
    "feature_own",
    "feature_other",
    "batch_bytes",
    "grad_bytes",
)
# CPU seconds of the trainer's process and its intra-op threads: with them, a placement
# scales a trainer's sampling and compute to the CPU share its machine gives it
# (graphrun.placement.workload); profiles without them (the built-ins) are not scaled
CPU_QUANTITIES = ("sample_cpu_s", "compute_cpu_s", "threads")
# and a store server's CPU seconds per byte it sends (measured on the stores): with it,
# a placement charges serving to the store's machine
SERVE = "serve_cpu_s_per_byte"
OPTIONAL = (*CPU_QUANTITIES, SERVE)
BUILTIN = ("products", "papers100m")
_MAX_SAMPLES = 256


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
        names = [q for q in (*QUANTITIES, *OPTIONAL) if q in self.quantities]
        return {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "quantities": {q: list(self.quantities[q].values) for q in names},
        }


def profile_from_dict(data: Any, where: str) -> Profile:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SpecError(f"{where}: format: expected {FORMAT!r}")
    if data.get("version") != VERSION:
        raise SpecError(f"{where}: version: {data.get('version')!r} is not {VERSION}")
    qs = data.get("quantities")
    if not isinstance(qs, dict):
        raise SpecError(f"{where}: quantities: expected a mapping")
    out = {}
    for q in (*QUANTITIES, *OPTIONAL):
        v = qs.get(q)
        if v is None and q in OPTIONAL:
            continue
        if not isinstance(v, list) or not v or not all(isinstance(x, int | float) for x in v):
            raise SpecError(f"{where}: quantities.{q}: expected a non-empty list of numbers")
        if any(x < 0 for x in v):
            raise SpecError(f"{where}: quantities.{q}: negative sample")
        out[q] = Empirical.of(v)
    return Profile(name=str(data.get("name", Path(where).stem)), quantities=out)


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


@dataclass(frozen=True)
class BatchRecord:
    """One line of the runtime metrics file (see the module docstring)."""

    rank: int
    partition: int
    iteration: int
    sample_s: float
    fetch_s: float
    compute_s: float
    structure_bytes: dict[int, int] = field(default_factory=dict)
    feature_bytes: dict[int, int] = field(default_factory=dict)
    batch_bytes: int = 0
    grad_bytes: int = 0
    cache_bytes: int = 0  # feature bytes the trainer's remote-feature cache served
    sample_cpu_s: float | None = None  # process CPU seconds while sampling and fetching
    compute_cpu_s: float | None = None  # process CPU seconds while computing
    threads: int | None = None  # the trainer's intra-op threads

    def to_json(self) -> str:
        d: dict[str, Any] = {"kind": "batch", "v": RECORD_VERSION, **asdict(self)}
        d["structure_bytes"] = {str(k): v for k, v in self.structure_bytes.items()}
        d["feature_bytes"] = {str(k): v for k, v in self.feature_bytes.items()}
        for k in CPU_QUANTITIES:
            if d[k] is None:
                del d[k]
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> BatchRecord:
        if d.get("v") != RECORD_VERSION:
            raise SpecError(f"{where}: v: {d.get('v')!r} is not {RECORD_VERSION}")
        try:
            rec = cls(
                rank=int(d["rank"]),
                partition=int(d["partition"]),
                iteration=int(d["iteration"]),
                sample_s=float(d["sample_s"]),
                fetch_s=float(d["fetch_s"]),
                compute_s=float(d["compute_s"]),
                structure_bytes={int(k): int(v) for k, v in d.get("structure_bytes", {}).items()},
                feature_bytes={int(k): int(v) for k, v in d.get("feature_bytes", {}).items()},
                batch_bytes=int(d.get("batch_bytes", 0)),
                grad_bytes=int(d.get("grad_bytes", 0)),
                cache_bytes=int(d.get("cache_bytes", 0)),
                sample_cpu_s=_optional(d.get("sample_cpu_s")),
                compute_cpu_s=_optional(d.get("compute_cpu_s")),
                threads=None if d.get("threads") is None else int(d["threads"]),
            )
        except KeyError as exc:
            raise SpecError(f"{where}: {exc.args[0]}: missing") from exc
        except (TypeError, ValueError, AttributeError) as exc:
            raise SpecError(f"{where}: malformed batch record: {exc}") from exc
        numbers = (rec.sample_s, rec.fetch_s, rec.compute_s, rec.batch_bytes, rec.grad_bytes,
                   rec.sample_cpu_s or 0.0, rec.compute_cpu_s or 0.0, rec.threads or 0)  # fmt: skip
        if min(numbers) < 0:
            raise SpecError(f"{where}: a time or byte count is negative")
        return rec


@dataclass(frozen=True)
class ServeRecord:
    """What a store server spent serving (see the module docstring)."""

    part: int
    cpu_s: float
    reply_bytes: int

    def to_json(self) -> str:
        d = {"kind": "serve", "v": RECORD_VERSION, **asdict(self)}
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> ServeRecord:
        try:
            rec = cls(int(d["part"]), float(d["cpu_s"]), int(d["reply_bytes"]))
        except KeyError as exc:
            raise SpecError(f"{where}: {exc.args[0]}: missing") from exc
        except (TypeError, ValueError) as exc:
            raise SpecError(f"{where}: malformed serve record: {exc}") from exc
        if rec.cpu_s < 0 or rec.reply_bytes < 0:
            raise SpecError(f"{where}: a time or byte count is negative")
        return rec


@dataclass(frozen=True)
class PSRecord:
    """What a parameter server spent (see the module docstring)."""

    index: int
    cpu_s: float
    pushes: int
    trainers: int

    def to_json(self) -> str:
        d = {"kind": "ps", "v": RECORD_VERSION, **asdict(self)}
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> PSRecord:
        try:
            rec = cls(int(d["index"]), float(d["cpu_s"]), int(d["pushes"]), int(d["trainers"]))
        except KeyError as exc:
            raise SpecError(f"{where}: {exc.args[0]}: missing") from exc
        except (TypeError, ValueError) as exc:
            raise SpecError(f"{where}: malformed ps record: {exc}") from exc
        if rec.cpu_s < 0 or rec.pushes < 0 or rec.trainers < 1 or not np.isfinite(rec.cpu_s):
            raise SpecError(f"{where}: a time or count is negative (trainers: at least 1)")
        return rec

    @property
    def cpu_s_per_step(self) -> float | None:
        """CPU seconds for one step of every trainer (None: nothing was pushed)."""
        return self.cpu_s * self.trainers / self.pushes if self.pushes else None


# what a store server or a parameter server writes when it stops
ServerRecord = ServeRecord | PSRecord


def _optional(value: Any) -> float | None:
    return None if value is None else float(value)


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
                batches.append(BatchRecord.from_dict(d, f"{path}:{i}"))
            elif d.get("kind") == "serve":
                serves.append(ServeRecord.from_dict(d, f"{path}:{i}"))
            elif d.get("kind") == "ps":
                serves.append(PSRecord.from_dict(d, f"{path}:{i}"))
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
