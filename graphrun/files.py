"""Writing a file or a directory so that readers see the old content or the new, never half
of it.

The one atomic write of the code base (:func:`write_atomic`: state files, plans, profiles,
keys, checkpoints) and the one staging directory (:func:`atomic_dir`: datasets, partition
directories). Beside them the two file edges every layer shares: :func:`read_json` (a JSON
object, or one line naming the file) and :func:`write_failed` (a failed write as one line,
"no space left" when the disk is full).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from graphrun.errors import HostError, UserError


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


def fsync_path(path: str | Path) -> None:
    """Flush a file or a directory to the disk: a directory's fsync makes the renames and
    new names in it durable, which a file's own fsync does not."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if Path(path).is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def read_json(path: str | Path, what: str, error: type[UserError]) -> dict[str, Any]:
    """Read a JSON object, turning every failure into one clear line (an ``error``);
    ``what`` names the file's role ("partition config")."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: missing ({what})")
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:  # json.loads of 100k nested brackets
        raise error(f"{path}: nested too deeply to be {what}") from None
    if not isinstance(meta, dict):
        raise error(f"{path}: expected a JSON object")
    return meta


def write_failed(path: Path, exc: OSError) -> HostError:
    """One line for a failed write: the path, and "no space left" when the disk is full
    (numpy reports a short write as a bare "N requested and M written")."""
    try:
        free = shutil.disk_usage(Path(path).parent).free
    except OSError:
        free = -1
    full = exc.errno == errno.ENOSPC or 0 <= free < 1 << 20
    reason = "no space left on device" if full else (exc.strerror or str(exc))
    return HostError(f"{path}: cannot write: {reason}" + (f" ({free} bytes free)" if full else ""))
