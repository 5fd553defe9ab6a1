"""Writing a file or a directory so that readers see the old content or the new, never half
of it.

The one atomic write of the code base (:func:`write_atomic`: state files, plans, profiles,
keys, checkpoints) and the one staging directory (:func:`atomic_dir`: datasets, partition
directories).
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def write_atomic(
    path: str | Path,
    data: str | bytes | Callable[[BinaryIO], object],
    mode: int = 0o666,
    replace: bool = True,
) -> Path:
    """Write ``data`` (text, bytes, or a function writing to a binary file) to a fresh
    temporary sibling of ``path``, then move it to ``path``.

    The temporary file is new (``O_EXCL | O_NOFOLLOW``, a random name: a stale or planted
    file or symlink is never written through) and gets exactly ``mode`` when ``mode``
    gives nothing to group or others (secrets: 0600), whatever the umask. With
    ``replace=False`` an existing ``path`` is kept: FileExistsError. On any error the
    temporary file is removed and ``path`` is untouched.
    """
    final = Path(path)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode & 0o077 == 0:
                os.fchmod(f.fileno(), mode)
            if isinstance(data, str):
                f.write(data.encode())
            elif isinstance(data, bytes):
                f.write(data)
            else:
                data(f)
        if replace:
            os.replace(tmp, final)
        else:
            os.link(tmp, final)  # FileExistsError if it is there
    finally:
        tmp.unlink(missing_ok=True)
    return final


def dir_is_free(final: str | Path) -> bool:
    """Whether :func:`atomic_dir` may put a directory at ``final``: absent, or an empty
    directory."""
    final = Path(final)
    return not final.exists() or (final.is_dir() and not any(final.iterdir()))


def commit_dir(staging: Path, final: str | Path) -> None:
    """Rename a finished staging directory to ``final``, replacing an empty directory
    there. The last step of :func:`atomic_dir`, for a staging directory that outlives one
    process (the distributed partitioner's ranks share one)."""
    final = Path(final)
    if final.exists():
        final.rmdir()  # OSError unless empty
    os.replace(staging, final)


@contextmanager
def atomic_dir(final: str | Path, error: Callable[[str], Exception] = OSError) -> Iterator[Path]:
    """A directory written whole or not at all.

    Yields a fresh, empty staging directory beside ``final`` (``.NAME.tmp-<pid>-<random>``,
    parents made as needed) and renames it to ``final`` when the block ends; when the
    block raises, the staging directory is removed and ``final`` is left as it was.

    ``final`` must be absent or an empty directory (which it replaces): anything else, or
    a staging directory that cannot be made, raises ``error`` with one line naming
    ``final`` before the block runs (the caller's layer passes its own error type, e.g.
    ``DatasetError``). Errors of the block and of the rename pass through as they are.
    """
    final = Path(final)
    if not dir_is_free(final):
        raise error(f"{final}: already exists and is not empty")
    staging = final.parent / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        staging.mkdir(parents=True)
    except OSError as exc:
        raise error(f"{final}: cannot create ({exc.strerror or exc})") from None
    try:
        yield staging
        commit_dir(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
