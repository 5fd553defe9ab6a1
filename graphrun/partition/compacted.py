"""A partition's compacted directory: the live graph folded into its base (issue 42).

A live store's partition server folds the committed writes up to a version ``C`` into
its base (:mod:`graphrun.store.compact`) and writes the result beside the partition
directory's own ``part-K``, so that a restarted store, or a new one, loads the graph as
it was at ``C`` and replays only the write-ahead log above it. A replica writes its
own in a directory beside its log instead (``OUT`` below is then that directory) and
loads the newer of the two (:func:`newest`)::

    OUT/part-K.compacted.json       the pointer: {"format": "graphrun-compacted",
                                    "version": 1, "dir": "part-K.c<C>", "live_version": C}
    OUT/part-K.c<C>/                the partition at C, in part-K's layout:
        nodes.npy indptr.npy indices.npy eids.npy [etypes.npy]
                                    the CSC with the new in-edges of the base nodes and
                                    without the deleted edges (halo rows as in part-K)
        node/<t>/<n>.npy edge/<k>/<n>.npy   the base rows, updates applied
        growth/nodes.npy            int64 the new nodes owned here (graph ids >= N)
        growth/types.npy growth/orig.npy   int32 ntype index, int64 original id of each
        growth/edges.npy            int64 [4, m]: src, dst, eid, etype of the new edges
                                    into new nodes, by edge id
        growth/rows/<i>.ids.npy growth/rows/<i>.npy   the rows of new nodes and edges
                                    of one feature (``rows`` in the manifest names it)
        compact.json                the manifest: the version, and every file's size
                                    and CRC-32

The directory is written under a temporary name, every file and the directory
fsynced, renamed, and only then the pointer is replaced (:func:`graphrun.files.write_atomic`)
and the previous compacted directory removed: a crash leaves the old pointer and its
complete directory, or the new ones, never half of either. :func:`part_dir` checks every
file against the manifest before a partition is loaded from it; one
:class:`~graphrun.errors.PartitionFormatError` naming the file otherwise.
"""

from __future__ import annotations

import os
import secrets
import shutil
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec
import numpy as np

from graphrun.errors import PartitionFormatError
from graphrun.files import fsync_path, write_atomic

FORMAT = "graphrun-compacted"
VERSION = 1
MANIFEST = "compact.json"
_READ = 4 << 20


class Pointer(msgspec.Struct, frozen=True):
    format: str
    version: int
    dir: str
    live_version: int


class FileSum(msgspec.Struct, frozen=True):
    bytes: int
    crc32: int


class Manifest(msgspec.Struct, frozen=True):
    format: str
    version: int
    part: int
    live_version: int
    rows: dict[str, str]  # growth/rows/<i> -> the feature's TensorKey
    files: dict[str, FileSum]


def pointer_path(root: Path, part: int) -> Path:
    return Path(root) / f"part-{part}.compacted.json"


def _crc(path: Path) -> FileSum:
    crc, size = 0, 0
    with open(path, "rb") as f:
        while block := f.read(_READ):
            crc, size = zlib.crc32(block, crc), size + len(block)
    return FileSum(size, crc)


def read_pointer(root: Path, part: int) -> Pointer | None:
    path = pointer_path(root, part)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PartitionFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        p = msgspec.json.decode(data, type=Pointer)
    except msgspec.DecodeError as exc:
        raise PartitionFormatError(f"{path}: not a compacted partition's pointer ({exc})") from None
    if p.format != FORMAT or p.version != VERSION:
        raise PartitionFormatError(f"{path}: format {p.format!r} version {p.version}, "
                                   f"expected {FORMAT!r} version {VERSION}")  # fmt: skip
    if p.dir != f"part-{part}.c{p.live_version}":
        raise PartitionFormatError(f"{path}: field 'dir' {p.dir!r} is not part-{part}.c<version>")
    return p


