"""Writing a file so that readers see the old content or the new, never half of it.

The one atomic write of the code base: state files, plans, profiles, keys, checkpoints.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
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
