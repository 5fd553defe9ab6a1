"""Reading a run directory the report may not have written: regular files only, inside
the directory only, each bounded.

``graphrun report`` may be pointed at a directory someone else wrote or changed, so its
files are input like any other. :func:`read_file` resolves the path and refuses one
that leads out of the run directory (a symlink to ``/etc/passwd`` is not rendered into
the page), looks at what it is before opening it and again after (``O_NONBLOCK``: a
FIFO never blocks; ``O_NOFOLLOW`` on the resolved path), refuses anything but a regular
file (a FIFO, ``/dev/zero``, a directory) and reads at most the file's cap. Each refusal
is a :class:`RunFileError`, one line naming the file and what is wrong, which the report
shows as a note (or, for ``state.json``, prints as its error). :func:`decode_json`
turns a line nested 100k deep (Python's decoder recurses) into one too.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from graphrun.errors import RunFileError

MIB = 1 << 20
JSON_CAP = 4 * MIB  # state.json, launch/*.json, status/*.json, the job and schedule files
METRICS_CAP = 64 * MIB  # metrics.jsonl: 1,000 epochs of 256 trainers take 50 MiB
MAX_RECORDS = 10_000  # lines of metrics.jsonl read
MAX_FILES = 256  # files read of launch/ and of status/ (machines)
MAX_TRAINER_ROWS = 100_000  # trainers' parts of epochs in all (1,500 epochs of 64)


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
    )  # fmt: skip
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def _regular(path: Path, st: os.stat_result, cap: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise RunFileError(f"{path}: is {_kind(st.st_mode)}, not a regular file (not read)")
    if st.st_size > cap:
        raise RunFileError(f"{path}: is over its cap of {cap // MIB} MiB (not read)")


def read_file(path: Path, cap: int, inside: Path | None = None) -> bytes | None:
    """The bytes of the regular file ``path`` (None when there is none), at most ``cap``
    of them; with ``inside``, only when its resolved path is in that directory. RunFileError
    naming ``path`` when it is anything else."""
    try:
        real = path.resolve()
        if inside is not None and not real.is_relative_to(inside.resolve()):
            raise RunFileError(f"{path}: leads outside the run directory, to {real} (not read)")
        _regular(path, os.stat(real, follow_symlinks=False), cap)
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL in the name
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RunFileError(f"{path}: cannot be read ({why})") from None
    try:
        _regular(path, os.fstat(fd), cap)  # what was opened, if it changed since
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(cap + 1 - size, MIB))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise RunFileError(f"{path}: cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if size > cap:  # it grew as it was read
        raise RunFileError(f"{path}: is over its cap of {cap // MIB} MiB (not read)")
    return b"".join(chunks)


def decode_json(data: bytes | str, where: str) -> Any:
    """``data`` decoded (NaN too, as ``json.dumps`` writes a diverged loss); RunFileError
    naming ``where`` when it is not JSON or is nested too deep to decode."""
    try:
        return json.loads(data)
    except RecursionError:
        raise RunFileError(f"{where}: nested too deep (not read)") from None
    except ValueError:
        raise RunFileError(f"{where}: not JSON") from None