def read(root: Path, part: int) -> tuple[Path, Manifest] | None:
    """The compacted directory of partition ``part`` and its manifest, every file checked
    against it; None when the partition was never compacted."""
    p = read_pointer(root, part)
    if p is None:
        return None
    d = Path(root) / p.dir
    try:
        m = msgspec.json.decode((d / MANIFEST).read_bytes(), type=Manifest)
    except (OSError, msgspec.DecodeError) as exc:
        raise PartitionFormatError(f"{d / MANIFEST}: not a readable manifest ({exc})") from None
    if (m.format, m.version, m.part, m.live_version) != (FORMAT, VERSION, part, p.live_version):
        raise PartitionFormatError(f"{d / MANIFEST}: does not match {pointer_path(root, part)}")
    for rel, want in m.files.items():
        f = d / rel
        if ".." in Path(rel).parts or not f.is_file():
            raise PartitionFormatError(f"{f}: missing (listed in {d / MANIFEST})")
        if _crc(f) != want:
            raise PartitionFormatError(f"{f}: its size or CRC-32 does not match {d / MANIFEST}")
    return d, m


def newest(roots: Sequence[Path], part: int) -> Path:
    """Of ``roots`` (the partition directory, then a replica's own: its log's
    ``base_name``), the one holding the newest compacted directory of ``part``; the
    first when none holds one."""
    best, top = Path(roots[0]), -1
    for root in roots:
        p = read_pointer(Path(root), part)
        if p is not None and p.live_version > top:
            best, top = Path(root), p.live_version
    return best


def part_dir(root: Path, part: int, default: str) -> Path:
    """The directory partition ``part`` loads from: its compacted one, or ``default``."""
    got = read(root, part)
    return got[0] if got is not None else Path(root) / default


def current_dir(root: Path, part: int, default: str) -> Path:
    """:func:`part_dir` without checking the files (they were, when it was loaded)."""
    p = read_pointer(root, part)
    return Path(root) / (p.dir if p is not None else default)


def _place(src: Path, dst: Path) -> None:
    """``dst`` is ``src``'s content: a hard link (the file is never written in place),
    a copy across file systems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def write(
    root: Path,
    part: int,
    live_version: int,
    arrays: Mapping[str, np.ndarray],
    files: Mapping[str, Path],
    rows: Mapping[str, str],
) -> Path:
    """Write partition ``part`` at ``live_version``: ``arrays`` saved and ``files`` linked
    under their relative paths, then the pointer replaced (see the module docstring)."""
    root = Path(root)
    name = f"part-{part}.c{live_version}"
    stage = root / f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    stage.mkdir()
    try:
        sums = {}
        for rel, src in files.items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            _place(src, stage / rel)
            sums[rel] = _crc(stage / rel)
        for rel, arr in arrays.items():
            f = stage / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            with open(f, "wb") as out:
                np.save(out, np.ascontiguousarray(arr))
                out.flush()
                os.fsync(out.fileno())
            sums[rel] = _crc(f)
        man = Manifest(FORMAT, VERSION, part, live_version, dict(rows), sums)
        (stage / MANIFEST).write_bytes(msgspec.json.encode(man))
        for d in sorted({(stage / rel).parent for rel in sums} | {stage}, reverse=True):
            fsync_path(d)
        fsync_path(stage / MANIFEST)
        final = root / name
        if final.exists():  # a crash renamed it before its pointer was written: unused
            shutil.rmtree(final)
        os.replace(stage, final)
        fsync_path(root)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    old = read_pointer(root, part)
    pointer = Pointer(FORMAT, VERSION, name, live_version)
    write_atomic(pointer_path(root, part), msgspec.json.encode(pointer))
    fsync_path(root)
    if old is not None and old.dir != name:
        shutil.rmtree(root / old.dir, ignore_errors=True)
    for stale in root.glob(f".part-{part}.c*.tmp-*"):  # a crashed writer's
        shutil.rmtree(stale, ignore_errors=True)
    return final
