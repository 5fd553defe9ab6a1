"""Which dataset a job's partition directory was made from.

After ``graphrun run`` partitions a dataset it writes ``OUT/source.json`` beside the
partition's ``partition.json``::

    {"format": "graphrun-partition-source", "version": 1,
     "dataset": "/abs/path/data", "fingerprint": "<sha256>", "files": 12,
     "partition": ["--parts", "2", "--mode", "local", ...]}

``fingerprint`` hashes the relative path, size and modification time (ns) of every
file of the dataset directory — cheap on a dataset of any size, and changed by any
rewrite of it (a re-import, a regenerated graph). A later run compares it with the
dataset as it is now and with the job's partition settings; partitions made from
something else are stale, and the job makes them again. Partitions without the file
(made by hand with ``graphrun partition``) are used as they are.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import msgspec

from graphrun.errors import SpecError
from graphrun.wire import convert, write_json

SOURCE_FILE = "source.json"
FORMAT = "graphrun-partition-source"
VERSION = 1


class Source(msgspec.Struct, frozen=True, kw_only=True):
    """``source.json`` (see the module docstring)."""

    format: str = FORMAT
    version: int = VERSION
    dataset: str
    fingerprint: str
    files: int
    partition: tuple[str, ...]


def fingerprint(dataset: Path) -> tuple[str, int]:
    """``(sha256 of every file's relative path, size and mtime, number of files)``."""
    h = hashlib.sha256()
    n = 0
    root = Path(dataset)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            try:
                st = path.stat()
            except OSError:
                continue
            rel = path.relative_to(root).as_posix()
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            n += 1
    return h.hexdigest(), n


def current(dataset: Path, partition: list[str]) -> Source:
    digest, n = fingerprint(dataset)
    where = str(Path(dataset).resolve())
    return Source(dataset=where, fingerprint=digest, files=n, partition=tuple(partition))


def write_source(parts: Path, source: Source) -> None:
    write_json(Path(parts) / SOURCE_FILE, source)


def read_source(parts: Path) -> Source | None:
    """The recorded source of a partition directory; None without (or with an unreadable)
    ``source.json``."""
    try:
        data = json.loads((Path(parts) / SOURCE_FILE).read_text())
        source = convert(Source, data, SOURCE_FILE)
    except (OSError, ValueError, SpecError):
        return None
    return source if (source.format, source.version) == (FORMAT, VERSION) else None


def stale_reason(parts: Path, now: Source) -> str | None:
    """Why the partitions in ``parts`` were not made from ``now`` (None: they were, or
    they do not say)."""
    was = read_source(parts)
    if was is None:
        return None
    if was.dataset != now.dataset:
        return f"they were made from {was.dataset}"
    if was.fingerprint != now.fingerprint:
        return f"{now.dataset} changed since they were made"
    if was.partition != now.partition:
        return "the job's partition settings changed"
    return None
